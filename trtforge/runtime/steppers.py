"""The two steppers a stateful run drives: one step of a KV-cache model on ONNX Runtime or on a TensorRT engine, the cache kept between steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trtforge.backends.base import RunnerLifecycle
from trtforge.core.errors import UserError


def cache_plan(layout: dict[str, Any], max_past: int, max_seq: int, itemsize: int, batch: int = 1) -> dict[str, Any]:
    """Device memory for the double-buffered cache: 2 buffers per past/present tensor, each holding the
    largest present (past max + seq max) of the profiles in use."""
    max_total = max_past + max_seq
    per = batch * layout["kv_heads"] * max_total * layout["head_dim"] * itemsize
    tensors = 2 * layout["layers"]
    return {"max_total": max_total, "bytes_per_buffer": per, "tensors": tensors, "buffers_per_tensor": 2, "total_bytes": 2 * tensors * per}


def ping_pong(step_index: int) -> tuple[int, int]:
    """(buffer read as past, buffer written as present) for step i."""
    return step_index % 2, (step_index + 1) % 2


class StepperRunner(RunnerLifecycle):
    """What both steppers give the Runner protocol: input_ids in, the logits output of one pass per row out."""

    output: str

    def full(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @property
    def input_names(self) -> list[str]:
        return ["input_ids"]

    @property
    def output_names(self) -> list[str]:
        return [self.output]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each row of input_ids in one pass from an empty cache (positions from 0)."""
        return {self.output: np.stack([self.full(np.asarray(row)) for row in feeds["input_ids"]])}


class OrtStepper(StepperRunner):
    """A KV-cache ONNX on ONNX Runtime; the cache lives in OrtValues bound through IOBinding."""

    backend = "onnxruntime"

    def __init__(self, path: Path, layout: dict[str, Any], providers: list[str] | None = None):
        import onnxruntime as ort

        from trtforge.backends.onnxruntime import session_options

        options = session_options()  # Q/DQ as written (see there)
        options.enable_cpu_mem_arena = False  # memory returns to the OS after a run, so peaks per phase compare
        wanted = [p for p in (providers or ["CPUExecutionProvider"]) if p in ort.get_available_providers()] or ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(path), options, providers=wanted)
        except Exception as exc:
            raise UserError(f"ONNX Runtime cannot load {Path(path).name}: {str(exc).strip().splitlines()[0][:300]}") from None
        self.providers = self.session.get_providers()
        self.device = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        self.layout = layout
        self.past_names = [p.format(i) for i in range(layout["layers"]) for p in ("past_key_{}", "past_value_{}")]
        self.present_names = [p.format(i) for i in range(layout["layers"]) for p in ("present_key_{}", "present_value_{}")]
        self.output = layout["output"]
        self.peak_bytes = 0
        self.reset()

    def reset(self) -> None:
        import onnxruntime as ort

        empty = np.zeros((1, self.layout["kv_heads"], 0, self.layout["head_dim"]), dtype=np.float32)
        self.cache = [ort.OrtValue.ortvalue_from_numpy(empty, self.device) for _ in self.past_names]

    def step(self, ids: np.ndarray, past: int, profile: int | None = None) -> np.ndarray:
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids[None, :].astype(np.int64))
        binding.bind_cpu_input("position_ids", np.arange(past, past + ids.size, dtype=np.int64)[None, :])
        for name, value in zip(self.past_names, self.cache):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(self.output, "cpu")
        for name in self.present_names:
            binding.bind_output(name, self.device)
        self.session.run_with_iobinding(binding)
        outs = binding.get_outputs()
        self.cache = list(outs[1:])
        return outs[0].numpy()[0]

    def full(self, ids: np.ndarray) -> np.ndarray:
        """One pass over the whole input with an empty cache."""
        self.reset()
        out = self.step(ids, 0)
        self.reset()
        return out

    def close(self) -> None:
        self.cache = []


