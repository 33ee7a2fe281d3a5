"""`trtforge build`: ONNX -> TensorRT engine + sidecar, with tiered profiles and a chosen precision.

Precision lives in the ONNX (strongly typed builds): fp16 converts the model first (precision.py),
int8 takes the Q/DQ model from `calibrate`, best converts a Q/DQ model's remaining float parts to fp16.
The exact ONNX an engine was built from is kept beside it as ENGINE_STEM.onnx when it differs from
the input.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import onnx

from trtforge import __version__
from trtforge.backends.engine_layers import runtime_identity
from trtforge.backends.tensorrt import BuildOptions, BuildOutput, Tick, TrtModule, build_engine, load_trt
from trtforge.build.clock import TENSORRT_LAP, BuildClock
from trtforge.build.engine_record import layer_info, stderr_warning
from trtforge.build.passes import attention_evidence, fuse_attention, fuse_elementwise, gemm_fp8, shared_observation
from trtforge.build.profiles import Profile, Tier, auto_tier_bounds, plan_profiles, slow_build_warning, tier_ranges
from trtforge.core import interrupts
from trtforge.core.artifacts import (
    ensure_writable_dir,
    lineage,
    onnx_graph_hash,
    output_lock,
    publish,
    read_sidecar,
    refuse_overwrite,
    sha256_bytes,
    sha256_file,
    write_bytes_atomic,
    write_sidecar,
)
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError
from trtforge.core.onnxio import load_onnx, save_onnx
from trtforge.fusion.step import ELEMENTWISE_PASSES
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


def parse_tiers(
    spec: str | None, config_tiers: dict[str, list[int]], axes: dict[str, AxisRange], lengths: list[int] | None = None, count: int = 3
) -> dict[str, list[Tier]]:
    """'128,256,512' (the sequence axis), 'seq=128,512;batch=8,32', 'auto', or the config's tiers."""
    if not spec:
        unknown = [axis for axis in config_tiers if axis not in axes]
        if unknown:
            raise UserError(
                f"config key build.tiers names axis '{unknown[0]}', which the model does not have; its axes are: "
                f"{', '.join(axes) or 'none'}."
            )
        return {axis: tier_ranges(bounds, axes[axis], axis) for axis, bounds in config_tiers.items()}
    if spec.strip() == "auto":
        if lengths is None:
            raise UserError("--tiers auto needs real lengths; pass --lengths FILE (one integer per line).")
        default_axis = _default_tier_axis(axes)
        return {default_axis: auto_tier_bounds(lengths, count, axes[default_axis])}
    tiers = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        axis, _, values = part.rpartition("=")
        axis = axis.strip() or _default_tier_axis(axes)
        if axis not in axes:
            raise UserError(f"--tiers names axis '{axis}', which the model does not have; its axes are: {', '.join(axes)}.")
        try:
            bounds = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise UserError(f"--tiers '{part}' must be comma-separated integers, e.g. 128,256,512.") from None
        tiers[axis] = tier_ranges(bounds, axes[axis], axis)
    return tiers


def _default_tier_axis(axes: dict[str, AxisRange]) -> str:
    for name in ("seq", "sequence", "seq_len", "tokens"):
        if name in axes:
            return name
    non_batch = [a for a in axes if a != "batch"]
    if len(non_batch) == 1:
        return non_batch[0]
    raise UserError(f"--tiers must name its axis when the model has several ({', '.join(axes)}): e.g. seq=128,512.")


