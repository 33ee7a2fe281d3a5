"""The only module that imports TensorRT: building, inspecting and loading engines.

One code path serves TensorRT 8.6, 10, 11 and TensorRT-RTX through small version adapters:
- TensorRT >= 10 and TensorRT-RTX build strongly typed networks: precision comes from the ONNX (fp16
  tensors, Q/DQ nodes), and the FP16/INT8 builder flags no longer exist (removed in 11).
- TensorRT 8.6 is weakly typed: it needs EXPLICIT_BATCH, and the FP16/INT8 flags set when the ONNX holds
  fp16 tensors or Q/DQ nodes, else it would run them in fp32.
- TensorRT-RTX has no timing cache (building is a no-op for it) and targets compute capabilities chosen
  at build time, which is what lets it build on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.errors import UserError
from trtforge.profiles import Profile


@dataclass
class TrtModule:
    trt: Any
    flavour: str  # "tensorrt" | "tensorrt_rtx"
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def strongly_typed(self) -> bool:
        return self.flavour == "tensorrt_rtx" or self.major >= 10

    @property
    def label(self) -> str:
        return f"{self.flavour} {self.version}"


def load_trt(backend: str = "auto") -> TrtModule:
    """`auto` prefers the full TensorRT, then TensorRT-RTX."""
    order = {"auto": ["tensorrt", "tensorrt_rtx"], "tensorrt": ["tensorrt"], "tensorrt_rtx": ["tensorrt_rtx"],
             "rtx": ["tensorrt_rtx"], "trt": ["tensorrt"]}.get(backend)
    if order is None:
        raise UserError(f"unknown backend '{backend}'; use auto, tensorrt or tensorrt_rtx.")
    for name in order:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        if not hasattr(module, "Builder"):  # the PyPI 'tensorrt' stub without libraries
            continue
        return TrtModule(module, name, str(module.__version__))
    wanted = " or ".join(order)
    raise UserError(f"{wanted} is not installed; `pip install tensorrt-rtx` builds engines without a GPU (extra 'rtx').")


class _Logger:
    """Collects TensorRT's messages so failures can be turned into one sentence."""

    def __init__(self, trt: Any, verbose: bool = False):
        class Collector(trt.ILogger):
            def __init__(inner):
                trt.ILogger.__init__(inner)
                inner.messages: list[tuple[Any, str]] = []

            def log(inner, severity, msg):
                inner.messages.append((severity, msg))

        self.impl = Collector()
        self.trt = trt

    def errors(self) -> list[str]:
        sev = self.trt.ILogger.Severity
        return [m for s, m in self.impl.messages if s in (sev.ERROR, sev.INTERNAL_ERROR)]

    def warnings(self) -> list[str]:
        return [m for s, m in self.impl.messages if s == self.trt.ILogger.Severity.WARNING]


@dataclass
class BuildOptions:
    workspace_mb: int | None = None
    optimization_level: int | None = None
    timing_cache: Path | None = None
    tactic_sources: str | None = None
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    compute_capabilities: list[str] = field(default_factory=list)
    has_fp16: bool = False
    has_qdq: bool = False
    tf32: bool = False  # off: 'fp32' means IEEE fp32 (TensorRT turns TF32 on by default)


@dataclass
class BuildOutput:
    engine: bytes
    seconds: float
    io: list[dict[str, Any]]
    notes: list[str]
    timing_cache: bytes | None = None
    timing_cache_loaded: bool = False
    compute_capabilities: list[str] = field(default_factory=list)


