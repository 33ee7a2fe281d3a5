"""Executing TensorRT engines: cuda-python buffers, one execution context per profile, pipelined batches.

Kept apart from tensorrt.py (building) because it needs a GPU; it receives the TensorRT module from
tensorrt.load_trt and imports nothing of TensorRT by itself.

Pipelining: one execution context per optimization profile (TensorRT lets a profile belong to one
context at a time), all sharing one device-memory block since they only run on the one compute
stream; two copy streams; N slots of device + pinned host buffers, sized once for the largest batch
of any profile so addresses never change. Batch i uses slot i % N: its H2D copy overlaps earlier
batches' compute, its D2H copy later ones'; events order each batch's copy -> compute -> copy, and a
slot is reused only after its previous batch was collected. Each (profile, shape, slot) is captured
once as a CUDA graph and replayed (runloop.GraphCache decides when); capture failures fall back to
plain enqueues and are reported.
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from trtforge.backends.base import RunnerLifecycle
from trtforge.backends.cuda_async import stack_into, submit_calls
from trtforge.backends.cuda_memory import DeviceBuffer, PinnedBuffer, check_gpu_supported, cuda_check, cuda_handle, cuda_runtime
from trtforge.build.profiles import Profile, profiles_from_json, select_profile
from trtforge.core import interrupts
from trtforge.core.errors import UserError
from trtforge.runtime.copymerge import OutputCopies
from trtforge.runtime.loop import CAPTURE, ENQUEUE, LAUNCH, GraphCache, StageClock, check_gpu_wait, padded_batch, slot_bytes


class RuntimeLogger:
    """TensorRT's runtime errors: to stderr, except while `holding()`, when they are kept for the caller (a
    CUDA-graph capture attempt that an engine refuses, e.g. RoBERTa's Myelin graph on 8.6: "this TRT engine is
    not stream capturable", becomes the fallback's recorded reason, not noise)."""

    def __init__(self, trt: Any):
        self.held: list[str] | None = None
        outer = self
        if not hasattr(trt, "ILogger"):  # a runtime without the logger interface: its default logger
            self.impl = trt.Logger(trt.Logger.ERROR)
            return
        shown = (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR)

        class Impl(trt.ILogger):
            def __init__(inner):
                trt.ILogger.__init__(inner)

            def log(inner, severity, msg):
                if severity not in shown:
                    return
                if outer.held is not None:
                    outer.held.append(" ".join(str(msg).split())[:300])
                else:
                    print(f"TensorRT: {msg}", file=sys.stderr, flush=True)

        self.impl = Impl()

    @contextmanager
    def holding(self) -> Iterator[list[str]]:
        self.held = []
        try:
            yield self.held
        finally:
            self.held = None


@dataclass
class _Slot:
    device: dict[str, DeviceBuffer] = field(default_factory=dict)
    host: dict[str, PinnedBuffer] = field(default_factory=dict)
    events: dict[str, Any] = field(default_factory=dict)  # h2d, start, end, d2h
    event_handles: dict[str, int] = field(default_factory=dict)  # the same events as driver handles
    pending: Any = None  # (tag, profile, output shapes, not a graph replay) of the batch in flight


@dataclass
class BatchTiming:
    profile: int
    gpu_ms: float
    wall_ms: float  # wall time this batch cost: since the previous batch completed (see runloop.completion_intervals)