class TrtStepper(StepperRunner):
    """A KV-cache engine on TensorRT: one context per profile, the cache in two device buffers per
    tensor that swap roles every step (see the module doc)."""

    backend = "tensorrt"

    def __init__(self, mod: Any, engine_path: Path, sidecar: dict[str, Any], layout: dict[str, Any]):
        from trtforge.backends.cuda_memory import DeviceBuffer, PinnedBuffer, cuda_check, cuda_runtime
        from trtforge.build.profiles import profiles_from_json

        self.mod, self.trt, self.layout = mod, mod.trt, layout
        cudart = cuda_runtime()
        self.cuda_check, self._cudart = cuda_check, cudart
        self.free_before = cuda_check(cudart.cudaMemGetInfo())[0]
        from trtforge.backends.plugin_libraries import load_engine_plugin_libraries

        load_engine_plugin_libraries(mod, sidecar, engine_path)
        self.runtime = self.trt.Runtime(self.trt.Logger(self.trt.Logger.ERROR))
        self.engine = self.runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise UserError(f"engine {engine_path} is truncated or corrupt (TensorRT could not load it); rebuild it with trtforge build.")
        self.profiles = profiles_from_json(sidecar["profiles"])
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.dtypes = {n: np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.past_names = [p.format(i) for i in range(layout["layers"]) for p in ("past_key_{}", "past_value_{}")]
        self.present_names = [p.format(i) for i in range(layout["layers"]) for p in ("present_key_{}", "present_value_{}")]
        self.output = layout["output"]
        self.stream = cuda_check(cudart.cudaStreamCreate())
        self.contexts: dict[int, Any] = {}
        seq_axis, past_axis = sidecar["phases"]["seq_axis"], sidecar["phases"]["past_axis"]
        max_seq = max(p.axes[seq_axis].max for p in self.profiles)
        max_past = max(p.axes[past_axis].max for p in self.profiles)
        self.plan = cache_plan(layout, max_past, max_seq, self.dtypes[self.past_names[0]].itemsize)
        self.cache = [[DeviceBuffer(self.plan["bytes_per_buffer"]) for _ in self.past_names] for _ in range(2)]
        out_width = int(self.engine.get_tensor_shape(self.output)[-1])
        self.out_bytes = max_seq * out_width * self.dtypes[self.output].itemsize
        self.bufs = {
            "input_ids": DeviceBuffer(max_seq * 8),
            "position_ids": DeviceBuffer(max_seq * 8),
            self.output: DeviceBuffer(self.out_bytes),
        }
        self.host = {
            "input_ids": PinnedBuffer(max_seq * 8),
            "position_ids": PinnedBuffer(max_seq * 8),
            self.output: PinnedBuffer(self.out_bytes),
        }
        self.index = 0  # steps since reset: which buffer holds the past
        self.peak_bytes = 0
        self._note()

    def _note(self) -> None:
        free = self.cuda_check(self._cudart.cudaMemGetInfo())[0]
        self.peak_bytes = max(self.peak_bytes, int(self.free_before - free))

    def _context(self, profile: int) -> Any:
        from trtforge.backends.cuda_memory import cuda_handle

        if profile not in self.contexts:
            ctx = self.engine.create_execution_context()
            if ctx is None:
                raise RuntimeError(f"TensorRT could not create an execution context for profile {profile} (out of GPU memory?)")
            ctx.set_optimization_profile_async(profile, cuda_handle(self.stream))
            self.cuda_check(self._cudart.cudaStreamSynchronize(self.stream))
            self.contexts[profile] = ctx
            self._note()
        return self.contexts[profile]

    def reset(self) -> None:
        self.index = 0

    def step(self, ids: np.ndarray, past: int, profile: int | None = None) -> np.ndarray:
        from trtforge.backends.cuda_memory import cuda_handle

        cudart, ok = self._cudart, self.cuda_check
        if profile is None:
            raise RuntimeError("a TensorRT step needs its profile (select_phase_profile)")
        ctx = self._context(profile)
        seq = int(ids.size)
        src, dst = ping_pong(self.index)
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        feeds = {
            "input_ids": ids.astype(self.dtypes["input_ids"]),
            "position_ids": np.arange(past, past + seq).astype(self.dtypes["position_ids"]),
        }
        for name, array in feeds.items():
            self.host[name].view(array.dtype, array.shape)[...] = array
            ok(cudart.cudaMemcpyAsync(self.bufs[name].ptr, self.host[name].ptr, array.nbytes, h2d, self.stream))
            ctx.set_input_shape(name, (1, seq))
            ctx.set_tensor_address(name, self.bufs[name].ptr)
        shape = (1, self.layout["kv_heads"], past, self.layout["head_dim"])
        for i, (pname, qname) in enumerate(zip(self.past_names, self.present_names)):
            if not ctx.set_input_shape(pname, shape):
                raise UserError(f"input '{pname}' shape {list(shape)} is outside profile {profile}; rebuild with wider past tiers.")
            ctx.set_tensor_address(pname, self.cache[src][i].ptr)
            ctx.set_tensor_address(qname, self.cache[dst][i].ptr)
        ctx.set_tensor_address(self.output, self.bufs[self.output].ptr)
        out_shape = tuple(ctx.get_tensor_shape(self.output))
        if not ctx.execute_async_v3(cuda_handle(self.stream)):
            raise RuntimeError(f"TensorRT execution failed on profile {profile}")
        nbytes = int(np.prod(out_shape)) * self.dtypes[self.output].itemsize
        ok(cudart.cudaMemcpyAsync(self.host[self.output].ptr, self.bufs[self.output].ptr, nbytes, d2h, self.stream))
        ok(cudart.cudaStreamSynchronize(self.stream))
        self.index += 1
        if self.index <= 2:
            self._note()
        return self.host[self.output].view(self.dtypes[self.output], out_shape)[0].astype(np.float32)

    def full(self, ids: np.ndarray, profile: int | None = None) -> np.ndarray:
        self.reset()
        out = self.step(ids, 0, profile)
        self.reset()
        return out

    def close(self) -> None:
        for buf in [b for slot in self.cache for b in slot] + list(self.bufs.values()) + list(self.host.values()):
            buf.free()
        self.contexts.clear()
        self.cache, self.bufs, self.host = [], {}, {}


# -- the run ---------------------------------------------------------------------------------------
