"""Ctrl-C inside native callbacks (trtforge.interrupts): TensorRT catches what its Python callbacks raise."""

import os
import signal
import threading

import pytest

from trtforge.core import interrupts


@pytest.fixture(autouse=True)
def terminal_sigint():
    """Each test starts with the SIGINT disposition a terminal gives Python (default_int_handler), whatever this
    process inherited: a shell's background job (`nohup make test &`) starts with SIGINT ignored, and Python then
    installs no handler. The inherited disposition is put back afterwards."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


def _native_call(callback):
    """Stands in for TensorRT calling a Python logger from C++: every exception the callback raises is caught."""
    try:
        callback()
    except BaseException:  # noqa: BLE001 - what TensorRT does ("Exception caught in log()")
        pass
    return "built"


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs at the next bytecode boundary
        pass


def test_without_deferral_a_ctrl_c_in_a_callback_is_lost():
    assert _native_call(_ctrl_c) == "built"  # the failure the module exists for


def test_deferred_raises_the_ctrl_c_a_callback_would_lose():
    results = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            results.append(_native_call(_ctrl_c))
            assert interrupts.requested()
    assert results == ["built"] and not interrupts.requested()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_check_raises_between_native_calls_and_nesting_restores_once():
    with interrupts.deferred():
        handler = signal.getsignal(signal.SIGINT)
        with interrupts.deferred():
            _native_call(lambda: None)
        assert signal.getsignal(signal.SIGINT) is handler is not signal.default_int_handler  # the inner block kept it
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            with interrupts.deferred():
                _native_call(_ctrl_c)
            pytest.fail("the inner block should have raised")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts.deferred():
        _native_call(lambda: None)
        interrupts.check()  # nothing pending: no interrupt


def test_an_ignored_sigint_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.deferred():
            _native_call(_ctrl_c)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and not interrupts.requested()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_nothing_changes():
    seen = []

    def worker():
        with interrupts.deferred():
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]


def test_the_interrupt_message_lists_what_was_already_written(tmp_path):
    from pathlib import Path

    from trtforge.cli.app import interrupted_message
    from trtforge.core.artifacts import published, write_text_atomic

    assert interrupted_message([]) == "interrupted: nothing was written under the final output names."
    before = len(published())
    write_text_atomic(tmp_path / "a.json", "{}")
    write_text_atomic(tmp_path / "a.json", "{}")
    assert published()[before:] == [tmp_path / "a.json"]
    message = interrupted_message([tmp_path / "m.engine", tmp_path / "m.engine.json"])
    assert "m.engine, " in message and "m.engine.json had already been written (complete)" in message
    assert "and 2 more" in interrupted_message([Path(f"f{i}") for i in range(10)])


def test_main_in_process_leaves_the_ctrl_c_handler_alone(monkeypatch):
    """Only the executable ignores a late Ctrl-C (cli.entry): tests and embedders that call main() keep theirs."""
    import sys

    from trtforge.cli import app as cli

    monkeypatch.setattr(sys, "argv", ["trtforge", "--help"])
    before = signal.getsignal(signal.SIGINT)
    try:
        cli.main()
    except SystemExit as exc:
        assert exc.code in (0, None)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_block_ending_with_an_error_after_ctrl_c_raises_the_interrupt():
    """Ctrl-C while the parser reads a graph it then rejects: the build's fallback catches the parser's error, so
    the interrupt must come out instead of it, or the fallback would build (and publish) another engine."""
    from trtforge.core.errors import UserError

    with pytest.raises(KeyboardInterrupt) as caught:
        with interrupts.deferred():
            _native_call(_ctrl_c)
            raise UserError("the ONNX parser rejected m.onnx")
    assert isinstance(caught.value.__cause__, UserError) and not interrupts.requested()
    with pytest.raises(UserError):  # without Ctrl-C the error is the error
        with interrupts.deferred():
            raise UserError("the ONNX parser rejected m.onnx")


def test_a_second_ctrl_c_aborts_at_once(tmp_path):
    """TensorRT 8.6 has no progress monitor: the first Ctrl-C waits for the builder; the second exits 130 now."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    code = (
        "from trtforge.core import interrupts\nimport time\nwith interrupts.deferred():\n    print('ready', flush=True)\n"
        "    time.sleep(60)  # native work that never returns early\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline().strip() == "ready"
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None  # the first one only asks
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - start < 20, err
    assert interrupts.FIRST in err and interrupts.SECOND in err


def test_children_started_while_spawning_ignore_ctrl_c_and_the_parent_gets_its_handler_back():
    """--tokenize-processes spawns its workers inside ignored_while_spawning: an ignored SIGINT survives exec, so a
    Ctrl-C during their import is the parent's alone (no traceback per worker)."""
    import signal
    import subprocess
    import sys

    from trtforge.core.interrupts import ignored_while_spawning

    before = signal.getsignal(signal.SIGINT)
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"]
    with ignored_while_spawning():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        inside = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    assert signal.getsignal(signal.SIGINT) is before
    outside = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    assert (inside, outside) == ("True", "False")


@pytest.mark.skipif(os.environ.get("TRTFORGE_INNER_INTERRUPT_RUN") == "1", reason="the inner run itself")
def test_this_module_passes_when_started_with_sigint_ignored():
    """`nohup make test &` starts pytest with SIGINT ignored: every test above must pass there as in a terminal."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "TRTFORGE_INNER_INTERRUPT_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
