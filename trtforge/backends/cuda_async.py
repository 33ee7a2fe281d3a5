"""The CUDA calls on `run`'s submitting path, made without releasing the GIL.

cuda-python (like PyCUDA and CuPy) releases the GIL around every driver call. On its own that is right;
in `run` it is what kept the GPU idle: with planning, merging and collecting threads busy, each release
hands the GIL to another thread, and the submitting thread then waits up to a switch interval to get it
back, a dozen times per batch, so submitting a batch took longer than the GPU took to run it;
`benchmarks/gil_handoff.py` shows the mechanism on any machine (figures:
docs/performance.md#run-loop-defaults).

So the non-blocking calls a batch needs (async copies, event records and waits, graph launches, elapsed
times) go straight to the driver (libcuda) through ctypes.PyDLL, which keeps the GIL for the few
microseconds each takes; blocking calls (event synchronisation) stay with cuda-python and release it.
Pinned staging is filled with memmove through a GIL-holding ctypes prototype for the same reason (numpy
releases the GIL for copies of more than 500 elements). Handles are interchangeable: a cudaStream_t is a
CUstream, a cudaEvent_t a CUevent, a cudaGraphExec_t a CUgraphExec, on the primary context the runtime
made current. Hand-written because no maintained binding offers GIL-holding calls.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np


class Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D (cuda.h), the argument of cuMemcpy2DAsync_v2."""

    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t),
        ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int),
        ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64),
        ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t),
        ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int),
        ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64),
        ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
    ]


CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE = 1, 2

_SIGNATURES = {
    "cuMemcpy2DAsync_v2": (ctypes.POINTER(Memcpy2D), ctypes.c_void_p),
    "cuMemcpyHtoDAsync_v2": (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p),
    "cuMemcpyDtoHAsync_v2": (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p),
    "cuEventRecord": (ctypes.c_void_p, ctypes.c_void_p),
    "cuStreamWaitEvent": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint),
    "cuGraphLaunch": (ctypes.c_void_p, ctypes.c_void_p),
    "cuEventElapsedTime": (ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuCtxGetCurrent": (ctypes.POINTER(ctypes.c_void_p),),
    "cuCtxSetCurrent": (ctypes.c_void_p,),
}
CUDA_ERROR_INVALID_CONTEXT = 201

# memmove that keeps the GIL (ctypes.memmove is a CFUNCTYPE: it releases it).
memmove_holding_gil = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(ctypes._memmove_addr)


def load_driver(lib: Any = None) -> Any:
    """libcuda through ctypes.PyDLL (calls hold the GIL), with argument types set; `lib` for tests."""
    lib = lib if lib is not None else ctypes.PyDLL("libcuda.so.1")
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return lib


class AsyncCuda:
    """Non-blocking driver calls that keep the GIL; raise RuntimeError naming the call and the CUDA error.

    Made where the CUDA runtime is already current (the runner's thread): its context is kept and made current on
    any other thread whose first call finds none (the collecting thread), then the call is retried once."""

    def __init__(self, lib: Any = None):
        self.lib = load_driver(lib)
        context = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", self.lib.cuCtxGetCurrent(ctypes.byref(context)))
        self.context = context.value

    def _check(self, name: str, code: int) -> None:
        if code:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(text))
            raise RuntimeError(f"{name} failed: CUDA error {code} ({(text.value or b'unknown').decode()})")

    def _call(self, name: str, fn: Any, *args: Any) -> None:
        code = fn(*args)
        if code == CUDA_ERROR_INVALID_CONTEXT and self.context:  # a thread that never touched CUDA
            self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(self.context))
            code = fn(*args)
        self._check(name, code)

    def copy_to_device(self, device_ptr: int, host_ptr: int, nbytes: int, stream: int) -> None:
        self._call("cuMemcpyHtoDAsync", self.lib.cuMemcpyHtoDAsync_v2, device_ptr, host_ptr, nbytes, stream)

    def copy_to_host(self, host_ptr: int, device_ptr: int, nbytes: int, stream: int) -> None:
        self._call("cuMemcpyDtoHAsync", self.lib.cuMemcpyDtoHAsync_v2, host_ptr, device_ptr, nbytes, stream)

    def copy_2d_to_host(
        self, host_ptr: int, host_pitch: int, device_ptr: int, device_pitch: int, width: int, height: int, stream: int
    ) -> None:
        """`height` rows of `width` bytes, `device_pitch` apart on the device, to rows `host_pitch` apart in page-locked
        host memory: one call for many windows' kept slices (run's copy-engine merge)."""
        copy = Memcpy2D(
            srcMemoryType=CU_MEMORYTYPE_DEVICE,
            srcDevice=device_ptr,
            srcPitch=device_pitch,
            dstMemoryType=CU_MEMORYTYPE_HOST,
            dstHost=host_ptr,
            dstPitch=host_pitch,
            WidthInBytes=width,
            Height=height,
        )
        self._call("cuMemcpy2DAsync", self.lib.cuMemcpy2DAsync_v2, ctypes.byref(copy), stream)

    def record(self, event: int, stream: int) -> None:
        self._call("cuEventRecord", self.lib.cuEventRecord, event, stream)

    def wait(self, stream: int, event: int) -> None:
        self._call("cuStreamWaitEvent", self.lib.cuStreamWaitEvent, stream, event, 0)

    def launch(self, graph_exec: int, stream: int) -> None:
        self._call("cuGraphLaunch", self.lib.cuGraphLaunch, graph_exec, stream)

    def elapsed_ms(self, start: int, end: int) -> float:
        ms = ctypes.c_float()
        self._call("cuEventElapsedTime", self.lib.cuEventElapsedTime, ctypes.byref(ms), start, end)
        return float(ms.value)


