"""Executing TensorRT engines: cuda-python buffers, one execution context per profile, pipelined batches.

Kept apart from tensorrt.py (building) because it needs a GPU; it receives the TensorRT module from
tensorrt.load_trt and imports nothing of TensorRT by itself.

Pipelining: one execution context per optimization profile (TensorRT lets a profile belong to one
context at a time), a compute stream and two copy streams, and two slots of device + pinned host
buffers. Batch i uses slot i % 2: its H2D copy (copy stream) overlaps the compute of batch i - 1, and
its D2H copy (second copy stream) overlaps the compute of batch i + 1; events order each batch's
copy -> compute -> copy, and a slot is reused only after its previous batch was collected.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from trtforge.errors import UserError
from trtforge.profiles import Profile, profiles_from_json, select_profile


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[no-redef]  # cuda-python < 12.6
        except ImportError:
            raise UserError("cuda-python is not installed; `pip install cuda-python` (extra 'cuda') to run engines.") from None
    return cudart


def _handle(obj: Any) -> int:
    """TensorRT takes CUDA streams as plain integers; cuda-python gives typed handles."""
    try:
        return int(obj)
    except TypeError:
        return int(obj.getPtr())


def _ok(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        cudart = _cudart()
        name = cudart.cudaGetErrorString(err)[1]
        raise RuntimeError(f"CUDA error {int(err)}: {name.decode() if isinstance(name, bytes) else name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def _check_gpu_supported(flavour: str, engine_path: Path) -> None:
    """Say in one sentence when this GPU cannot run the flavour's engines (TensorRT-RTX refuses sm_90)."""
    from trtforge.doctor import _support_here

    ok, why = _support_here().get(flavour, (True, ""))
    if not ok:
        raise UserError(f"{Path(engine_path).name} cannot run here: {flavour} engines {why.removeprefix('no: ')}; "
                        "rebuild it with a TensorRT that supports this GPU, or run its ONNX on ONNX Runtime.")


class PinnedBuffer:
    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(_ok(_cudart().cudaMallocHost(self.nbytes)))
        self._raw = (ctypes.c_byte * self.nbytes).from_address(self.ptr)

    def view(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape)) if shape else 1
        return np.frombuffer(self._raw, dtype=dtype, count=count).reshape(shape)

    def free(self) -> None:
        if self.ptr:
            _cudart().cudaFreeHost(self.ptr)
            self.ptr = 0


class DeviceBuffer:
    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(_ok(_cudart().cudaMalloc(self.nbytes)))

    def free(self) -> None:
        if self.ptr:
            _cudart().cudaFree(self.ptr)
            self.ptr = 0


@dataclass
class _Slot:
    device: dict[str, DeviceBuffer] = field(default_factory=dict)
    host: dict[str, PinnedBuffer] = field(default_factory=dict)
    events: dict[str, Any] = field(default_factory=dict)  # h2d, start, end, d2h
    pending: Any = None  # (tag, profile, output shapes, submit time) of the batch in flight


@dataclass
class BatchTiming:
    profile: int
    gpu_ms: float
    wall_ms: float


