"""Host-memory copies that keep the GIL.

numpy releases the GIL for any copy of more than 500 elements, and getting it back costs a thread up to a
switch interval when planning and merging threads are busy (benchmarks/gil_handoff.py). On `run`'s hot
threads (the one feeding the GPU, the one collecting its outputs) a few hundred kilobytes are copied
faster than the GIL comes back, so they copy through memmove with a GIL-holding ctypes prototype
(ctypes.memmove is a CFUNCTYPE, which releases it). Hand-written: no library offers a GIL-holding copy.
"""

from __future__ import annotations

import ctypes

import numpy as np

memmove_holding_gil = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(ctypes._memmove_addr)


def copy_holding_gil(dst: np.ndarray, src: np.ndarray) -> bool:
    """Copy src into dst with one memmove when both are C-contiguous, of one dtype and shape; False (nothing
    copied) otherwise, for the caller's numpy fallback."""
    if (dst.dtype != src.dtype or dst.shape != src.shape or not dst.flags.c_contiguous or not src.flags.c_contiguous
            or not dst.flags.writeable):
        return False
    if dst.nbytes:
        memmove_holding_gil(dst.ctypes.data, src.ctypes.data, dst.nbytes)
    return True