class CudaPythonCalls:
    """The same calls through cuda-python (they release the GIL): what `run` falls back to where libcuda cannot be
    loaded through ctypes or refuses the probe, so that a driver quirk costs speed, never the run."""

    def __init__(self, cudart: Any, check: Any):
        self.cudart, self.check = cudart, check

    def copy_to_device(self, device_ptr: int, host_ptr: int, nbytes: int, stream: int) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.check(self.cudart.cudaMemcpyAsync(device_ptr, host_ptr, nbytes, kind, stream))

    def copy_to_host(self, host_ptr: int, device_ptr: int, nbytes: int, stream: int) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.check(self.cudart.cudaMemcpyAsync(host_ptr, device_ptr, nbytes, kind, stream))

    def copy_2d_to_host(
        self, host_ptr: int, host_pitch: int, device_ptr: int, device_pitch: int, width: int, height: int, stream: int
    ) -> None:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.check(self.cudart.cudaMemcpy2DAsync(host_ptr, host_pitch, device_ptr, device_pitch, width, height, kind, stream))

    def record(self, event: int, stream: int) -> None:
        self.check(self.cudart.cudaEventRecord(event, stream))

    def wait(self, stream: int, event: int) -> None:
        self.check(self.cudart.cudaStreamWaitEvent(stream, event, 0))

    def launch(self, graph_exec: int, stream: int) -> None:
        self.check(self.cudart.cudaGraphLaunch(graph_exec, stream))

    def elapsed_ms(self, start: int, end: int) -> float:
        return float(self.check(self.cudart.cudaEventElapsedTime(start, end)))


def submit_calls(cudart: Any, check: Any, event: int, stream: int, lib: Any = None) -> tuple[Any, str]:
    """AsyncCuda where it works here, probed by recording `event` on `stream` from this thread and from a new one,
    then waiting for it through cuda-python (the same handles, the same context); else CudaPythonCalls. Returns
    (calls, what the runtime report says)."""
    import threading

    try:
        calls = AsyncCuda(lib)
        failures: list[BaseException] = []

        def elsewhere() -> None:  # as the collecting thread will: a thread with no CUDA context yet
            try:
                calls.record(event, stream)
            except RuntimeError as exc:
                failures.append(exc)

        calls.record(event, stream)
        worker = threading.Thread(target=elsewhere, name="trtforge-cuda-probe")
        worker.start()
        worker.join()
        if failures:
            raise failures[0]
        check(cudart.cudaEventSynchronize(event))
        return calls, "libcuda through ctypes, GIL held"
    except (OSError, AttributeError, RuntimeError) as exc:
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        return CudaPythonCalls(cudart, check), f"cuda-python (GIL released per call): the GIL-holding path failed its probe ({why})"


def adjacent_runs(parts: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, nbytes) parts, in order, with each part that starts where the previous one ends joined to it:
    a batch of consecutive windows of one document (rows of one block, tokenize.wrap_spans) is one copy. Pure."""
    runs: list[tuple[int, int]] = []
    for address, nbytes in parts:
        if runs and runs[-1][0] + runs[-1][1] == address:
            runs[-1] = (runs[-1][0], runs[-1][1] + nbytes)
        else:
            runs.append((address, nbytes))
    return runs


def stack_into(view: np.ndarray, value: Any) -> None:
    """Write a feed (an array, or its chunks' arrays stacked along axis 0) into `view` (pinned memory),
    holding the GIL: one memmove per run of adjacent C-contiguous parts of view's dtype, numpy for anything else."""
    parts: Sequence[Any] = value if isinstance(value, (list, tuple)) else [value]
    rows = view.shape[1:] if isinstance(value, (list, tuple)) else view.shape
    if (
        view.flags.c_contiguous
        and all(
            isinstance(p, np.ndarray)
            and p.dtype == view.dtype
            and p.flags.c_contiguous
            and (p.shape[1:] if isinstance(value, (list, tuple)) else p.shape) == rows
            for p in parts
        )
        and sum(p.nbytes for p in parts) == view.nbytes
    ):
        address = view.ctypes.data
        for source, nbytes in adjacent_runs([(part.__array_interface__["data"][0], part.nbytes) for part in parts]):
            memmove_holding_gil(address, source, nbytes)
            address += nbytes
        return
    if isinstance(value, (list, tuple)):
        np.concatenate(value, axis=0, out=view, casting="same_kind")
    else:
        np.copyto(view, value, casting="same_kind")
