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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trtforge.backends.base import TrtModule
from trtforge.backends.plugin_libraries import init_plugins
from trtforge.build.profiles import Profile
from trtforge.core import interrupts
from trtforge.core.errors import UserError

LAYER_LOG_HEADERS = ("Engine Layer Information:", "Layers:")  # where the verbose build log starts listing layers


def load_trt(backend: str = "auto") -> TrtModule:
    """`auto` prefers the full TensorRT, then TensorRT-RTX."""
    order = {
        "auto": ["tensorrt", "tensorrt_rtx"],
        "tensorrt": ["tensorrt"],
        "tensorrt_rtx": ["tensorrt_rtx"],
        "rtx": ["tensorrt_rtx"],
        "trt": ["tensorrt"],
    }.get(backend)
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


class Logger:
    """Collects TensorRT's messages so failures can be turned into one sentence.

    VERBOSE messages are dropped (8.6 logs every tactic timing) except the builder's per-layer report,
    which is the only place 8.6 states layer precisions for dynamic-shape engines."""

    def __init__(self, trt: Any):
        verbose = trt.ILogger.Severity.VERBOSE

        class Collector(trt.ILogger):
            def __init__(inner):
                trt.ILogger.__init__(inner)
                inner.messages: list[tuple[Any, str]] = []
                inner.layer_log: list[str] = []

            def log(inner, severity, msg):  # called from C++: runs inside interrupts.deferred(), so Ctrl-C cannot land here
                if severity != verbose:
                    inner.messages.append((severity, msg))
                elif msg.startswith(LAYER_LOG_HEADERS):
                    inner.layer_log.append(msg)

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
    fuse_attention: str = "auto"  # auto|on|off: trtforge.fusion's attention pass (auto: where this TensorRT runs it)
    fuse_gelu: str = "auto"  # auto|on|off: trtforge.fusion's bias+GELU pass (auto: TensorRT 8.x fp16 builds, measured faster)
    fuse_skip_layernorm: str = "auto"  # auto|on|off: residual add + LayerNorm as one plugin (auto: where measured faster)
    fuse_gemm: str = "auto"  # auto|on|off: the MatMuls left as TrtforgeGemm (cuBLASLt, timed; auto: fp16, measured faster)
    qkv_projection: str = "auto"  # auto|matmul|conv: the packed QKV projection (auto: matmul into TrtforgeGemm where it runs, else conv)
    plugin_libraries: list[str] = field(default_factory=list)  # shared libraries of plugin creators (libtrtforge_plugins.so)
    gemm_precision: str = "fp16"  # fp16|fp8: the GEMM plugins' arithmetic (fp8: TrtforgeGemmFp8, trtforge.fusion.fp8)
    fp8_min_cosine: float = 0.99  # fp8's gate on the engine against ONNX Runtime fp32 (held-out mean cosine)
    fp8_min_top1_agreement: float | None = None  # fp8's gate on logits outputs' top-1 agreement (None: reported only)
    calib_data: str | None = None  # real inputs for the fp16 magnitudes and FP8 scales (None: a cache's data, else random)
    fp8_chain_ffn: str = "auto"  # auto|on|off: with fp8, FC1 hands FC2 e4m3 bytes (trtforge.fusion.fp8.fp8_chains)


@dataclass
class BuildOutput:
    engine: bytes
    seconds: float
    io: list[dict[str, Any]]
    notes: list[str]
    timing_cache: bytes | None = None
    timing_cache_loaded: bool = False
    compute_capabilities: list[str] = field(default_factory=list)
    layer_log: str = ""  # the builder's VERBOSE per-layer report (see parse_layer_log)
    # TensorRT's own work before the build: the builder (CUDA context), the ONNX parser (plugin creation), the config
    parse_seconds: float = 0.0


def _parse(mod: TrtModule, onnx_path: Path, logger: Logger, node_names: list[tuple[str, str]]) -> tuple[Any, Any, Any]:
    trt = mod.trt
    builder = trt.Builder(logger.impl)
    if mod.flavour == "tensorrt_rtx":
        flags = 0
    elif mod.major >= 10:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    else:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    if mod.flavour == "tensorrt":
        init_plugins(mod)  # fused graphs hold plugin nodes the parser resolves from the registry
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


def _configure(
    mod: TrtModule, builder: Any, network: Any, options: BuildOptions, profiles: list[Profile], notes: list[str]
) -> tuple[Any, bool, list[str]]:
    config = builder.create_builder_config()
    _set_builder_flags(mod, config, options, notes)
    ccs = _set_compute_capabilities(mod, config, options, notes)
    loaded = _set_timing_cache(mod, config, options, notes)
    for profile in profiles:
        trt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            trt_profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(trt_profile)
    return config, loaded, ccs


def _set_builder_flags(mod: TrtModule, config: Any, options: BuildOptions, notes: list[str]) -> None:
    """Memory, optimization level, layer detail, precision flags (weakly typed TensorRT only), tactics, compatibility."""
    trt = mod.trt
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