def read_lengths(path: Path) -> list[int]:
    if not path.is_file():
        raise UserError(f"lengths file {path} does not exist; give one integer per line.")
    try:
        text = path.read_text(encoding="utf-8").strip()
        values = json.loads(text) if text.startswith("[") else [int(line) for line in text.split() if line]
        lengths = (
            [int(v) for v in values]
            if isinstance(values, list)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() for v in values)
            else None
        )
    except (ValueError, TypeError, UnicodeDecodeError, OverflowError, RecursionError):
        lengths = None
    if lengths is None:
        raise UserError(f"lengths file {path} must hold integers, one per line (or a JSON list).")
    if any(n < 1 for n in lengths):
        raise UserError(f"lengths file {path} holds {min(lengths)}; lengths must be at least 1.")
    return lengths


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
    from trtforge.backends.plugin_libraries import load_plugin_libraries, loaded_plugin_libraries
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
    converted, precision_report, sampled = _prepare_precision(model, precision, onnx_path, specs, axes, data)
    clock.lap("precision conversion")
    identity = runtime_identity(mod)
    before_fusion = converted if converted is not None else model
    observation = shared_observation(mod, before_fusion, precision, options, specs, axes, profiles)
    if observation is not None:
        observation.values(observation.wanted)
        clock.lap("observing the graph for the fusion passes")
    attention_fused, fusion = fuse_attention(
        mod, identity, before_fusion, precision, options, specs, axes, profiles, onnx_path, observation
    )
    clock.lap("attention pass")
    passes = (specs, axes, profiles, onnx_path)
    elementwise_fused, elementwise = fuse_elementwise(
        mod,
        attention_fused if attention_fused is not None else before_fusion,
        before_fusion,
        precision,
        options,
        *passes,
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
            model,
            precision,
            onnx_path,
            specs,
            axes,
            options.fp8_min_cosine,
            options.fp8_chain_ffn,
            data,
            options.fp8_min_top1_agreement,
            sampled,
        )
        clock.lap("fp8 pass")
    unfused = converted
    if fused is not None:  # saved beside the engine like a precision conversion; ORT keeps the original as reference
        converted = fused
    slow = slow_build_warning(profiles)
    if slow:
        warn(slow)
    built_onnx = onnx_path
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent)) if converted is not None else None
    try:
        source = onnx_path
        if converted is not None:
            # The converted model is staged and only moved beside the engine once the engine exists.
            built_onnx = converted_onnx_path(output, precision, protected)
            source = save_onnx(converted, staging / built_onnx.name)
            model = converted
        options.has_fp16, options.has_qdq = model_traits(model)
        start = time.perf_counter()
        try:
            out = build_engine(mod, source, profiles, options, on_tick, tick_s)
        except UserError as exc:
            drop_attention = attention_fused is not None and options.fuse_attention == "auto"
            drop_elementwise = [
                spec
                for spec in ELEMENTWISE_PASSES
                if elementwise[spec.key]["route"] == "plugin" and elementwise[spec.key]["mode"] == "auto"
            ]
            if not (drop_attention or drop_elementwise) or fp8_record is not None:  # fp8 was asked for: no quiet fallback
                raise
            # auto promised a faster engine, not a failed build: record why and build without what auto added
            # (a pass asked for with `on` stays).
            dropped = " and ".join(["attention"] * drop_attention + [spec.what for spec in drop_elementwise])
            warn(f"the fused graph did not build ({exc}); building without {dropped} fusion.")
            why = f"fused graph failed to build: {str(exc)[:400]}"
            if drop_attention:
                fusion.update(route="none", why=why, replaced=[], padding_allowed=True, mask_inputs=[])
            base = attention_fused if attention_fused is not None and not drop_attention else unfused
            refused = {spec.key: why for spec in drop_elementwise}
            again, records = fuse_elementwise(
                mod,
                base if base is not None else before_fusion,
                before_fusion,
                precision,
                options,
                *passes,
                refused=refused,
                observation=observation,
            )
            elementwise.update(records)
            base = again if again is not None else base
            converted = base
            if converted is None:
                shutil.rmtree(staging, ignore_errors=True)
                staging, built_onnx, source, model = None, onnx_path, onnx_path, load_onnx(onnx_path)
            else:
                source = save_onnx(converted, staging / built_onnx.name)
                model = converted
            options.has_fp16, options.has_qdq = model_traits(model)
            out = build_engine(mod, source, profiles, options, on_tick, tick_s)
        sidecar = _engine_sidecar(
            mod,
            identity,
            precision,
            profiles,
            phases,
            out,
            specs,
            axes,
            onnx_path,
            parent,
            built_onnx,
            source,
            precision_report,
            fusion,
            elementwise,
            options,
            start,
        )
        if fp8_record is not None:
            sidecar["gemm_precision"] = fp8_record
        # Every plugin library in the process (the registry is shared: an earlier build's serves this one too); run
        # loads them again before deserializing the engine.
        sidecar["plugin_libraries"] = loaded_plugin_libraries()
        with interrupts.deferred():  # the built ONNX, the engine and their sidecars appear together or not at all
            if converted is not None:
                with output_lock(built_onnx):
                    for staged in staging.iterdir():
                        publish(staged, built_onnx.parent / staged.name)
                    write_sidecar(
                        built_onnx,
                        {
                            **(parent or {}),
                            "step": "precision",
                            "precision": precision,
                            "parent": os.path.abspath(onnx_path),
                            "graph_hash": onnx_graph_hash(converted),
                            **precision_report,
                        },
                    )
            with output_lock(output):  # engine and sidecar of one build, even when two builds target one path
                write_bytes_atomic(output, out.engine)
                if out.timing_cache is not None and options.timing_cache is not None:
                    write_bytes_atomic(options.timing_cache, out.timing_cache)
                write_sidecar(output, sidecar)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    clock.lap(TENSORRT_LAP)
    fields, layers = layer_info(mod, out, profiles, output, warn)
    sidecar.update(fields)
    attention_evidence(sidecar, layers, len(profiles), output, warn)
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
    if engine_check and fp8_record is not None:
        from trtforge.calibrate.engine_check import after_fp8_build

        sidecar["engine_check"] = after_fp8_build(
            output,
            sidecar,
            fp8_check_feeds,
            options.fp8_min_cosine,
            engine_hooks,
            options.fp8_min_top1_agreement,
            fp8_record["gate"]["real_batches"],
        )
    clock.lap("engine check")
    sidecar["build_overhead"] = clock.overhead(out.seconds, out.parse_seconds)
    with output_lock(output):
        write_sidecar(output, sidecar)
    return BuildResult(output, sidecar, profiles, sidecar["layer_summary"])