class TrtRunner:
    """Runs an engine built by `trtforge build`; `run` for one batch, `run_many` for a pipelined stream."""

    def __init__(self, mod: Any, engine_path: Path, sidecar: dict[str, Any]):
        self.mod, self.trt = mod, mod.trt
        _check_gpu_supported(mod.flavour, engine_path)
        cudart = _cudart()
        self.free_before = _ok(cudart.cudaMemGetInfo())[0]
        logger = self.trt.Logger(self.trt.Logger.ERROR)
        if mod.flavour == "tensorrt" and hasattr(self.trt, "init_libnvinfer_plugins"):
            self.trt.init_libnvinfer_plugins(logger, "")  # engines with fused-attention plugin layers need the registry
        self.runtime = self.trt.Runtime(logger)
        data = Path(engine_path).read_bytes()
        self.engine = self.runtime.deserialize_cuda_engine(data)
        if self.engine is None:
            raise UserError(f"engine {engine_path} is truncated or corrupt (TensorRT could not load it); rebuild it with trtforge build.")
        self.profiles: list[Profile] = profiles_from_json(sidecar["profiles"])
        self.inputs_spec = sidecar.get("inputs", [])
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode_in = self.trt.TensorIOMode.INPUT
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == mode_in]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) != mode_in]
        self.dtypes = {n: np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.compute_stream = _ok(cudart.cudaStreamCreate())
        self.h2d_stream = _ok(cudart.cudaStreamCreate())
        self.d2h_stream = _ok(cudart.cudaStreamCreate())
        self.contexts: dict[int, Any] = {}
        self.profile_bytes: dict[int, dict[str, int]] = {}
        self.slots = [self._make_slot() for _ in range(2)]
        self.timings: list[BatchTiming] = []
        self.peak_bytes = 0

    # -- setup -------------------------------------------------------------------------------
    def _make_slot(self) -> _Slot:
        cudart = _cudart()
        slot = _Slot()
        for name in ("h2d", "start", "end", "d2h"):
            slot.events[name] = _ok(cudart.cudaEventCreate())
        return slot

    def _context(self, profile: int) -> Any:
        """The one context of this profile, created on first use; also sizes its I/O at the profile's max."""
        if profile not in self.contexts:
            ctx = self.engine.create_execution_context()
            if ctx is None:
                raise RuntimeError(f"TensorRT could not create an execution context for profile {profile} (out of GPU memory?)")
            ctx.set_optimization_profile_async(profile, _handle(self.compute_stream))
            _ok(_cudart().cudaStreamSynchronize(self.compute_stream))
            for name in self.input_names:
                ctx.set_input_shape(name, self.profiles[profile].shapes[name][2])
            self.profile_bytes[profile] = {
                name: int(np.prod(tuple(ctx.get_tensor_shape(name)))) * self.dtypes[name].itemsize
                for name in self.input_names + self.output_names
            }
            self.contexts[profile] = ctx
            self._note_memory()
        return self.contexts[profile]

    def _ensure_buffers(self, slot: _Slot, profile: int) -> None:
        grown = False
        for name, nbytes in self.profile_bytes[profile].items():
            if name not in slot.device or slot.device[name].nbytes < nbytes:
                if name in slot.device:
                    slot.device[name].free()
                    slot.host[name].free()
                slot.device[name] = DeviceBuffer(nbytes)
                slot.host[name] = PinnedBuffer(nbytes)
                grown = True
        if grown:  # memory only grows here and at context creation: no per-batch query on the hot path
            self._note_memory()

    def _note_memory(self) -> None:
        free, _total = _ok(_cudart().cudaMemGetInfo())
        self.peak_bytes = max(self.peak_bytes, int(self.free_before - free))

    def profile_for(self, feeds: dict[str, np.ndarray]) -> int:
        sizes: dict[str, int] = {}
        for spec in self.inputs_spec:
            array = feeds.get(spec["name"])
            if array is None:
                continue
            for dim, size in zip(spec["shape"], array.shape):
                if isinstance(dim, str):
                    sizes[dim] = int(size)
        return select_profile(self.profiles, sizes).index

    # -- execution ---------------------------------------------------------------------------
    def _submit(self, slot: _Slot, feeds: dict[str, np.ndarray], profile: int, tag: Any) -> None:
        cudart = _cudart()
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        ctx = self._context(profile)
        self._ensure_buffers(slot, profile)
        submitted = time.perf_counter()
        for name in self.input_names:
            if name not in feeds:
                raise UserError(f"the engine expects input '{name}' but the feeds have {', '.join(feeds)}; check the I/O names.")
            array = np.ascontiguousarray(feeds[name], dtype=self.dtypes[name])
            slot.host[name].view(self.dtypes[name], array.shape)[...] = array
            _ok(cudart.cudaMemcpyAsync(slot.device[name].ptr, slot.host[name].ptr, array.nbytes, h2d, self.h2d_stream))
            if not ctx.set_input_shape(name, array.shape):
                raise UserError(f"input '{name}' shape {list(array.shape)} is outside profile {profile}; rebuild with wider tiers.")
        _ok(cudart.cudaEventRecord(slot.events["h2d"], self.h2d_stream))
        for name in self.input_names + self.output_names:
            ctx.set_tensor_address(name, slot.device[name].ptr)
        shapes = {name: tuple(ctx.get_tensor_shape(name)) for name in self.output_names}
        _ok(cudart.cudaStreamWaitEvent(self.compute_stream, slot.events["h2d"], 0))
        _ok(cudart.cudaEventRecord(slot.events["start"], self.compute_stream))
        if not ctx.execute_async_v3(_handle(self.compute_stream)):
            raise RuntimeError(f"TensorRT execution failed on profile {profile}")
        _ok(cudart.cudaEventRecord(slot.events["end"], self.compute_stream))
        _ok(cudart.cudaStreamWaitEvent(self.d2h_stream, slot.events["end"], 0))
        for name, shape in shapes.items():
            nbytes = int(np.prod(shape)) * self.dtypes[name].itemsize
            _ok(cudart.cudaMemcpyAsync(slot.host[name].ptr, slot.device[name].ptr, nbytes, d2h, self.d2h_stream))
        _ok(cudart.cudaEventRecord(slot.events["d2h"], self.d2h_stream))
        slot.pending = (tag, profile, shapes, submitted)

    def _collect(self, slot: _Slot) -> tuple[Any, dict[str, np.ndarray]]:
        cudart = _cudart()
        _ok(cudart.cudaEventSynchronize(slot.events["d2h"]))
        tag, profile, shapes, submitted = slot.pending
        slot.pending = None
        gpu_ms = float(_ok(cudart.cudaEventElapsedTime(slot.events["start"], slot.events["end"])))
        outputs = {name: slot.host[name].view(self.dtypes[name], shape).copy() for name, shape in shapes.items()}
        self.timings.append(BatchTiming(profile, gpu_ms, (time.perf_counter() - submitted) * 1e3))
        return tag, outputs

    def run(self, feeds: dict[str, np.ndarray], profile: int | None = None) -> dict[str, np.ndarray]:
        slot = self.slots[0]
        if slot.pending is not None:
            self._collect(slot)
        self._submit(slot, feeds, self.profile_for(feeds) if profile is None else profile, None)
        return self._collect(slot)[1]

    def run_many(self, batches: Iterable[tuple[Any, dict[str, np.ndarray]]]) -> Iterable[tuple[Any, dict[str, np.ndarray]]]:
        """Pipelined: yields (tag, outputs) in submission order while the next batch is in flight."""
        i = 0
        for tag, feeds in batches:
            slot = self.slots[i % 2]
            if slot.pending is not None:
                yield self._collect(slot)
            self._submit(slot, feeds, self.profile_for(feeds), tag)
            i += 1
        for k in range(2):  # drain in order: the older slot first
            slot = self.slots[(i + k) % 2]
            if slot.pending is not None:
                yield self._collect(slot)

    def close(self) -> None:
        for slot in self.slots:
            for buf in list(slot.device.values()) + list(slot.host.values()):
                buf.free()
        self.contexts.clear()
