"""`trtforge build`: ONNX -> TensorRT engine + sidecar, with tiered profiles and a chosen precision.

Precision lives in the ONNX (strongly typed builds): fp16 converts the model first (precision.py),
int8 takes the Q/DQ model from `calibrate`, best converts a Q/DQ model's remaining float parts to fp16.
The exact ONNX an engine was built from is kept beside it as ENGINE_STEM.onnx when it differs from
the input.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import onnx

from trtforge.backends.engine_layers import runtime_identity
from trtforge.backends.tensorrt import BuildOptions, BuildOutput, Tick, TrtModule, build_engine, load_trt
from trtforge.build.clock import TENSORRT_LAP, BuildClock
from trtforge.build.engine_record import engine_sidecar, layer_info, stderr_warning
from trtforge.build.passes import attention_evidence, fuse_attention, fuse_elementwise, gemm_fp8, shared_observation
from trtforge.build.profiles import Profile, plan_profiles, slow_build_warning
from trtforge.build.tiers import parse_tiers, read_lengths
from trtforge.core import interrupts
from trtforge.core.artifacts import (
    ensure_writable_dir,
    lineage,
    onnx_graph_hash,
    output_lock,
    publish,
    read_sidecar,
    refuse_overwrite,
    write_bytes_atomic,
    write_sidecar,
)
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError
from trtforge.core.onnxio import load_onnx, save_onnx
from trtforge.fusion.step import ELEMENTWISE_PASSES, ElementwisePass
from trtforge.graph.index import io_specs

PRECISIONS = ("fp32", "fp16", "int8", "best")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class BuildResult:
    engine_path: Path
    sidecar: dict[str, Any]
    profiles: list[Profile]
    layer_summary: dict[str, Any] | None


def options_from_config(section: Any, **given: Any) -> BuildOptions:
    """BuildOptions from a config's `build` section, where each keyword the caller gives (not None) takes its key's
    place. The CLI and `pipeline` both build through it, so a config key cannot be honoured by one and dropped by the
    other (pipeline dropped build.gemm_precision before)."""
    from dataclasses import fields

    keys = {f.name for f in fields(BuildOptions)} & set(type(section).model_fields)
    values = {key: getattr(section, key) for key in keys}
    values.update({key: value for key, value in given.items() if value is not None})
    for key in ("fp8_min_cosine", "fp8_min_top1_agreement"):
        if values.get("gemm_precision") != "fp8" and (
            given.get(key) is not None or (key in section.model_fields_set and getattr(section, key) is not None)
        ):
            raise _fp8_only(key)
    if values.get("timing_cache") is not None:
        values["timing_cache"] = Path(values["timing_cache"])
    for key in ("compute_capabilities", "plugin_libraries"):
        values[key] = list(values[key])
    return BuildOptions(**values)


def _fp8_only(key: str) -> UserError:
    """An FP8 gate asked for on a build without FP8 GEMMs (it would gate nothing)."""
    return UserError(
        f"--{key.replace('_', '-')} (config key build.{key}) gates FP8 GEMMs; build with --gemm-precision fp8 too, or leave it out."
    )


def model_traits(model: onnx.ModelProto) -> tuple[bool, bool]:
    """(holds fp16 tensors, holds Q/DQ nodes)."""
    has_qdq = any(n.op_type in QDQ_OPS for n in model.graph.node)
    fp16 = onnx.TensorProto.FLOAT16
    has_fp16 = any(t.data_type == fp16 for t in model.graph.initializer) or any(
        n.op_type == "Cast" and any(a.name == "to" and a.i == fp16 for a in n.attribute) for n in model.graph.node
    )
    return has_fp16, has_qdq


def default_engine_path(onnx_path: Path, precision: str) -> Path:
    stem = onnx_path.name.removesuffix(".onnx")
    if precision not in stem.split("."):
        stem = f"{stem}.{precision}"
    return onnx_path.with_name(stem + ".engine")


def _require_logits(onnx_path: Path) -> None:
    """--fp8-min-top1-agreement judges logits outputs: refused up front where the model declares none."""
    from trtforge.core.artifacts import declared_output_kinds

    kinds = declared_output_kinds(onnx_path)
    if "logits" not in kinds.values():
        named = ", ".join(f"{n} ({k or 'kind unknown'})" for n, k in kinds.items()) or "none declared"
        raise UserError(
            f"--fp8-min-top1-agreement (config key build.fp8_min_top1_agreement) judges logits outputs, and "
            f"{onnx_path.name} declares none (outputs: {named}); declare the kind in the config's `outputs` "
            "and export again, or leave the gate out."
        )


def _require_real_inputs(onnx_path: Path, model: onnx.ModelProto) -> None:
    """--fp8-min-top1-agreement is judged on real inputs only: random ones give a classifier nearly flat logits, whose
    top-1 any rounding flips, so a gate on them would fail on noise."""
    from trtforge.build.precision import calibration_data_of

    if calibration_data_of(onnx_path, model) is None:
        raise UserError(
            f"--fp8-min-top1-agreement (config key build.fp8_min_top1_agreement) is judged on real inputs, and "
            f"{onnx_path.name} has none: give --calib-data DIR (config key build.calib_data), or calibrate it first."
        )


def _prepare_precision(
    model: onnx.ModelProto, precision: str, onnx_path: Path, specs: list[InputSpec], axes: dict[str, AxisRange], data: Path | None = None
) -> tuple[onnx.ModelProto | None, dict[str, Any], Any]:
    """The model to build (None: the input as it is), what was done to it, and the sample feeds with their source
    (None for fp32 / int8), which the FP8 step reuses rather than reading and tokenizing the data again."""
    from trtforge.build.precision import prepare_for_build, sample_feeds

    has_fp16, has_qdq = model_traits(model)
    if precision in ("fp32", "fp16") and has_qdq:
        raise UserError(f"{onnx_path.name} holds Q/DQ nodes (an INT8 model); build it with --precision int8 or best.")
    if precision in ("int8", "best") and not has_qdq:
        raise UserError(f"{onnx_path.name} has no Q/DQ nodes; run `trtforge calibrate` first and build its .int8.onnx.")
    if precision == "fp32" and has_fp16:
        raise UserError(f"{onnx_path.name} already holds fp16 tensors; build it with --precision fp16.")
    if precision in ("fp32", "int8"):
        return None, {}, None
    sampled = sample_feeds(onnx_path, model, specs, axes, data)
    return (*prepare_for_build(model, onnx_path, specs, axes, sampled=sampled), sampled)


def check_options(options: BuildOptions, precision: str) -> None:
    """The build options' own contradictions, each a user error, found before any work: build runs it first, and
    pipeline before its export (a config that cannot build should not cost an export and a calibration first)."""
    from trtforge.fusion.fp8 import CHAIN_MODES, GEMM_PRECISIONS

    if options.gemm_precision not in GEMM_PRECISIONS:
        raise UserError(
            f"--gemm-precision '{options.gemm_precision}' is not one of {', '.join(GEMM_PRECISIONS)} (config key build.gemm_precision)."
        )
    if options.fp8_chain_ffn not in CHAIN_MODES:
        raise UserError(
            f"--fp8-chain-ffn '{options.fp8_chain_ffn}' is not one of {', '.join(CHAIN_MODES)} (config key build.fp8_chain_ffn)."
        )
    if options.fp8_chain_ffn == "on" and options.gemm_precision != "fp8":
        raise UserError(
            "--fp8-chain-ffn on (config key build.fp8_chain_ffn) chains FP8 GEMMs; build with --gemm-precision "
            "fp8 too, or leave it at auto."
        )
    for key, value in (("fp8_min_cosine", options.fp8_min_cosine), ("fp8_min_top1_agreement", options.fp8_min_top1_agreement)):
        if value is not None and not 0 < value <= 1:  # NaN too: a gate that cannot fail, or cannot pass, is refused up front
            raise UserError(f"--{key.replace('_', '-')} {value} (config key build.{key}) must be in (0, 1], e.g. 0.99.")
    if options.fp8_min_top1_agreement is not None and options.gemm_precision != "fp8":  # its default is None: any value was asked for
        raise _fp8_only("fp8_min_top1_agreement")
    if options.calib_data is not None and precision not in ("fp16", "best"):
        raise UserError(
            f"--calib-data (config key build.calib_data) feeds the fp16 conversion's magnitudes and FP8's scales; "
            f"precision {precision} has neither (INT8 scales come from `trtforge calibrate`): build with "
            "--precision fp16 or best, or leave it out."
        )
    if options.calib_data is not None and not (str(options.calib_data).strip() and Path(options.calib_data).is_dir()):
        raise UserError(
            f"--calib-data '{options.calib_data}' (config key build.calib_data) is not a folder; give a folder "
            "of inputs in calibrate's formats."
        )


@dataclass
class BuildPlan:
    """What every phase of a build reads: the runtime, the model and its profiles, and where the engine goes."""

    mod: TrtModule
    onnx_path: Path
    output: Path
    precision: str
    options: BuildOptions
    model: onnx.ModelProto
    specs: list[InputSpec]
    axes: dict[str, AxisRange]
    parent: dict[str, Any] | None
    profiles: list[Profile]
    phases: Any
    protected: dict[Path, str]
    data: Path | None
    warn: Callable[[str], None]
    clock: BuildClock

    def pass_inputs(self) -> tuple[list[InputSpec], dict[str, AxisRange], list[Profile], Path]:
        """The elementwise passes' shared arguments, the same for the first pass and the fallback's."""
        return self.specs, self.axes, self.profiles, self.onnx_path


@dataclass
class PassedGraphs:
    """The graphs and records of the passes before TensorRT, which the fallback build and the sidecar read again."""

    converted: onnx.ModelProto | None
    precision_report: dict[str, Any]
    identity: dict[str, Any]
    before_fusion: onnx.ModelProto
    observation: Any
    attention_fused: onnx.ModelProto | None
    fusion: dict[str, Any]
    elementwise: dict[str, dict[str, Any]]
    fused: onnx.ModelProto | None
    fp8_record: dict[str, Any] | None
    fp8_check_feeds: Any


@dataclass
class _StagedGraph:
    """The graph TensorRT builds and the folder it waits in until the engine exists; the fallback build replaces it."""

    converted: onnx.ModelProto | None
    folder: Path | None
    built_onnx: Path
    source: Path
    model: onnx.ModelProto


def build(
    onnx_path: Path,
    output: Path | None = None,
    precision: str = "fp32",
    tiers: str | None = None,
    config_tiers: dict[str, list[int]] | None = None,
    backend: str = "auto",
    options: BuildOptions | None = None,
    lengths_file: Path | None = None,
    tier_count: int = 3,
    on_tick: Tick | None = None,
    tick_s: float = 15.0,
    warn: Callable[[str], None] | None = None,
    engine_check: bool = True,
    engine_hooks: Any = None,
) -> BuildResult:
    """Build an engine. 'fp32' is IEEE fp32 (TF32 off) unless options.tf32.

    An int8/best engine built from calibrate's Q/DQ ONNX gets calibrate's held-out gate re-checked on the
    engine where it can execute (calibrate/engine_check.py; sidecar key `engine_check`, skipped with the
    reason elsewhere). engine_hooks replace the runtime in tests.

    The engine and its sidecar are written as soon as TensorRT returns; layer inspection comes after
    and can only add to the sidecar (a failed inspection is recorded and warned about, never fatal).
    on_tick(elapsed, progress) is called every tick_s seconds during the TensorRT build."""
    plan = plan_build(onnx_path, output, precision, tiers, config_tiers, backend, options, lengths_file, tier_count, warn)
    graphs = graph_passes(plan)
    out, sidecar = _build_and_publish(plan, graphs, on_tick, tick_s)
    plan.clock.lap(TENSORRT_LAP)
    _after_build(plan, out, sidecar, graphs, engine_check, engine_hooks)
    return BuildResult(plan.output, sidecar, plan.profiles, sidecar["layer_summary"])


def plan_build(
    onnx_path: Path,
    output: Path | None,
    precision: str,
    tiers: str | None,
    config_tiers: dict[str, list[int]] | None,
    backend: str,
    options: BuildOptions | None,
    lengths_file: Path | None,
    tier_count: int,
    warn: Callable[[str], None] | None,
) -> BuildPlan:
    """Everything decided before the graph passes: the requests checked, the runtime and its plugins loaded, the profiles
    planned; the build clock starts here, and its first lap ends here."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision '{precision}'; use one of {', '.join(PRECISIONS)}.")
    warn = warn or stderr_warning
    onnx_path = Path(onnx_path)
    options = options or BuildOptions()
    check_options(options, precision)
    clock = BuildClock()
    refuse_overwrite(
        "build",
        [onnx_path, lengths_file, options.calib_data, *(options.plugin_libraries or [])],
        [output or default_engine_path(onnx_path, precision)],
        [options.timing_cache],
    )
    if options.fp8_min_top1_agreement is not None:
        _require_logits(onnx_path)
    mod = load_trt(backend)
    from trtforge.backends.plugin_libraries import load_plugin_libraries
    from trtforge.build.plugins.compile import libraries_for_build

    # Before the fusion passes ask the registry: those given, none for 'none', else the cached libtrtforge_plugins.
    load_plugin_libraries(mod, libraries_for_build(mod.flavour, mod.version, options.plugin_libraries, warn))
    model = load_onnx(onnx_path)
    specs, axes, parent = io_specs(onnx_path, model)
    lengths = read_lengths(lengths_file) if lengths_file else None
    from trtforge.build.kv_profiles import plan_kv_profiles  # KV-cache decoders: prefill + decode profiles
    from trtforge.export.kvcache import kv_axes, kv_meta  # KV-cache decoders: prefill + decode profiles

    kv, _, _ = kv_meta(onnx_path, parent)
    axes = kv_axes(axes, kv) if kv else axes
    tier_plan = parse_tiers(tiers, config_tiers or {}, axes, lengths, tier_count)
    profiles, phases = plan_kv_profiles(specs, axes, tier_plan, kv) if kv else (plan_profiles(specs, axes, tier_plan), None)
    output = Path(output) if output else default_engine_path(onnx_path, precision)
    protected = lineage(onnx_path)  # never overwritten (refuse_overwrite refused such an engine path): the converted graph goes elsewhere
    ensure_writable_dir(output)
    data = Path(options.calib_data).resolve() if options.calib_data else None  # the sidecar names it wherever it is read
    if options.fp8_min_top1_agreement is not None and data is None:
        _require_real_inputs(onnx_path, model)
    clock.lap("load and plan profiles")
    return BuildPlan(mod, onnx_path, output, precision, options, model, specs, axes, parent, profiles, phases, protected, data, warn, clock)


