"""Console output: rich tables on a terminal; plain, line-oriented text under CI or a pipe."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from rich import box
from rich.console import Console
from rich.table import Table


def plain_mode() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or not sys.stdout.isatty()


def console(stderr: bool = False) -> Console:
    plain = plain_mode() if not stderr else (os.environ.get("CI", "").lower() in ("1", "true", "yes") or not sys.stderr.isatty())
    return Console(
        stderr=stderr,
        color_system=None if plain else "auto",
        force_terminal=False if plain else None,
        highlight=False,
        soft_wrap=plain,
        width=200 if plain else None,
    )


_json_held: list[Any] | None = None


def print_json(payload: Any) -> None:
    """The command's JSON result on stdout; held back while `held_json()` is active (see there)."""
    if _json_held is not None:
        _json_held.append(payload)
        return
    _write_json(payload)


def _write_json(payload: Any) -> None:
    from trtforge.core.artifacts import json_default

    sys.stdout.write(json.dumps(payload, indent=2, default=json_default) + "\n")
    sys.stdout.flush()


@contextmanager
def held_json() -> Iterator[list[Any]]:
    """Hold the command's JSON results until it has ended, so that stdout carries exactly one JSON object even when
    the command fails after printing its result (a failed gate): `flush_json` then adds the error to it."""
    global _json_held
    previous, _json_held = _json_held, []
    try:
        yield _json_held
    finally:
        _json_held = previous


def flush_json(held: list[Any], error: dict[str, Any] | None = None) -> None:
    """Print the held results; an error goes into the last result object (or is the only object printed)."""
    if error is not None:
        if held and isinstance(held[-1], dict):
            held[-1] = {**held[-1], "error": error}
        else:
            held.append({"error": error})
    for payload in held:
        _write_json(payload)
    held.clear()


@contextmanager
def native_output_captured() -> Iterator[list[str]]:
    """Capture what native code (torch's C++ exporter, TensorRT) writes straight to file descriptors 1 and 2, which
    Python's redirect_stdout cannot catch: the yielded list receives the text when the block ends, for a log file,
    while stdout stays clean for --json."""
    import tempfile

    captured: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # no real descriptors (an embedding host): nothing to capture
        yield captured
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield captured
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", "replace"))


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    out = Table(title=title, title_justify="left", box=None if plain_mode() else box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(columns):
        out.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        out.add_row(*[fmt(v) for v in row])
    return out


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) < 1e-3 or abs(value) >= 1e6:
            return f"{value:.2e}"
        return f"{value:.4g}"
    return str(value)


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Any]:
    """A rich progress bar on a TTY; under CI a handful of plain lines instead of an animation."""
    if plain_mode():
        yield _PlainProgress(description, total)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield _RichProgress(bar, task)


class _RichProgress:
    def __init__(self, bar: Any, task: Any):
        self.bar, self.task = bar, task

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)


class _PlainProgress:
    def __init__(self, description: str, total: int | None):
        self.description, self.total, self.done, self.next_report = description, total, 0, 0.25

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.total and self.done / self.total >= self.next_report:
            print(f"{self.description}: {self.done}/{self.total}", file=sys.stderr, flush=True)
            self.next_report += 0.25


HEARTBEAT_ENV = "TRTFORGE_HEARTBEAT_S"
PLAIN_HEARTBEAT_S = 15.0  # under CI a line at least every 30 s, with margin


def heartbeat_interval() -> float:
    """Seconds between build progress updates: $TRTFORGE_HEARTBEAT_S, else 15 under CI, 0.5 on a terminal."""
    value = os.environ.get(HEARTBEAT_ENV, "").strip()
    try:
        if value and float(value) > 0:
            return min(float(value), 30.0)
    except ValueError:
        pass
    return PLAIN_HEARTBEAT_S if plain_mode() else 0.5


@contextmanager
def build_progress(label: str) -> Iterator[Any]:
    """A tick(elapsed_s, progress) callback for a TensorRT build: a rich spinner line on a terminal, a plain
    stderr line per tick under CI. `progress.describe()` says what the builder reports ("profile 2 of 4, ...")."""
    if plain_mode():

        def plain_tick(elapsed: float, progress: Any) -> None:
            print(f"{label}: {elapsed:.0f} s elapsed, {progress.describe()}", file=sys.stderr, flush=True)

        yield plain_tick
        return
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), "[progress.description]{task.description}", TimeElapsedColumn(), console=console(stderr=True), transient=True
    ) as bar:
        task = bar.add_task(label, total=None)

        def rich_tick(_elapsed: float, progress: Any) -> None:
            bar.update(task, description=f"{label}: {progress.describe()}")

        yield rich_tick


def warn(message: str) -> None:
    """One warning line on stderr (stdout stays clean for --json)."""
    console(stderr=True).print(f"warning: {message}", markup=False)
