"""`run --save-outputs`: each input's merged outputs written to the .npz as soon as the input is finished.

Written on a thread of its own, so that the merge threads hand an input over and go back to the batches; its
memory goes back to the output pool (outpool.py) once it is on disk, so a run holds the inputs in flight, not the
whole corpus. Before, every output stayed in memory until the loop ended and was written after it. At most `queued`
inputs wait for the writer: a merge thread that would exceed that waits, which holds its staging slot and so slows
the GPU loop to the disk's pace instead of letting memory grow with the corpus. Keys are written in the order
inputs finish (np.load gives them by name).
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from trtforge.core.artifacts import NpzStream
from trtforge.runtime.loop import put_while

_END = object()


class OutputWriter:
    """put(prefix, outputs, release): arrays written as PREFIX/NAME, then release() called; close() publishes the
    file, abort() removes it without writing what is still queued. An error on the writing thread (or in a release)
    is raised by the next put() and by close()."""

    def __init__(self, path: Path, queued: int = 8):
        self.stream = NpzStream(path)
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._aborted = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(queued)))
        self._thread = threading.Thread(target=self._work, name="trtforge-save", daemon=True)
        self._thread.start()

    def put(self, prefix: str, outputs: dict[str, np.ndarray], release: Callable[[], None]) -> None:
        # waits while `queued` inputs are ahead, re-checking for a writer that failed (or was stopped) meanwhile
        if not put_while(self._queue, (prefix, outputs, release), lambda: self.error is None and not self._aborted.is_set()):
            release()
            raise self.error or RuntimeError("the output writer was stopped")

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            prefix, outputs, release = item
            try:
                if self.error is None and not self._aborted.is_set():
                    start = time.perf_counter()
                    for name, value in outputs.items():
                        self.stream.write(f"{prefix}/{name}", value)
                    self.seconds += time.perf_counter() - start
            except BaseException as exc:  # raised in the loop by the next put, and by close
                self.error = exc
            finally:
                try:
                    release()
                except BaseException as exc:  # a failed release must not end the thread silently
                    self.error = self.error or exc

    def _join(self) -> None:
        put_while(self._queue, _END, self._thread.is_alive)  # after whatever is queued (abort: released, not written)
        self._thread.join()

    def close(self) -> None:
        self._join()
        if self.error is not None:
            self.stream.abort()
            raise self.error
        self.stream.close()

    def abort(self) -> None:
        self._aborted.set()
        try:
            self._join()
        finally:
            self.stream.abort()
