"""`run --save-outputs`: each input's merged outputs written to the .npz as soon as the input is finished.

Written on a thread of its own, so that the merge threads hand an input over and go back to the batches; its
memory goes back to the output pool (outpool.py) once it is on disk, so a run holds the inputs in flight, not the
whole corpus. Before, every output stayed in memory until the loop ended and was written after it.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from trtforge.artifacts import NpzStream

_END = object()


class OutputWriter:
    """put(prefix, outputs, release): arrays written as PREFIX/NAME, then release() called; close() publishes the
    file, abort() removes it. An error on the writing thread is raised by the next put() and by close()."""

    def __init__(self, path: Path):
        self.stream = NpzStream(path)
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="trtforge-save", daemon=True)
        self._thread.start()

    def put(self, prefix: str, outputs: dict[str, np.ndarray], release: Callable[[], None]) -> None:
        if self.error is not None:
            release()
            raise self.error
        self._queue.put((prefix, outputs, release))

    def _work(self) -> None:
        import time

        while True:
            item = self._queue.get()
            if item is _END:
                return
            prefix, outputs, release = item
            try:
                if self.error is None:
                    start = time.perf_counter()
                    for name, value in outputs.items():
                        self.stream.write(f"{prefix}/{name}", value)
                    self.seconds += time.perf_counter() - start
            except BaseException as exc:  # raised in the loop by the next put, and by close
                self.error = exc
            finally:
                release()

    def _join(self) -> None:
        self._queue.put(_END)
        self._thread.join()

    def close(self) -> None:
        self._join()
        if self.error is not None:
            self.stream.abort()
            raise self.error
        self.stream.close()

    def abort(self) -> None:
        self._join()
        self.stream.abort()
