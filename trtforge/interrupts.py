"""Ctrl-C that native code cannot swallow.

TensorRT calls Python back from C++ (its logger, the build's progress monitor) and catches whatever those
callbacks raise: a KeyboardInterrupt raised inside one is printed as "Exception caught in log()" and lost,
and the build runs on and writes its engine. CI caught exactly that, with the interrupt landing in a log
callback during parsing. While `deferred()` is active, SIGINT only sets a flag; the KeyboardInterrupt is
raised in trtforge's own Python code (`check()` between native calls, or when the block ends), where
nothing can swallow it. Callbacks read `requested()` to stop native work early (the progress monitor
cancels the build).

Hand-written: the standard library has no "defer SIGINT" helper, and the signal module only lets the
main thread install handlers, so elsewhere `deferred()` leaves the current handler alone."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

_pending = threading.Event()
_depth = 0


def requested() -> bool:
    """Ctrl-C arrived while a deferred block ran and has not been raised yet."""
    return _pending.is_set()


def check() -> None:
    """Raise the deferred KeyboardInterrupt now (between two native calls)."""
    if _pending.is_set():
        _pending.clear()
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT sets a flag instead of raising while the block runs; the interrupt is raised when it ends.

    Nests (only the outermost block installs and restores the handler). A process that ignores SIGINT (a
    shell's background job) keeps ignoring it; outside the main thread nothing changes."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = None
    if _depth == 0:
        current = signal.getsignal(signal.SIGINT)
        if current is signal.SIG_IGN or current is None:  # ignored, or set by native code: leave it be
            yield
            return
        _pending.clear()
        previous = signal.signal(signal.SIGINT, lambda _signum, _frame: _pending.set())
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    check()
