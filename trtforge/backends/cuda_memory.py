"""CUDA through cuda-python for the TensorRT runner: the runtime module, error checks, device and pinned host buffers."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtforge.core.errors import UserError


def cuda_runtime() -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[no-redef]  # cuda-python < 12.6
        except ImportError:
            raise UserError("cuda-python is not installed; `pip install cuda-python` (extra 'cuda') to run engines.") from None
    return cudart


def cuda_handle(obj: Any) -> int:
    """TensorRT takes CUDA streams as plain integers; cuda-python gives typed handles."""
    try:
        return int(obj)
    except TypeError:
        return int(obj.getPtr())


def cuda_check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        cudart = cuda_runtime()
        name = cudart.cudaGetErrorString(err)[1]
        raise RuntimeError(f"CUDA error {int(err)}: {name.decode() if isinstance(name, bytes) else name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def check_gpu_supported(flavour: str, engine_path: Path) -> None:
    """Say in one sentence when this GPU cannot run the flavour's engines (TensorRT-RTX refuses sm_90)."""
    from trtforge.core.platform import support_here

    ok, why = support_here().get(flavour, (True, ""))
    if not ok:
        raise UserError(
            f"{Path(engine_path).name} cannot run here: {flavour} engines {why.removeprefix('no: ')}; "
            "rebuild it with a TensorRT that supports this GPU, or run its ONNX on ONNX Runtime."
        )


class PinnedBuffer:
    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(cuda_check(cuda_runtime().cudaMallocHost(self.nbytes)))
        self._raw = (ctypes.c_byte * self.nbytes).from_address(self.ptr)
        self._views: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}

    def view(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The buffer's first bytes as an array; views are kept per (dtype, shape): a batch asks for the same ones."""
        key = (np.dtype(dtype).str, tuple(shape))
        view = self._views.get(key)
        if view is None:
            view = np.frombuffer(self._raw, dtype=dtype, count=math.prod(shape)).reshape(shape)
            self._views[key] = view
        return view

    def free(self) -> None:
        if self.ptr:
            self._views.clear()
            cuda_runtime().cudaFreeHost(self.ptr)
            self.ptr = 0


class DeviceBuffer:
    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(cuda_check(cuda_runtime().cudaMalloc(self.nbytes)))

    def free(self) -> None:
        if self.ptr:
            cuda_runtime().cudaFree(self.ptr)
            self.ptr = 0


def allocate_pinned(nbytes: int) -> tuple[np.ndarray, Callable[[], None]]:
    """Page-locked host memory as a uint8 array, and what frees it (an outpool.OutputPool allocator): memory the GPU's
    copy engine may write into asynchronously."""
    buffer = PinnedBuffer(nbytes)
    return buffer.view(np.uint8, (buffer.nbytes,)), buffer.free