def graph_passes(plan: BuildPlan) -> PassedGraphs:
    """The precision conversion, then the attention, elementwise and FP8 passes, each ending its lap of the clock."""
    mod, precision, options, clock = plan.mod, plan.precision, plan.options, plan.clock
    converted, precision_report, sampled = _prepare_precision(plan.model, precision, plan.onnx_path, plan.specs, plan.axes, plan.data)
    clock.lap("precision conversion")
    identity = runtime_identity(mod)
    before_fusion = converted if converted is not None else plan.model
    observation = shared_observation(mod, before_fusion, precision, options, plan.specs, plan.axes, plan.profiles)
    if observation is not None:
        observation.values(observation.wanted)
        clock.lap("observing the graph for the fusion passes")
    attention_fused, fusion = fuse_attention(
        mod, identity, before_fusion, precision, options, plan.specs, plan.axes, plan.profiles, plan.onnx_path, observation
    )
    clock.lap("attention pass")
    elementwise_fused, elementwise = fuse_elementwise(
        mod,
        attention_fused if attention_fused is not None else before_fusion,
        before_fusion,
        precision,
        options,
        *plan.pass_inputs(),
        observation=observation,
    )
    fused = elementwise_fused if elementwise_fused is not None else attention_fused
    clock.lap("elementwise passes")
    fp8_record, fp8_check_feeds = None, None
    if options.gemm_precision == "fp8":  # the GEMM plugins' nodes as TrtforgeGemmFp8 (trtforge.fusion.fp8)
        fused, fp8_record, fp8_check_feeds = gemm_fp8(
            mod,
            identity,
            fused,
            before_fusion,
            plan.model,
            precision,
            plan.onnx_path,
            plan.specs,
            plan.axes,
            options.fp8_min_cosine,
            options.fp8_chain_ffn,
            plan.data,
            options.fp8_min_top1_agreement,
            sampled,
        )
        clock.lap("fp8 pass")
    return PassedGraphs(
        converted,
        precision_report,
        identity,
        before_fusion,
        observation,
        attention_fused,
        fusion,
        elementwise,
        fused,
        fp8_record,
        fp8_check_feeds,
    )


