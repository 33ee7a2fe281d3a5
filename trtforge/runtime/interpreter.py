"""The Python interpreter during the inference loop: garbage collection held, switch interval raised."""

from __future__ import annotations

import gc
import resource
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from trtforge.runtime.options import RunOptions


@contextmanager
def interpreter_for_loop(options: RunOptions) -> Iterator[None]:
    """The interpreter as an inference loop wants it, restored after: the GIL switch interval at
    --switch-interval-us, and, with --gc-pause, the cyclic garbage collector off (collect_garbage says why;
    left off if the caller had it off). Used by the one-process loop and by each Ray actor's units."""
    interval, gc_was_on = sys.getswitchinterval(), gc.isenabled()
    sys.setswitchinterval(options.switch_interval_us * 1e-6)
    try:
        if options.gc_pause:
            gc.disable()
        yield
    finally:
        sys.setswitchinterval(interval)
        if gc_was_on:
            gc.enable()


def collect_garbage() -> float:
    """One full collection (seconds it took), before `run`'s clock: the loop then runs with the collector off.

    Why: Python's cyclic collector runs a full pass, over every object of the process, when enough objects have
    piled up, on whichever thread allocates; that thread holds the GIL meanwhile, so every thread of the loop stops.
    A full pass takes tens of ms, many times a batch's GPU time (figures: docs/performance.md#run-loop-defaults). The
    loop makes no reference cycles to speak of (30 cyclic objects over a whole MiniLM run, all from setting up ctypes),
    so nothing piles up while it is off."""
    begin = time.perf_counter()
    gc.collect()
    return round(time.perf_counter() - begin, 6)


def minor_faults() -> int:
    """This process's minor page faults so far: memory touched for the first time (fresh allocations) costs one per page,
    charged to the thread that touches it."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
