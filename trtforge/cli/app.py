"""The `trtforge` command line: parse, call the API, render. No pipeline logic lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from trtforge import __version__
from trtforge.cli import bisect, build, calibrate, clean, compare, doctor, export, inspect, pipeline, run
from trtforge.cli.plugins import plugins_app
from trtforge.core import ui
from trtforge.core.artifacts import published
from trtforge.core.errors import INTERNAL_ERROR, INTERRUPTED, TrtforgeError, exception_summary
from trtforge.core.errors import GateFailed as GateFailedError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="PyTorch to a validated TensorRT engine: export, clean, calibrate, build, run.",
)
app.add_typer(plugins_app, name="plugins")


# Commands in the order `trtforge --help` lists them.
app.command()(export.export)
app.command()(clean.clean)
app.command()(calibrate.calibrate)
app.command()(build.build)
app.command()(inspect.inspect)
app.command()(bisect.bisect)
app.command(name="run")(run.run_cmd)
app.command()(compare.compare)
app.command()(pipeline.pipeline)
app.command()(doctor.doctor)


def main() -> None:
    """Entry point. A user error is one line on stderr and exit 2 (a failed gate 1), an unexpected exception one line
    naming the step and the exception, its traceback in a log file, exit 3 (trtforge.errors); with --json, stdout
    carries one JSON object either way, the error under "error"."""
    argv = sys.argv[1:]
    step = next((a for a in argv if not a.startswith("-")), "trtforge")
    json_mode = "--json" in argv
    with ui.held_json() as held:
        code, error = _run_app(step)
        try:
            ui.flush_json(held, error if json_mode else None)
        except Exception as exc:  # noqa: BLE001 - a result that cannot be written as JSON is a bug, reported as one
            code, error = _internal_error(step, exc)
            if json_mode:
                ui.flush_json([], error)
    if code:
        sys.exit(code)


def _run_app(step: str) -> tuple[int, Optional[dict]]:
    """Run the command: (exit code, the JSON error object or None). Every message has been printed on stderr."""
    err = ui.console(stderr=True)
    try:
        code = app(standalone_mode=False)
        if code == 130:  # typer turns Ctrl-C into a returned 130 outside standalone mode
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            return code, _json_error("error", f"exit code {code}", code)
        return 0, None
    except TrtforgeError as exc:
        message = str(exc)
        log = _write_log(step, exc.detail) if exc.detail else None
        if log:
            message = message.rstrip(".") + f"; details in {log}."
        err.print(f"error: {message}", markup=False)
        kind = "gate_failed" if isinstance(exc, GateFailedError) else "user_error"
        return exc.exit_code, _json_error(kind, message, exc.exit_code, log)
    except KeyboardInterrupt:
        message = interrupted_message(published())
        err.print(message, markup=False)
        return INTERRUPTED, _json_error("interrupted", message, INTERRUPTED)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return code, _json_error("error", f"exit code {code}", code) if code else None
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected exception becomes a message
        usage_errors, aborts = _click_error_types()
        if isinstance(exc, usage_errors):
            message = _usage_sentence(exc)
            err.print(f"error: {message}", markup=False)
            return 2, _json_error("usage_error", message, 2)
        if isinstance(exc, aborts):
            return INTERRUPTED, _json_error("interrupted", "aborted", INTERRUPTED)
        return _internal_error(step, exc)


def _internal_error(step: str, exc: BaseException) -> tuple[int, dict]:
    """An unexpected exception: one line naming the step and the exception, the traceback in a log file, exit 3."""
    import traceback

    log = _write_log(step, "".join(traceback.format_exception(exc)))
    where = f"the full traceback is in {log}" if log else "no log file could be written"
    message = f"internal error in '{step}': {exception_summary(exc, 300)}; {where}; please report it."
    ui.console(stderr=True).print(f"error: {message}", markup=False)
    return INTERNAL_ERROR, _json_error("internal_error", message, INTERNAL_ERROR, log)


def _usage_sentence(exc: Exception) -> str:
    """A command-line usage error (click's) as one sentence that points at the command's help."""
    text = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    if ". Did you mean " in text:
        head, _, hint = text.partition(". Did you mean ")
        text = f"{head} (did you mean {hint})"
    param = getattr(exc, "param", None)
    argv = sys.argv[1:]
    for opt in getattr(param, "opts", ()) if type(exc).__name__ == "BadParameter" else ():
        given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == opt] + [a.split("=", 1)[1] for a in argv if a.startswith(opt + "=")]
        if given:
            text += f", got '{given[-1]}'"
            break
    ctx = getattr(exc, "ctx", None)
    command = ctx.command.name if ctx is not None and ctx.parent is not None else None
    where = f"trtforge {command} --help" if command else "trtforge --help"
    return f"{text}; see '{where}'."


def _json_error(kind: str, message: str, exit_code: int, log: Optional[Path] = None) -> dict:
    return {"kind": kind, "message": message, "exit_code": exit_code, "log": str(log) if log else None}


def log_dirs() -> list[Path]:
    """Where log files go, first writable wins: $TRTFORGE_LOG_DIR, the per-user cache ($XDG_CACHE_HOME or
    ~/.cache)/trtforge/logs, the temp dir."""
    import os
    import tempfile

    dirs = [Path(os.environ["TRTFORGE_LOG_DIR"])] if os.environ.get("TRTFORGE_LOG_DIR") else []
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return dirs + [Path(cache) / "trtforge" / "logs", Path(tempfile.gettempdir())]


def _write_log(step: str, text: str) -> Optional[Path]:
    """Write `text` to a new log file named after the step and the time, atomically (a temp file renamed); its path,
    or None when no folder takes it."""
    import os
    import tempfile
    import time

    header = f"trtforge {__version__} {step}: {' '.join(sys.argv)}\n\n"
    name = f"trtforge-{''.join(c if c.isalnum() or c in '-_' else '_' for c in step)}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for folder in log_dirs():
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
                fh.write(header + text)
            os.replace(tmp, folder / name)
            return folder / name
        except OSError:
            if tmp:
                Path(tmp).unlink(missing_ok=True)
    return None


def _click_error_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage-error types, abort types) of click and of the copy of click that typer 0.2x carries inside itself
    (typer._click): an unknown option or a missing argument raised by either is one message and exit 2, not a
    traceback (with typer 0.29 only click's own were caught, and every usage error ended in a traceback, exit 1)."""
    import typer

    errors = {c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"}
    aborts = {typer.Abort}
    try:
        import click

        errors.add(click.exceptions.ClickException)
        aborts.add(click.exceptions.Abort)
    except ImportError:  # typer 0.2x no longer needs click itself
        pass
    return tuple(errors), tuple(aborts)


def entry() -> None:
    """The `trtforge` executable: main(), then a Ctrl-C during interpreter teardown is ignored (not in main()
    itself, which tests call in-process)."""
    try:
        main()
    finally:
        _ignore_late_ctrl_c()


def interrupted_message(written: list[Path]) -> str:
    """What Ctrl-C left behind: every file is written whole or not at all, so either nothing or a list of complete files."""
    if not written:
        return "interrupted: nothing was written under the final output names."
    names = ", ".join(str(p) for p in written[:8]) + (f" and {len(written) - 8} more" if len(written) > 8 else "")
    return f"interrupted: {names} had already been written (complete); nothing else was written under final output names."


def _ignore_late_ctrl_c() -> None:
    """The command has finished and said so: a Ctrl-C during interpreter teardown would otherwise kill the
    process by signal and hide the exit code it already decided."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    entry()