def _engine_sidecar(
    mod: TrtModule,
    identity: dict[str, Any],
    precision: str,
    profiles: list[Profile],
    phases: Any,
    out: BuildOutput,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    onnx_path: Path,
    parent: dict[str, Any] | None,
    built_onnx: Path,
    source: Path,
    precision_report: dict[str, Any],
    fusion: dict[str, Any],
    elementwise: dict[str, dict[str, Any]],
    options: BuildOptions,
    start: float,
) -> dict[str, Any]:
    """The engine's sidecar as written with the engine; layer info and the engine check are added later."""
    return {
        "kind": "engine",
        "trtforge_version": __version__,
        "backend": mod.flavour,
        "tensorrt_version": mod.version,
        "strongly_typed": mod.strongly_typed,
        "gpu": identity["gpu"],
        "compute_capability": identity["compute_capability"] if mod.flavour == "tensorrt" else None,
        "target_compute_capabilities": out.compute_capabilities,
        "precision": precision,
        "tf32": bool(options.tf32) if precision == "fp32" else None,
        "profiles": [p.to_json() for p in profiles],
        "phases": phases,  # KV-cache engines: which profiles serve prefill and decode
        "io": out.io,
        "inputs": [s.model_dump() for s in specs],
        "axes": {k: v.model_dump() for k, v in axes.items()},
        "source_onnx": os.path.abspath(onnx_path),  # absolute: `run` finds it from any folder
        "source_onnx_sha256": sha256_file(onnx_path),
        "source_graph_hash": (parent or {}).get("graph_hash"),
        "reference_onnx": (parent or {}).get("reference_onnx") or os.path.abspath(onnx_path),
        "built_onnx": str(built_onnx),
        "calibration_cache_sha256": (parent or {}).get("cache_sha256"),
        "precision_report": precision_report,
        "attention_fusion": fusion,
        **{f"{key}_fusion": record for key, record in elementwise.items()},  # gelu_fusion, skip_layernorm_fusion
        "build_options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()},
        "timing_cache": {
            "path": str(options.timing_cache) if options.timing_cache else None,
            "loaded": out.timing_cache_loaded,
            "saved": out.timing_cache is not None,
        },
        "build_seconds": round(out.seconds, 3),
        "total_seconds": round(time.perf_counter() - start, 3),
        "engine_bytes": len(out.engine),
        "engine_sha256": sha256_bytes(out.engine),
        "onnx_bytes": source.stat().st_size,  # the staged copy of built_onnx, or the source itself
        "layer_info": None,
        "layer_info_unavailable": "not inspected yet",
        "layer_summary": None,
        "inspector": None,
        "notes": out.notes,
    }


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