def _build_and_publish(plan: BuildPlan, graphs: PassedGraphs, on_tick: Tick | None, tick_s: float) -> tuple[BuildOutput, dict[str, Any]]:
    """TensorRT's build of the passes' graph (without auto's fusions where that fails), then the built ONNX, the engine
    and their sidecars published; the staging folder is removed whatever happens."""
    from trtforge.backends.plugin_libraries import loaded_plugin_libraries

    # The fused graph is saved beside the engine like a precision conversion; ORT keeps the original as reference.
    converted = graphs.fused if graphs.fused is not None else graphs.converted
    slow = slow_build_warning(plan.profiles)
    if slow:
        plan.warn(slow)
    folder = Path(tempfile.mkdtemp(prefix=f".{plan.output.name}.", dir=plan.output.parent)) if converted is not None else None
    staged = _StagedGraph(converted, folder, plan.onnx_path, plan.onnx_path, plan.model)
    try:
        if converted is not None:
            # The converted model is staged and only moved beside the engine once the engine exists.
            staged.built_onnx = converted_onnx_path(plan.output, plan.precision, plan.protected)
            staged.source = save_onnx(converted, staged.folder / staged.built_onnx.name)
            staged.model = converted
        plan.options.has_fp16, plan.options.has_qdq = model_traits(staged.model)
        start = time.perf_counter()
        try:
            out = build_engine(plan.mod, staged.source, plan.profiles, plan.options, on_tick, tick_s)
        except UserError as exc:
            drop_attention, drop_elementwise = _auto_fusions(plan, graphs)
            if not (drop_attention or drop_elementwise) or graphs.fp8_record is not None:  # fp8 was asked for: no quiet fallback
                raise
            out = _build_without_auto_fusion(plan, graphs, staged, exc, drop_attention, drop_elementwise, on_tick, tick_s)
        sidecar = engine_sidecar(
            plan.mod,
            graphs.identity,
            plan.precision,
            plan.profiles,
            plan.phases,
            out,
            plan.specs,
            plan.axes,
            plan.onnx_path,
            plan.parent,
            staged.built_onnx,
            staged.source,
            graphs.precision_report,
            graphs.fusion,
            graphs.elementwise,
            plan.options,
            start,
        )
        if graphs.fp8_record is not None:
            sidecar["gemm_precision"] = graphs.fp8_record
        # Every plugin library in the process (the registry is shared: an earlier build's serves this one too); run
        # loads them again before deserializing the engine.
        sidecar["plugin_libraries"] = loaded_plugin_libraries()
        _publish(plan, graphs.precision_report, staged, out, sidecar)
    finally:
        if staged.folder is not None:
            shutil.rmtree(staged.folder, ignore_errors=True)
    return out, sidecar