def _parse(mod: TrtModule, onnx_path: Path, logger: _Logger, node_names: list[tuple[str, str]]) -> tuple[Any, Any, Any]:
    trt = mod.trt
    builder = trt.Builder(logger.impl)
    if mod.flavour == "tensorrt_rtx":
        flags = 0
    elif mod.major >= 10:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    else:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger.impl)
    if not parser.parse_from_file(str(onnx_path)):
        problems = []
        for i in range(parser.num_errors):
            err = parser.get_error(i)
            index = err.node()
            name = err.node_name() if hasattr(err, "node_name") else (node_names[index][0] if 0 <= index < len(node_names) else "?")
            op = err.node_operator() if hasattr(err, "node_operator") else (node_names[index][1] if 0 <= index < len(node_names) else "?")
            problems.append(f"node '{name}' ({op}): {err.desc()}")
        detail = "; ".join(problems) or "; ".join(logger.errors()) or "unknown parser error"
        raise UserError(f"the {mod.label} ONNX parser rejected {onnx_path.name}: {detail[:600]}")
    return builder, network, parser


def _tactic_mask(trt: Any, spec: str, default: int) -> int:
    """'-CUBLAS,-CUBLAS_LT,+CUDNN' relative to the default sources, as trtexec --tacticSources."""
    mask = default
    for item in filter(None, (s.strip() for s in spec.split(","))):
        sign, name = (item[0], item[1:]) if item[0] in "+-" else ("+", item)
        source = getattr(trt.TacticSource, name.upper(), None)
        if source is None:
            valid = ", ".join(trt.TacticSource.__members__)
            raise UserError(f"unknown tactic source '{name}'; valid: {valid}.")
        bit = 1 << int(source)
        mask = mask | bit if sign == "+" else mask & ~bit
    return mask


def _configure(mod: TrtModule, builder: Any, network: Any, options: BuildOptions, profiles: list[Profile],
               notes: list[str]) -> tuple[Any, bool, list[str]]:
    trt = mod.trt
    config = builder.create_builder_config()
    if options.workspace_mb:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mb * 1024 * 1024)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    if hasattr(trt, "ProfilingVerbosity"):
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if hasattr(trt.BuilderFlag, "TF32"):
        if options.tf32:
            config.set_flag(trt.BuilderFlag.TF32)
        else:
            config.clear_flag(trt.BuilderFlag.TF32)
    if not mod.strongly_typed:
        if options.has_fp16:
            config.set_flag(trt.BuilderFlag.FP16)
            notes.append("TensorRT 8.6 is weakly typed: FP16 flag set because the ONNX holds fp16 tensors")
        if options.has_qdq:
            config.set_flag(trt.BuilderFlag.INT8)
            notes.append("TensorRT 8.6 is weakly typed: INT8 flag set because the ONNX holds Q/DQ nodes")
    if options.tactic_sources:
        config.set_tactic_sources(_tactic_mask(trt, options.tactic_sources, config.get_tactic_sources()))
    if options.hardware_compatibility != "none":
        level = getattr(trt.HardwareCompatibilityLevel, options.hardware_compatibility.upper())
        config.hardware_compatibility_level = level
    if options.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    ccs: list[str] = []
    if mod.flavour == "tensorrt_rtx":
        ccs = options.compute_capabilities or (["CURRENT"] if _gpu_present() else ["SM89"])
        if not options.compute_capabilities and ccs == ["SM89"]:
            notes.append("no GPU here and no compute capabilities given: built for SM89; pass --compute-capability")
        config.num_compute_capabilities = len(ccs)
        for i, cc in enumerate(ccs):
            value = getattr(trt.ComputeCapability, cc.upper(), None)
            if value is None:
                valid = ", ".join(trt.ComputeCapability.__members__)
                raise UserError(f"unknown compute capability '{cc}' for TensorRT-RTX; valid: {valid}.")
            config.set_compute_capability(value, i)
    elif options.compute_capabilities:
        notes.append("compute capabilities apply to TensorRT-RTX only; ignored for TensorRT")
    loaded = False
    if options.timing_cache is not None:
        if mod.flavour == "tensorrt_rtx":
            notes.append("timing cache: TensorRT-RTX has none; --timing-cache is a no-op on this backend")
        else:
            blob = options.timing_cache.read_bytes() if options.timing_cache.is_file() else b""
            cache = config.create_timing_cache(blob)
            config.set_timing_cache(cache, ignore_mismatch=False)
            loaded = bool(blob)
    for profile in profiles:
        trt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            trt_profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(trt_profile)
    return config, loaded, ccs