def _set_compute_capabilities(mod: TrtModule, config: Any, options: BuildOptions, notes: list[str]) -> list[str]:
    """TensorRT-RTX's target GPUs (the one here, else SM89 with a note); TensorRT builds for the GPU here only."""
    trt = mod.trt
    ccs: list[str] = []
    if mod.flavour == "tensorrt_rtx":
        ccs = options.compute_capabilities or (["CURRENT"] if _rtx_runs_here() else ["SM89"])
        if not options.compute_capabilities and ccs == ["SM89"]:
            notes.append(
                "no GPU that TensorRT-RTX supports here and no compute capabilities given: built for SM89; pass --compute-capability"
            )
        config.num_compute_capabilities = len(ccs)
        for i, cc in enumerate(ccs):
            value = getattr(trt.ComputeCapability, cc.upper(), None)
            if value is None:
                valid = ", ".join(trt.ComputeCapability.__members__)
                raise UserError(f"unknown compute capability '{cc}' for TensorRT-RTX; valid: {valid}.")
            config.set_compute_capability(value, i)
    elif options.compute_capabilities:
        notes.append("compute capabilities apply to TensorRT-RTX only; ignored for TensorRT")
    return ccs


def _set_timing_cache(mod: TrtModule, config: Any, options: BuildOptions, notes: list[str]) -> bool:
    """The timing cache the build starts from and adds to (TensorRT only); True when a non-empty one was loaded."""
    loaded = False
    if options.timing_cache is not None:
        if mod.flavour == "tensorrt_rtx":
            notes.append("timing cache: TensorRT-RTX has none; --timing-cache is a no-op on this backend")
        else:
            blob = options.timing_cache.read_bytes() if options.timing_cache.is_file() else b""
            cache = config.create_timing_cache(blob)
            config.set_timing_cache(cache, ignore_mismatch=False)
            loaded = bool(blob)
    return loaded


PROFILE_PHASE = "Computing profile costs"  # TensorRT >= 10 / RTX: one run of steps per optimization profile