def _auto_fusions(plan: BuildPlan, graphs: PassedGraphs) -> tuple[bool, list[ElementwisePass]]:
    """What `auto` added to the graph, which a failed TensorRT build may go without: attention, and plugin passes."""
    drop_attention = graphs.attention_fused is not None and plan.options.fuse_attention == "auto"
    drop_elementwise = [
        spec
        for spec in ELEMENTWISE_PASSES
        if graphs.elementwise[spec.key]["route"] == "plugin" and graphs.elementwise[spec.key]["mode"] == "auto"
    ]
    return drop_attention, drop_elementwise


def _build_without_auto_fusion(
    plan: BuildPlan,
    graphs: PassedGraphs,
    staged: _StagedGraph,
    exc: UserError,
    drop_attention: bool,
    drop_elementwise: list[ElementwisePass],
    on_tick: Tick | None,
    tick_s: float,
) -> BuildOutput:
    """auto promised a faster engine, not a failed build: record why and build without what auto added (a pass asked
    for with `on` stays)."""
    dropped = " and ".join(["attention"] * drop_attention + [spec.what for spec in drop_elementwise])
    plan.warn(f"the fused graph did not build ({exc}); building without {dropped} fusion.")
    why = f"fused graph failed to build: {str(exc)[:400]}"
    if drop_attention:
        graphs.fusion.update(route="none", why=why, replaced=[], padding_allowed=True, mask_inputs=[])
    base = graphs.attention_fused if graphs.attention_fused is not None and not drop_attention else graphs.converted
    refused = {spec.key: why for spec in drop_elementwise}
    again, records = fuse_elementwise(
        plan.mod,
        base if base is not None else graphs.before_fusion,
        graphs.before_fusion,
        plan.precision,
        plan.options,
        *plan.pass_inputs(),
        refused=refused,
        observation=graphs.observation,
    )
    graphs.elementwise.update(records)
    staged.converted = again if again is not None else base
    if staged.converted is None:
        shutil.rmtree(staged.folder, ignore_errors=True)
        staged.folder, staged.built_onnx, staged.source, staged.model = None, plan.onnx_path, plan.onnx_path, load_onnx(plan.onnx_path)
    else:
        staged.source = save_onnx(staged.converted, staged.folder / staged.built_onnx.name)
        staged.model = staged.converted
    plan.options.has_fp16, plan.options.has_qdq = model_traits(staged.model)
    return build_engine(plan.mod, staged.source, plan.profiles, plan.options, on_tick, tick_s)