@contextlib.contextmanager
def _interruptible(mod: TrtModule, config: Any):
    """Ctrl-C during a build: TensorRT swallows exceptions raised in its callbacks, so SIGINT only sets a
    flag; a progress monitor (TensorRT >= 10, TensorRT-RTX) then cancels the build at its next step, and
    the caller raises KeyboardInterrupt once the builder returns. Nothing is written either way."""
    flag = {"set": False}
    previous = None
    if threading.current_thread() is threading.main_thread():
        def on_sigint(_signum, _frame):
            flag["set"] = True

        previous = signal.signal(signal.SIGINT, on_sigint)
    trt = mod.trt
    if hasattr(trt, "IProgressMonitor") and hasattr(config, "progress_monitor"):
        class Cancel(trt.IProgressMonitor):
            def __init__(inner):
                trt.IProgressMonitor.__init__(inner)

            def phase_start(inner, phase_name, parent_phase, num_steps):
                pass

            def phase_finish(inner, phase_name):
                pass

            def step_complete(inner, phase_name, step):
                return not flag["set"]

        config.progress_monitor = Cancel()
    try:
        yield lambda: flag["set"]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _gpu_present() -> bool:
    from trtforge.doctor import _gpu

    return _gpu() is not None


def _io_of(network: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(network.num_inputs):
        t = network.get_input(i)
        out.append({"name": t.name, "mode": "input", "dtype": _dtype_name(t.dtype), "shape": list(t.shape)})
    for i in range(network.num_outputs):
        t = network.get_output(i)
        out.append({"name": t.name, "mode": "output", "dtype": _dtype_name(t.dtype), "shape": list(t.shape)})
    return out


def _dtype_name(dtype: Any) -> str:
    return {"FLOAT": "float32", "HALF": "float16", "INT8": "int8", "INT32": "int32", "INT64": "int64",
            "BOOL": "bool", "BF16": "bfloat16", "UINT8": "uint8"}.get(str(dtype).split(".")[-1], str(dtype))


def build_engine(mod: TrtModule, onnx_path: Path, profiles: list[Profile], options: BuildOptions) -> BuildOutput:
    """Parse, configure and build; a failed build is retried per profile to name the one that fails."""
    import onnx

    node_names = [(n.name, n.op_type) for n in onnx.load(str(onnx_path), load_external_data=False).graph.node]
    logger = _Logger(mod.trt)
    notes: list[str] = []
    builder, network, _parser = _parse(mod, onnx_path, logger, node_names)
    known = {network.get_input(i).name for i in range(network.num_inputs)}
    for profile in profiles:
        missing = known - set(profile.shapes)
        extra = set(profile.shapes) - known
        if missing or extra:
            raise UserError(
                f"profile {profile.index} names inputs {sorted(profile.shapes)} but {onnx_path.name} has {sorted(known)}; "
                "fix the input names in the config."
            )
    config, cache_loaded, ccs = _configure(mod, builder, network, options, profiles, notes)
    start = time.perf_counter()
    with _interruptible(mod, config) as interrupted:
        serialized = builder.build_serialized_network(network, config)
    if interrupted():
        raise KeyboardInterrupt
    seconds = time.perf_counter() - start
    if serialized is None:
        raise UserError(_explain_build_failure(mod, onnx_path, profiles, options, logger, node_names))
    timing = None
    if options.timing_cache is not None and mod.flavour != "tensorrt_rtx":
        timing = bytes(config.get_timing_cache().serialize())
    return BuildOutput(bytes(serialized), seconds, _io_of(network), notes, timing, cache_loaded, ccs)


_LAYER_RE = re.compile(r"\bI\w+Layer ([^\s:]+)")
_TENSOR_RE = re.compile(r"tensor:? '?([^\s':]+)")


def _explain_build_failure(mod: TrtModule, onnx_path: Path, profiles: list[Profile], options: BuildOptions,
                           logger: _Logger, node_names: list[tuple[str, str]]) -> str:
    first = _shorten(logger.errors()[0]) if logger.errors() else "the builder returned no engine"
    if len(profiles) > 1:
        for profile in profiles:  # rebuild each profile alone: which one breaks?
            single = _Logger(mod.trt)
            builder, network, _ = _parse(mod, onnx_path, single, node_names)
            config, _, _ = _configure(mod, builder, network, options, [profile], [])
            if builder.build_serialized_network(network, config) is None:
                msg = _shorten(single.errors()[0]) if single.errors() else first
                return _sentence(profile, msg)
    return _sentence(profiles[0], first) if len(profiles) == 1 else f"the engine build failed: {first}"


def _sentence(profile: Profile, message: str) -> str:
    layer, tensor = _LAYER_RE.search(message), _TENSOR_RE.search(message)
    where = "".join([f", layer '{layer.group(1)}'" if layer else "", f", tensor '{tensor.group(1)}'" if tensor else ""])
    return (f"the engine build failed for profile {profile.index} ({profile.describe()}){where}: {message}; "
            "if the exporter baked a size into a reshape, re-export with --exporter dynamo, else narrow the profile.")


def _shorten(message: str) -> str:
    return " ".join(message.split())[:400]


def engine_layers(mod: TrtModule, engine_bytes: bytes, profile: Profile | None = None) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Layer information (DETAILED) from the engine inspector, or (None, why) where it cannot load.

    With dynamic shapes, formats and precisions are only known for concrete shapes: an execution
    context set to `profile`'s opt shapes is handed to the inspector."""
    import json

    trt = mod.trt
    logger = _Logger(trt)
    try:
        runtime = trt.Runtime(logger.impl)
        engine = runtime.deserialize_cuda_engine(engine_bytes)
    except Exception as exc:
        return None, f"cannot deserialize here: {exc}"
    if engine is None:
        why = _shorten(logger.errors()[0]) if logger.errors() else "deserialization returned None"
        return None, f"cannot deserialize here ({why})"
    inspector = engine.create_engine_inspector()
    context = None
    context_error = None
    if profile is not None:
        try:
            context = engine.create_execution_context()
            for name, (_lo, opt, _hi) in profile.shapes.items():
                context.set_input_shape(name, opt)
            inspector.execution_context = context
        except Exception as exc:  # formats then stay "N/A due to dynamic shapes"; say why
            context, context_error = None, f"{type(exc).__name__}: {exc}"
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    layers = info.get("Layers", [])
    return [layer if isinstance(layer, dict) else {"Name": layer} for layer in layers], context_error


def summarize_layers(layers: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Counts of layers by type and by output precision (pure, from inspector JSON)."""
    by_type: dict[str, int] = {}
    by_precision: dict[str, int] = {}
    for layer in layers:
        kind = str(layer.get("LayerType", "Unknown"))
        by_type[kind] = by_type.get(kind, 0) + 1
        outputs = layer.get("Outputs") or []
        fmt = str(outputs[0].get("Format/Datatype", "?")) if outputs and isinstance(outputs[0], dict) else "?"
        precision = next((p for p in ("Int8", "Half", "Float", "Int32", "Int64", "BFloat16", "FP8") if p.lower() in fmt.lower()), fmt)
        by_precision[precision] = by_precision.get(precision, 0) + 1
    return {"by_type": by_type, "by_precision": by_precision}


def runtime_identity(mod: TrtModule) -> dict[str, Any]:
    from trtforge.doctor import _gpu

    gpu = _gpu()
    return {"backend": mod.flavour, "version": mod.version, "gpu": gpu["name"] if gpu else None,
            "compute_capability": gpu["compute_capability"] if gpu else None}


def numpy_dtype(name: str) -> np.dtype:
    return np.dtype({"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64,
                     "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}[name])