class TrtRunner(RunnerLifecycle):
    """Runs an engine built by `trtforge build`; `run` for one batch, `run_many` for a pipelined stream.

    `slots` staging slots (device + pinned host buffers, sized once for any profile's largest batch, so
    their addresses never change); batches use them round robin, so while the oldest batch's outputs
    are copied out the GPU still holds `slots - 1` batches. All contexts share one device-memory block
    (their activations): they only ever run on the one compute stream, one after the other. With
    `cuda_graphs`, each (profile, shape, slot) is captured once and replayed (runloop.GraphCache). With
    `pad_batches` (run's loop; off for other callers), a batch of fewer rows than one that already ran at the same other
    dims (a stream's last, partial batch) runs padded to it (runloop.padded_batch says why). `gpu_wait`: how the collector waits for a batch, "spin"
    (CUDA's default on a box with more cores than contexts: a core busy polling) or "block" (a blocking-sync event: the
    thread sleeps until the GPU signals, leaving the core to the loop's Python threads)."""

    def __init__(
        self,
        mod: Any,
        engine_path: Path,
        sidecar: dict[str, Any],
        slots: int = 3,
        cuda_graphs: bool = True,
        shared_device_memory: bool = True,
        pad_batches: bool = False,
        gpu_wait: str = "spin",
    ):
        self.mod, self.trt = mod, mod.trt
        check_gpu_supported(mod.flavour, engine_path)
        cudart = cuda_runtime()
        self.free_before = cuda_check(cudart.cudaMemGetInfo())[0]
        self.logger = RuntimeLogger(self.trt)
        logger = self.logger.impl
        data = Path(engine_path).read_bytes()
        from trtforge.backends.plugin_libraries import load_engine_plugin_libraries

        load_engine_plugin_libraries(mod, sidecar, engine_path)  # their layers' creators, first
        with interrupts.deferred():  # TensorRT swallows a KeyboardInterrupt raised in its logger
            if mod.flavour == "tensorrt" and hasattr(self.trt, "init_libnvinfer_plugins"):
                self.trt.init_libnvinfer_plugins(logger, "")  # engines with fused-attention plugin layers need the registry
            self.runtime = self.trt.Runtime(logger)
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
        self.compute_stream = cuda_check(cudart.cudaStreamCreate())
        self.h2d_stream = cuda_check(cudart.cudaStreamCreate())
        self.d2h_stream = cuda_check(cudart.cudaStreamCreate())
        self._streams = {name: cuda_handle(getattr(self, name)) for name in ("compute_stream", "h2d_stream", "d2h_stream")}
        probe = cuda_check(cudart.cudaEventCreate())
        # the submitting path's calls keep the GIL (cuda_async.py says why), where the probe shows they work here
        self.cuda, self.submit_calls = submit_calls(cudart, cuda_check, cuda_handle(probe), self._streams["compute_stream"])
        cudart.cudaEventDestroy(probe)
        self.timings: list[BatchTiming] = []
        self.peak_bytes = 0
        self.graphs = GraphCache(enabled=cuda_graphs)
        self.pad_batches = pad_batches
        check_gpu_wait(gpu_wait)
        self.gpu_wait = gpu_wait
        self._batch_rows: dict[tuple, set[int]] = {}  # inputs' dims after the batch axis -> batch sizes that ran
        self._pads_rows = pad_batches and self._leads_with_batch(sidecar)
        self.padding = {"enabled": self._pads_rows, "batches": 0, "rows": 0}
        if pad_batches and not self._pads_rows:
            self.padding["reason"] = "the engine's inputs or outputs do not all lead with one batch axis"
        self.host = StageClock()  # where the host's time goes: runtime_report()["host_seconds"]
        self.shared_memory: dict[str, Any] = {"enabled": False}
        self._memory: DeviceBuffer | None = None
        if shared_device_memory:
            self._share_memory()
        self.contexts: dict[int, Any] = {}
        self._ctx_shape: dict[int, Any] = {}  # input shapes last set on each context
        self._ctx_slot: dict[int, int] = {}  # slot whose addresses each context holds
        self._out_shapes: dict[tuple[int, Any], dict[str, tuple[int, ...]]] = {}
        self.profile_bytes = {p: self._sizes(p) for p in range(len(self.profiles))}
        sizes = slot_bytes(self.profile_bytes)
        self.slots = [self._make_slot(sizes) for _ in range(max(1, int(slots)))]
        self._note_memory()

    # -- setup -------------------------------------------------------------------------------
    def _share_memory(self) -> None:
        """One block for every context's activations, sized by the engine (TensorRT 10: `_v2`)."""
        size = getattr(self.engine, "device_memory_size_v2", None)
        size = int(size if size is not None else self.engine.device_memory_size)
        self._memory = DeviceBuffer(size)
        self.shared_memory = {"enabled": True, "mb": size / 2**20}

    def _new_context(self) -> Any:
        if self._memory is not None:
            try:
                return self._shared_context()
            except Exception as exc:  # an API this TensorRT lacks: own memory per context, said in the report
                if self.contexts:
                    raise
                self._memory.free()
                self._memory = None
                self.shared_memory = {"enabled": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}
        return self.engine.create_execution_context()

    def _shared_context(self) -> Any:
        """A context without its own activation memory, given the shared block (TensorRT 8.6 and >= 10 APIs)."""
        assert self._memory is not None
        if self.mod.strongly_typed:  # TensorRT >= 10 and RTX: an allocation strategy instead of a separate call
            ctx = self.engine.create_execution_context(self.trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        else:  # TensorRT 8.6
            ctx = self.engine.create_execution_context_without_device_memory()
        if ctx is None:
            raise RuntimeError("TensorRT returned no context without device memory")
        if hasattr(ctx, "set_device_memory"):
            ctx.set_device_memory(self._memory.ptr, self._memory.nbytes)
        else:
            try:
                ctx.device_memory = self._memory.ptr
            except TypeError:  # bindings typed as a capsule
                capsule_new = ctypes.pythonapi.PyCapsule_New
                capsule_new.restype, capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
                ctx.device_memory = capsule_new(self._memory.ptr, None, None)
        return ctx

    def _context(self, profile: int) -> Any:
        """The one context of this profile (TensorRT lets a profile belong to one context)."""
        if profile not in self.contexts:
            ctx = self._new_context()
            if ctx is None:
                raise RuntimeError(f"TensorRT could not create an execution context for profile {profile} (out of GPU memory?)")
            ctx.set_optimization_profile_async(profile, cuda_handle(self.compute_stream))
            cuda_check(cuda_runtime().cudaStreamSynchronize(self.compute_stream))
            self.contexts[profile] = ctx
        return self.contexts[profile]

    def _sizes(self, profile: int) -> dict[str, int]:
        """Bytes of every I/O tensor at the profile's largest shapes."""
        ctx = self._context(profile)
        for name in self.input_names:
            ctx.set_input_shape(name, self.profiles[profile].shapes[name][2])
        self._ctx_shape[profile] = None
        return {
            name: int(np.prod(tuple(ctx.get_tensor_shape(name)))) * self.dtypes[name].itemsize
            for name in self.input_names + self.output_names
        }

    def _make_slot(self, sizes: dict[str, int]) -> _Slot:
        cudart = cuda_runtime()
        slot = _Slot()
        for name in ("h2d", "start", "end", "d2h"):
            if name == "d2h" and self.gpu_wait == "block":  # the one the collector synchronizes on
                slot.events[name] = cuda_check(cudart.cudaEventCreateWithFlags(getattr(cudart, "cudaEventBlockingSync", 1)))
            else:
                slot.events[name] = cuda_check(cudart.cudaEventCreate())
            slot.event_handles[name] = cuda_handle(slot.events[name])
        for name, nbytes in sizes.items():
            slot.device[name] = DeviceBuffer(nbytes)
            slot.host[name] = PinnedBuffer(nbytes)
        return slot

    def _note_memory(self) -> None:
        free, _total = cuda_check(cuda_runtime().cudaMemGetInfo())
        self.peak_bytes = max(self.peak_bytes, int(self.free_before - free))

    def profile_for(self, feeds: dict[str, Any], shapes: dict[str, tuple[int, ...]] | None = None) -> int:
        """The profile a batch runs on; `shapes`: its feeds' shapes where the caller has them already."""
        sizes: dict[str, int] = {}
        for spec in self.inputs_spec:
            value = feeds.get(spec["name"])
            if value is None:
                continue
            shape = shapes[spec["name"]] if shapes is not None and spec["name"] in shapes else _shape_of(value)
            for dim, size in zip(spec["shape"], shape):
                if isinstance(dim, str):
                    sizes[dim] = int(size)
        return select_profile(self.profiles, sizes).index

    def runtime_report(self) -> dict[str, Any]:
        return {
            "cuda_graphs": self.graphs.report(),
            "shared_device_memory": dict(self.shared_memory),
            "padding": dict(self.padding),
            "gpu_wait": self.gpu_wait,
            "staging_slots": len(self.slots),
            "submit_calls": self.submit_calls,
            "host_seconds": self.host.report(),
        }

    # -- execution ---------------------------------------------------------------------------
    def _stage(self, slot: _Slot, feeds: dict[str, Any], known: dict[str, tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
        """Inputs (shapes `known`) into the slot's pinned buffers (one copy: a batch given as its chunks' parts is
        concatenated there), then one async H2D copy each; the GIL is held throughout (cuda_async.py)."""
        shapes = []
        for name in self.input_names:
            value, dtype = feeds[name], self.dtypes[name]
            shape = known[name]
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > slot.host[name].nbytes:
                raise UserError(f"input '{name}' shape {list(shape)} is larger than any profile of this engine; rebuild with wider tiers.")
            stack_into(slot.host[name].view(dtype, shape), value)
            self.cuda.copy_to_device(slot.device[name].ptr, slot.host[name].ptr, nbytes, self._streams["h2d_stream"])
            shapes.append(shape)
        return tuple(shapes)

    def _prepare_context(self, ctx: Any, profile: int, shape: tuple, s: int) -> None:
        """Shapes and addresses on the context, set only when they change (set_input_shape is not free)."""
        if self._ctx_shape.get(profile) != shape:
            for name, dims in zip(self.input_names, shape):
                if not ctx.set_input_shape(name, dims):
                    raise UserError(f"input '{name}' shape {list(dims)} is outside profile {profile}; rebuild with wider tiers.")
            self._ctx_shape[profile] = shape
        if self._ctx_slot.get(profile) != s:
            for name in self.input_names + self.output_names:
                ctx.set_tensor_address(name, self.slots[s].device[name].ptr)
            self._ctx_slot[profile] = s
        if (profile, shape) not in self._out_shapes:
            self._out_shapes[(profile, shape)] = {name: tuple(ctx.get_tensor_shape(name)) for name in self.output_names}

    def _capture(self, ctx: Any) -> tuple[Any, str | None]:
        """One enqueue captured as a CUDA graph and instantiated; (None, why) when TensorRT's enqueue cannot be captured."""
        cudart = cuda_runtime()
        stream = self.compute_stream
        try:
            cuda_check(cudart.cudaStreamBeginCapture(stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
        except RuntimeError as exc:
            return None, f"cudaStreamBeginCapture: {exc}"
        why = None
        with self.logger.holding() as held:  # an engine that refuses capture says so in an error: recorded, not printed
            try:
                if not ctx.execute_async_v3(cuda_handle(stream)):
                    why = "execute_async_v3 failed under capture" + (f" ({held[-1]})" if held else "")
            except Exception as exc:  # the capture is ended below either way; the batch then runs plainly
                why = f"execute_async_v3 under capture: {type(exc).__name__}: {exc}"[:300]
        err, graph = cudart.cudaStreamEndCapture(stream)
        if why is not None or int(err) != 0:
            if int(err) == 0 and graph is not None:
                cudart.cudaGraphDestroy(graph)
            return None, why or f"cudaStreamEndCapture: CUDA error {int(err)}"
        try:
            exe = cuda_check(cudart.cudaGraphInstantiateWithFlags(graph, 0))
        except RuntimeError as exc:
            cudart.cudaGraphDestroy(graph)
            return None, f"cudaGraphInstantiate: {exc}"
        return (graph, exe), None

    def feed_shapes(self, feeds: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Each input's shape, once per batch (the profile choice and the staging both need them)."""
        shapes = {}
        for name in self.input_names:
            if name not in feeds:
                raise UserError(f"the engine expects input '{name}' but the feeds have {', '.join(feeds)}; check the I/O names.")
            shapes[name] = _shape_of(feeds[name])
        return shapes

    def _copy_out(self, slot: _Slot, shapes: dict[str, tuple[int, ...]], placed: dict[str, OutputCopies]) -> None:
        """Each output to the slot's pinned buffer, or where `placed` puts it (its strided copies, and only its
        slot_rows to the slot), on the D2H stream behind the batch's compute."""
        cuda, stream = self.cuda, self._streams["d2h_stream"]
        for name, out_shape in shapes.items():
            nbytes = math.prod(out_shape) * self.dtypes[name].itemsize
            copies = placed.get(name)
            host, device = slot.host[name].ptr, slot.device[name].ptr
            if copies is None:
                cuda.copy_to_host(host, device, nbytes, stream)
                continue
            row = nbytes // max(1, out_shape[0])
            for first, rows in copies.slot_rows:
                cuda.copy_to_host(host + first * row, device + first * row, rows * row, stream)
            for address, pitch, offset, device_pitch, width, height in copies.strided:
                if height == 1:
                    cuda.copy_to_host(address, device + offset, width, stream)
                else:
                    cuda.copy_2d_to_host(address, pitch, device + offset, device_pitch, width, height, stream)

    def _submit(
        self,
        s: int,
        feeds: dict[str, Any],
        profile: int,
        tag: Any,
        shapes: dict[str, tuple[int, ...]],
        place: Callable[[Any, dict[str, tuple[int, ...]]], dict[str, OutputCopies]] | None = None,
        rows: int | None = None,
    ) -> None:
        """rows: the batch's own rows where it runs padded (the outputs handed on are those rows only)."""
        cuda, streams, slot = self.cuda, self._streams, self.slots[s]
        events = slot.event_handles
        ctx = self._context(profile)
        with self.host.stage("stage_inputs"):  # stack the chunks into pinned memory, queue the H2D copies
            shape = self._stage(slot, feeds, shapes)
        cuda.record(events["h2d"], streams["h2d_stream"])
        action = self.graphs.action(profile, shape, s)
        if action != LAUNCH:
            self._prepare_context(ctx, profile, shape, s)
        shapes = self._out_shapes[(profile, shape)]
        if rows is not None:  # padded (every output leads with the rows: _padded): its own, the first, are copied out and handed on
            shapes = {name: (rows, *dims[1:]) for name, dims in shapes.items()}
        cuda.wait(streams["compute_stream"], events["h2d"])
        cuda.record(events["start"], streams["compute_stream"])
        graph, error = None, None
        if action == CAPTURE:
            graph, error = self._capture(ctx)
        if action == ENQUEUE or error is not None:
            if not ctx.execute_async_v3(streams["compute_stream"]):
                raise RuntimeError(f"TensorRT execution failed on profile {profile}")
        else:
            exe = graph[1] if graph is not None else self.graphs.graphs[(profile, shape, s)][1]
            cuda.launch(cuda_handle(exe), streams["compute_stream"])
        self.graphs.done(profile, shape, s, action, graph, error)
        cuda.record(events["end"], streams["compute_stream"])
        cuda.wait(streams["d2h_stream"], events["end"])
        self._copy_out(slot, shapes, place(tag, shapes) if place is not None else {})
        cuda.record(events["d2h"], streams["d2h_stream"])
        slot.pending = (tag, profile, shapes, action != LAUNCH)

    def _collect(self, s: int, consume: Callable[[Any, dict[str, np.ndarray]], Any] | None = None) -> tuple[Any, Any]:
        cudart = cuda_runtime()
        slot = self.slots[s]
        with self.host.stage("wait_gpu"):  # the collector thread waiting for the batch's compute and D2H copies
            cuda_check(cudart.cudaEventSynchronize(slot.events["d2h"]))
        done = time.perf_counter()
        tag, profile, shapes, not_replay = slot.pending
        slot.pending = None
        gpu_ms = self.cuda.elapsed_ms(slot.event_handles["start"], slot.event_handles["end"])
        if not_replay:  # after execution: activations and graphs are allocated by now (replays allocate nothing)
            self._note_memory()
        views = {name: slot.host[name].view(self.dtypes[name], shape) for name, shape in shapes.items()}
        if consume is not None:  # read straight out of pinned memory; the slot is reused once this returns
            outputs = consume(tag, views)
        else:
            with self.host.stage("copy_out"):  # pinned slot -> the batch's own arrays (the slot is reused)
                outputs = {name: view.copy() for name, view in views.items()}
        wall_ms = (done - self._last_done) * 1e3
        self._last_done = done
        self.timings.append(BatchTiming(profile, gpu_ms, wall_ms))
        return tag, outputs

    def run(self, feeds: dict[str, Any], profile: int | None = None) -> dict[str, np.ndarray]:
        return list(self.run_many([(None, feeds)], profile))[0][1]

    def run_many(
        self,
        batches: Iterable[tuple[Any, dict[str, Any]]],
        profile: int | None = None,
        consume: Callable[[Any, dict[str, np.ndarray]], Any] | None = None,
        place: Callable[[Any, dict[str, tuple[int, ...]]], dict[str, OutputCopies]] | None = None,
    ) -> Iterator[tuple[Any, Any]]:
        """Pipelined: yields (tag, outputs) in submission order. A feed may be an array or the list of its
        chunks' arrays (stacked in pinned memory). This thread only stages and submits; a collector
        thread waits for each batch and copies its outputs out of pinned memory, so up to `slots - 1`
        batches stay queued on the GPU meanwhile. A slot is restaged only once its batch was collected.
        With `consume`, the collector hands consume(tag, views of the pinned outputs) the batch instead of
        copying it (no copy, no fresh allocation per batch) and yields (tag, what consume returned); the
        views are valid until consume returns, or, where it returns a Future (work it handed to other threads),
        until that future is done: the slot is restaged only then, and its result is what is yielded. The
        collector then goes on to the next batch at once instead of waiting for that work.
        With `place`, place(tag, output shapes) says, on this thread before the batch's copies are queued, which
        outputs go elsewhere than the slot (OutputCopies); the views consume gets then hold only their slot_rows."""
        if place is not None and consume is None:
            raise ValueError("run_many: place needs consume (the yielded outputs would hold stale rows where copies went elsewhere)")
        try:
            yield from self._pipelined(batches, profile, consume, place)
        finally:  # a failed or abandoned loop: no copy may still be writing into memory the caller frees next
            cudart = cuda_runtime()
            for name in ("compute_stream", "h2d_stream", "d2h_stream"):
                cudart.cudaStreamSynchronize(getattr(self, name))

    def _pipelined(
        self, batches: Iterable[tuple[Any, dict[str, Any]]], profile: int | None, consume: Any, place: Any
    ) -> Iterator[tuple[Any, Any]]:
        n = len(self.slots)
        order: deque[tuple[int, Future]] = deque()  # (slot, collection) of batches not yet handed out
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trtforge-collect") as collector:
            for i, (tag, feeds) in enumerate(batches):
                s = i % n
                while any(slot == s for slot, _ in order):  # round robin: slot s holds the oldest batch
                    with self.host.stage("wait_slot"):  # the submitting thread blocked on the oldest batch (and its merge)
                        result = _released(order.popleft()[1])
                    yield result
                if i == 0:
                    self._last_done = time.perf_counter()  # the first batch's wall: from its submission
                with self.host.stage("submit"):
                    shapes = self.feed_shapes(feeds)
                    feeds, shapes, rows = self._padded(feeds, shapes, profile)
                    self._submit(s, feeds, self.profile_for(feeds, shapes) if profile is None else profile, tag, shapes, place, rows)
                order.append((s, collector.submit(self._collect, s, consume)))
                while order and _settled(order[0][1]):
                    yield _released(order.popleft()[1])
            while order:
                with self.host.stage("wait_slot"):  # the drain: the last batches, collected in order
                    result = _released(order.popleft()[1])
                yield result

    def _padded(
        self, feeds: dict[str, Any], shapes: dict[str, tuple[int, ...]], profile: int | None
    ) -> tuple[dict[str, Any], dict[str, tuple[int, ...]], int | None]:
        """The batch padded to the fewest rows that already ran at its other dims, with its own row count; unchanged
        (rows None) where none did, where the engine's I/O do not all lead with the batch axis (`_pads_rows`), where the
        caller chose the profile, or where the padded shape's outputs did not lead with those rows when it ran."""
        if not self._pads_rows or profile is not None or not shapes:
            return feeds, shapes, None
        own = next(iter(shapes.values()))[0]
        ran = self._batch_rows.setdefault(_after_batch(shapes), set())  # this batch's rows run either way: noted
        rows = padded_batch(shapes, ran)
        if rows is None:
            ran.add(own)
            return feeds, shapes, None
        padded = {name: (rows, *dims[1:]) for name, dims in shapes.items()}
        try:
            outputs = self._out_shapes.get((self.profile_for(feeds, padded), tuple(padded[n] for n in self.input_names)))
        except UserError:
            outputs = None
        if outputs is None or any(not dims or dims[0] != rows for dims in outputs.values()):
            ran.add(own)
            return feeds, shapes, None
        self.padding["batches"] += 1
        self.padding["rows"] += rows - own
        return {name: pad_rows(value, rows - own) for name, value in feeds.items()}, padded, own

    @staticmethod
    def _leads_with_batch(sidecar: dict[str, Any]) -> bool:
        """Whether every input's axis 0 is one named (batch) axis and every output's axis 0 is dynamic (the build's
        sidecar: its inputs' named shapes, its engine I/O shapes): only then do padding rows stay rows of their own."""
        specs = sidecar.get("inputs") or []
        io = sidecar.get("io") or []
        leading = {str(spec["shape"][0]) if spec.get("shape") and isinstance(spec["shape"][0], str) else None for spec in specs}
        outputs = [t for t in io if t.get("mode") == "output"]
        return (
            len(leading) == 1
            and None not in leading
            and bool(outputs)
            and all(t.get("shape") and int(t["shape"][0]) == -1 for t in outputs)
        )

    def close(self) -> None:
        cudart = cuda_runtime()
        for graph, exe in self.graphs.graphs.values():
            cudart.cudaGraphExecDestroy(exe)
            cudart.cudaGraphDestroy(graph)
        self.graphs.graphs.clear()
        self.contexts.clear()
        for slot in self.slots:
            for buf in list(slot.device.values()) + list(slot.host.values()):
                buf.free()
        if self._memory is not None:
            self._memory.free()
            self._memory = None


def _settled(collection: Future) -> bool:
    """A batch collected and, where consume handed its work on (a Future), that work done: its slot is free."""
    if not collection.done():
        return False
    if collection.exception() is not None:
        return True
    out = collection.result()[1]
    return not isinstance(out, Future) or out.done()


def _released(collection: Future) -> tuple[Any, Any]:
    """(tag, outputs) of a collected batch once its slot is free (consume's deferred work raised here)."""
    tag, out = collection.result()
    return tag, out.result() if isinstance(out, Future) else out


def _after_batch(shapes: dict[str, tuple[int, ...]]) -> tuple:
    """The inputs' dims after the batch axis: batches equal in them differ in rows only."""
    return tuple((name, tuple(dims[1:])) for name, dims in sorted(shapes.items()))


def pad_rows(value: Any, extra: int) -> list[Any]:
    """A feed (an array, or its chunks' parts) with `extra` copies of its last row after it, as parts to stack."""
    parts = list(value) if isinstance(value, (list, tuple)) else [value]
    last = np.asarray(parts[-1])[-1:]
    return parts + [np.broadcast_to(last, (extra, *last.shape[1:]))]


def _shape_of(value: Any) -> tuple[int, ...]:
    """Shape of a feed: an array, or a list of arrays stacked along axis 0."""
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, np.ndarray) for v in value):  # attribute reads: np.shape costs ~1 us per part
            return (sum(v.shape[0] for v in value), *value[0].shape[1:])
        first = np.shape(value[0])
        return (sum(int(np.shape(v)[0]) for v in value), *map(int, first[1:]))
    if isinstance(value, np.ndarray):
        return value.shape
    return tuple(int(d) for d in np.shape(value))