def _publish(plan: BuildPlan, precision_report: dict[str, Any], staged: _StagedGraph, out: BuildOutput, sidecar: dict[str, Any]) -> None:
    """The built ONNX, the engine and their sidecars appear together or not at all."""
    with interrupts.deferred():
        if staged.converted is not None:
            with output_lock(staged.built_onnx):
                for item in staged.folder.iterdir():
                    publish(item, staged.built_onnx.parent / item.name)
                write_sidecar(
                    staged.built_onnx,
                    {
                        **(plan.parent or {}),
                        "step": "precision",
                        "precision": plan.precision,
                        "parent": os.path.abspath(plan.onnx_path),
                        "graph_hash": onnx_graph_hash(staged.converted),
                        **precision_report,
                    },
                )
        with output_lock(plan.output):  # engine and sidecar of one build, even when two builds target one path
            write_bytes_atomic(plan.output, out.engine)
            if out.timing_cache is not None and plan.options.timing_cache is not None:
                write_bytes_atomic(plan.options.timing_cache, out.timing_cache)
            write_sidecar(plan.output, sidecar)


def _after_build(
    plan: BuildPlan, out: BuildOutput, sidecar: dict[str, Any], graphs: PassedGraphs, engine_check: bool, engine_hooks: Any
) -> None:
    """What only adds to the published sidecar: layer inspection, the engine checks and the build overhead, each
    written as soon as it is known."""
    output, options, clock = plan.output, plan.options, plan.clock
    fields, layers = layer_info(plan.mod, out, plan.profiles, output, plan.warn)
    sidecar.update(fields)
    attention_evidence(sidecar, layers, len(plan.profiles), output, plan.warn)
    clock.lap("layer inspection")
    with output_lock(output):
        write_sidecar(output, sidecar)
    if engine_check:
        from trtforge.calibrate.engine_check import after_build

        check = after_build(output, sidecar, engine_hooks)
        if check is not None:
            sidecar["engine_check"] = check
            with output_lock(output):
                write_sidecar(output, sidecar)
    if engine_check and graphs.fp8_record is not None:
        from trtforge.calibrate.engine_check import after_fp8_build

        sidecar["engine_check"] = after_fp8_build(
            output,
            sidecar,
            graphs.fp8_check_feeds,
            options.fp8_min_cosine,
            engine_hooks,
            options.fp8_min_top1_agreement,
            graphs.fp8_record["gate"]["real_batches"],
        )
    clock.lap("engine check")
    sidecar["build_overhead"] = clock.overhead(out.seconds, out.parse_seconds)
    with output_lock(output):
        write_sidecar(output, sidecar)