@dataclass
class BuildProgress:
    """What the builder has reported so far, read by the heartbeat thread. Fed by IProgressMonitor
    where it exists (TensorRT >= 10, TensorRT-RTX); on 8.6 only `profiles` and the clock are known."""

    profiles: int
    monitored: bool = False
    profile: int | None = None  # 1-based
    phases: list[list[Any]] = field(default_factory=list)  # open phases: [name, step done, steps]
    _profile_steps: int = 0

    def phase_start(self, name: str, steps: int) -> None:
        self.monitored = True
        if name == PROFILE_PHASE:
            self._profile_steps, self.profile = max(steps, 1), 1
        self.phases.append([name, 0, steps])

    def step_complete(self, name: str, step: int) -> None:
        if name == PROFILE_PHASE and self._profile_steps:
            self.profile = min(self.profiles, (step + 1) * self.profiles // self._profile_steps + 1)  # steps done -> next profile
        for phase in reversed(self.phases):
            if phase[0] == name:
                phase[1] = step + 1
                break

    def phase_finish(self, name: str) -> None:
        for i in range(len(self.phases) - 1, -1, -1):
            if self.phases[i][0] == name:
                del self.phases[i]
                break

    def describe(self) -> str:
        """'profile 2 of 4, Timing tactics 1/3', or what is known without a progress monitor."""
        if not self.monitored:
            return f"{self.profiles} profile(s); this TensorRT reports no per-profile progress"
        where = f"profile {self.profile} of {self.profiles}" if self.profile else f"{self.profiles} profile(s)"
        if self.phases:
            name, done, steps = self.phases[-1]
            where += f", {name} {done}/{steps}"
        return where


@contextlib.contextmanager
def _monitored(mod: TrtModule, config: Any, progress: BuildProgress):
    """A progress monitor (TensorRT >= 10, TensorRT-RTX) that feeds `progress` with phases and steps and
    cancels the build at its next step once Ctrl-C was pressed (the caller runs inside interrupts.deferred(),
    which turns SIGINT into a flag and raises it when TensorRT returns). 8.6 has no monitor: Ctrl-C then
    waits for the builder to return. Nothing is written either way."""
    trt = mod.trt
    if hasattr(trt, "IProgressMonitor") and hasattr(config, "progress_monitor"):

        class Monitor(trt.IProgressMonitor):
            def __init__(inner):
                trt.IProgressMonitor.__init__(inner)

            def phase_start(inner, phase_name, parent_phase, num_steps):
                progress.phase_start(phase_name, num_steps)

            def phase_finish(inner, phase_name):
                progress.phase_finish(phase_name)

            def step_complete(inner, phase_name, step):
                progress.step_complete(phase_name, step)
                return not interrupts.requested()

        config.progress_monitor = Monitor()
    yield


Tick = Callable[[float, BuildProgress], None]


@contextlib.contextmanager
def _heartbeat(progress: BuildProgress, on_tick: Tick | None, interval_s: float):
    """Calls on_tick(elapsed seconds, progress) every interval_s while the builder runs, so a long
    build is never silent (TensorRT 8.6 has no progress monitor: the clock is all there is)."""
    if on_tick is None:
        yield
        return
    stop = threading.Event()
    start = time.perf_counter()

    def beat() -> None:
        while not stop.wait(interval_s):
            on_tick(time.perf_counter() - start, progress)

    thread = threading.Thread(target=beat, name="trtforge-build-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _rtx_runs_here() -> bool:
    """A GPU that TensorRT-RTX supports is present (it refuses sm_90 H100/H200)."""
    from trtforge.core.platform import support_here

    return support_here()["tensorrt_rtx"][0]


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
    return {
        "FLOAT": "float32",
        "HALF": "float16",
        "INT8": "int8",
        "INT32": "int32",
        "INT64": "int64",
        "BOOL": "bool",
        "BF16": "bfloat16",
        "UINT8": "uint8",
    }.get(str(dtype).split(".")[-1], str(dtype))


def build_engine(
    mod: TrtModule, onnx_path: Path, profiles: list[Profile], options: BuildOptions, on_tick: Tick | None = None, tick_s: float = 15.0
) -> BuildOutput:
    """Parse, configure and build; a failed build is retried per profile to name the one that fails.
    on_tick(elapsed, progress) is called every tick_s seconds while TensorRT builds."""
    import onnx

    node_names = [(n.name, n.op_type) for n in onnx.load(str(onnx_path), load_external_data=False).graph.node]
    with interrupts.deferred():  # TensorRT swallows a KeyboardInterrupt raised in its callbacks
        return _build_engine(mod, onnx_path, profiles, options, on_tick, tick_s, node_names)


def _build_engine(
    mod: TrtModule,
    onnx_path: Path,
    profiles: list[Profile],
    options: BuildOptions,
    on_tick: Tick | None,
    tick_s: float,
    node_names: list[tuple[str, str]],
) -> BuildOutput:
    logger = Logger(mod.trt)
    notes: list[str] = []
    parse_start = time.perf_counter()
    builder, network, _parser = _parse(mod, onnx_path, logger, node_names)
    interrupts.check()
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
    parse_seconds = start - parse_start
    progress = BuildProgress(len(profiles))
    interrupts.check()
    with _monitored(mod, config, progress), _heartbeat(progress, on_tick, tick_s):
        serialized = builder.build_serialized_network(network, config)
    interrupts.check()  # a cancelled build returns None: that is Ctrl-C, not a failed build
    seconds = time.perf_counter() - start
    if serialized is None:
        raise UserError(_explain_build_failure(mod, onnx_path, profiles, options, logger, node_names))
    timing = None
    if options.timing_cache is not None and mod.flavour != "tensorrt_rtx":
        timing = bytes(config.get_timing_cache().serialize())
    layer_log = "\n".join(logger.impl.layer_log)
    return BuildOutput(bytes(serialized), seconds, _io_of(network), notes, timing, cache_loaded, ccs, layer_log, parse_seconds)


_LAYER_RE = re.compile(r"\bI\w+Layer ([^\s:]+)")
_TENSOR_RE = re.compile(r"tensor:? '?([^\s':]+)")


def _explain_build_failure(
    mod: TrtModule, onnx_path: Path, profiles: list[Profile], options: BuildOptions, logger: Logger, node_names: list[tuple[str, str]]
) -> str:
    first = shorten(logger.errors()[0]) if logger.errors() else "the builder returned no engine"
    if len(profiles) > 1:
        for profile in profiles:  # rebuild each profile alone: which one breaks?
            interrupts.check()
            single = Logger(mod.trt)
            builder, network, _ = _parse(mod, onnx_path, single, node_names)
            config, _, _ = _configure(mod, builder, network, options, [profile], [])
            with _monitored(mod, config, BuildProgress(1)):  # Ctrl-C cancels these rebuilds too (TensorRT >= 10, RTX)
                rebuilt = builder.build_serialized_network(network, config)
            interrupts.check()  # a cancelled rebuild is Ctrl-C, not the failing profile
            if rebuilt is None:
                msg = shorten(single.errors()[0]) if single.errors() else first
                return _sentence(profile, msg)
    return _sentence(profiles[0], first) if len(profiles) == 1 else f"the engine build failed: {first}"


def _sentence(profile: Profile, message: str) -> str:
    layer, tensor = _LAYER_RE.search(message), _TENSOR_RE.search(message)
    where = "".join([f", layer '{layer.group(1)}'" if layer else "", f", tensor '{tensor.group(1)}'" if tensor else ""])
    return (
        f"the engine build failed for profile {profile.index} ({profile.describe()}){where}: {message}; "
        "if the exporter baked a size into a reshape, re-export with --exporter dynamo, else narrow the profile."
    )


def shorten(message: str) -> str:
    return " ".join(message.split())[:400]
