"""Ctrl-C that native code cannot swallow.

TensorRT calls Python back from C++ (its logger, the build's progress monitor) and catches whatever those
callbacks raise: a KeyboardInterrupt raised inside one is printed as "Exception caught in log()" and lost,
and the build runs on and writes its engine. CI caught exactly that, with the interrupt landing in a log
callback during parsing. While `deferred()` is active, SIGINT only sets a flag (and says so on stderr); the
KeyboardInterrupt is raised in trtforge's own Python code (`check()` between native calls, or when the block
ends, also when it ends with an error), where nothing can swallow it. Callbacks read `requested()` to stop native
work early (the progress monitor cancels the build). A second Ctrl-C while one is pending exits at once (130):
TensorRT 8.6 has no progress monitor, so the first one waits for the builder to return.

Hand-written: the standard library has no "defer SIGINT" helper, and the signal module only lets the
main thread install handlers, so elsewhere `deferred()` leaves the current handler alone. The flag is a plain
bool (a threading.Event's lock could deadlock a handler that interrupts its own clear()).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

_pending = False
_depth = 0
FIRST = "Ctrl-C: stopping once TensorRT returns (press Ctrl-C again to abort now)"
SECOND = "Ctrl-C again: aborting now; files already written are complete, temporary files (.NAME.*) may remain beside the outputs"


def requested() -> bool:
    """Ctrl-C arrived while a deferred block ran and has not been raised yet."""
    return _pending


def check() -> None:
    """Raise the deferred KeyboardInterrupt now (between two native calls)."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt


def _on_sigint(_signum: int, _frame: object) -> None:
    global _pending
    if _pending:
        os.write(2, (SECOND + "\n").encode())
        os._exit(130)
    _pending = True
    try:
        sys.stderr.write(FIRST + "\n")
        sys.stderr.flush()
    except Exception:  # a closed or broken stderr must not lose the flag
        pass


@contextlib.contextmanager
def ignored_while_spawning() -> Iterator[None]:
    """SIGINT ignored while the block starts child processes: an ignored signal stays ignored across exec, so they
    start that way (their own handler comes only after they import) and Ctrl-C stays the parent's to handle. A
    Ctrl-C inside the block (a few submits) is lost. Outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT sets a flag instead of raising while the block runs; the interrupt is raised when it ends.

    Nests (only the outermost block installs and restores the handler). A block that ends with an error while
    Ctrl-C is pending raises KeyboardInterrupt from that error (the interrupt is never dropped). A process that
    ignores SIGINT (a shell's background job) keeps ignoring it; outside the main thread nothing changes."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = None
    if _depth == 0:
        current = signal.getsignal(signal.SIGINT)
        if current is signal.SIG_IGN or current is None:  # ignored, or set by native code: leave it be
            yield
            return
        previous = signal.signal(signal.SIGINT, _on_sigint)
    _depth += 1
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if _pending:  # e.g. the parser rejecting a graph it was reading when Ctrl-C came: the interrupt wins
            _pending = False
            raise KeyboardInterrupt from exc
        raise
    finally:
        _depth -= 1
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    check()