def converted_onnx_path(output: Path, precision: str, protected: dict[Path, str]) -> Path:
    """Where a build saves the graph it converted or fused: ENGINE_STEM.onnx beside the engine, or ENGINE_STEM.PRECISION.onnx
    where the first is not a file this build may replace. Replaceable: no file, or an earlier build's converted graph
    (its sidecar's step is "precision") that is not in `protected` (artifacts.lineage: the ONNX being built and what it
    was made from). Why: `build m.onnx -o m.engine` wrote its fp16 graph over m.onnx itself, and `-o m.engine` over
    m.clean.onnx's parent m.onnx, losing the source and the reference `run` compares against."""
    stem = output.name.removesuffix(".engine")
    taken = []
    for name in (f"{stem}.onnx", f"{stem}.{precision}.onnx"):
        candidate = output.with_name(name)
        if candidate.resolve() in protected:
            taken.append(f"{candidate} is {protected[candidate.resolve()]}")
            continue
        if candidate.exists():
            try:
                ours = (read_sidecar(candidate, required=False) or {}).get("step") == "precision"
            except UserError:
                ours = False
            if not ours:
                taken.append(f"{candidate} is a file no build wrote")
                continue
        return candidate
    raise UserError(f"the {precision} graph cannot be saved beside the engine ({'; '.join(taken)}); name the engine another file with -o.")
