"""`trtforge bisect`: which Q/DQ groups TensorRT executes differently from the ONNX semantics.

Issue 10: a Q/DQ BERT that ONNX Runtime ran at cosine 0.998 ran at 0.74 on the TensorRT engine; switching
Q/DQ groups on and off found the attention batched MatMuls. This command does that on any model:
1. groups the quantizable ops by role (calibrate/groups.py), attention included;
2. makes Q/DQ variants with the calibration cache's scales (missing scales, e.g. attention inputs a
   default calibration left float, come from the data): all groups on, each group off, each group alone;
3. measures each against the fp32 model on the data: ONNX Runtime always; a TensorRT engine (one
   profile at the data's shapes, `best` precision by default) where an engine can execute, with its
   GPU ms; where none can, the engine column says why, and with a builder present each variant is at
   least built;
4. names the groups whose engine cosine falls below ORT's by more than `max_gap`, alone, or whose
   removal closes the all-on variant's gap.
Output: a table and a JSON report; the variant ONNX files (and engines) stay in the work folder.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.build.profiles import Profile, Tier
from trtforge.calibrate import data as data_mod
from trtforge.calibrate.cache import read_cache
from trtforge.calibrate.collect import QuantPlan, collect, gemm_shapes, plan_quantization
from trtforge.calibrate.evaluate import evaluate, reference_outputs
from trtforge.calibrate.groups import (
    float_nodes_for,
    role_groups,
    select_groups,
    variants,
)
from trtforge.calibrate.methods import compute_amax
from trtforge.calibrate.quantize import insert_qdq
from trtforge.calibrate.smooth import apply_smoothing
from trtforge.core.artifacts import declared_output_kinds, ensure_writable_dir, read_sidecar, refuse_overwrite, write_json_atomic
from trtforge.core.config import InputSpec
from trtforge.core.errors import UserError
from trtforge.core.onnxio import load_onnx, save_onnx
from trtforge.graph.index import io_specs, name_all_nodes
from trtforge.runtime.feeds import random_feeds
from trtforge.verify.guards import require_informative_batches


@dataclass
class BisectOptions:
    cache: Path
    data: Path
    groups: str | None = "auto"
    modes: tuple[str, ...] = ("off", "alone")
    max_samples: int | None = 64
    batch_size: int = 16
    precision: str = "best"
    max_gap: float = 0.005
    engine: bool = True  # measure engines where they can execute; else at least build them where a builder exists
    build_check: bool = True
    repeat: int = 20  # timed executions of the most common batch shape
    tactic_sources: str | None = None
    optimization_level: int | None = None  # lower builds faster; Myelin's fusions (what bisect is about) stay
    out_dir: Path | None = None
    report: Path | None = None


# An engine measurer: (variant ONNX path, Q/DQ model, batches, fp32 references, output kinds) -> its figures
# {"mean_cosine", "min_cosine", "gpu_ms"} or {"built": True} / {"error": ...}.
EngineMeasure = Callable[[Path, onnx.ModelProto, list, list, dict], dict]


@dataclass
class BisectResult:
    rows: list[dict[str, Any]]
    groups: dict[str, list[str]]
    suspects: list[str]
    engine_status: str
    report: dict[str, Any] = field(default_factory=dict)


def data_profile(specs: list[InputSpec], batches: list[dict[str, np.ndarray]]) -> Profile:
    """One optimization profile spanning the data's shapes, opt at the most common batch shape. Pure."""
    sizes: dict[str, list[int]] = {}
    for batch in batches:
        for spec in specs:
            for dim, size in zip(spec.shape, batch[spec.name].shape):
                if isinstance(dim, str):
                    sizes.setdefault(dim, []).append(int(size))
    common = Counter(tuple(sorted((k, v.shape) for k, v in b.items())) for b in batches).most_common(1)[0][0]
    opt_shapes = dict(common)
    axes = {}
    for axis, values in sizes.items():
        opt = next(size for spec in specs for dim, size in zip(spec.shape, opt_shapes[spec.name]) if dim == axis)
        axes[axis] = Tier(min(values), opt, max(values))
    profile = Profile(0, axes)
    for spec in specs:
        dims = [(d, d, d) if isinstance(d, int) else (axes[d].min, axes[d].opt, axes[d].max) for d in spec.shape]
        profile.shapes[spec.name] = tuple(tuple(x[j] for x in dims) for j in range(3))  # type: ignore[assignment]
    return profile


def suspects(rows: list[dict[str, Any]], max_gap: float) -> list[str]:
    """Groups TensorRT executes differently from the ONNX (pure): alone, the engine falls more than
    `max_gap` below ORT; or all-on has such a gap and leaving the group out closes it."""

    def gap(row: dict[str, Any]) -> float | None:
        """ORT - engine cosine; an engine that computed NaN is as far off as an engine can be."""
        value = row.get("gap")
        return float("inf") if value is not None and value != value else value

    named = []
    all_gap = next((gap(r) for r in rows if r["variant"] == "all"), None)
    for row in rows:
        g, row_gap = row.get("group"), gap(row)
        if g is None or row_gap is None:
            continue
        if row["mode"] == "alone" and row_gap > max_gap:
            named.append(g)
        if row["mode"] == "off" and all_gap is not None and all_gap > max_gap and row_gap <= max_gap:
            named.append(g)
    return list(dict.fromkeys(named))


def engine_availability() -> tuple[str, str]:
    """('run', flavour) | ('build', flavour) | ('none', why): what this machine can do with engines."""
    from trtforge.calibrate.engine_check import runtime_here

    ok, what = runtime_here()
    if ok:
        return "run", what
    for flavour in ("tensorrt", "tensorrt_rtx"):
        from trtforge.core.platform import trt_module

        if trt_module(flavour) is not None:
            return "build", f"{flavour} (no engine can execute here: {what})"
    return "none", f"no TensorRT here ({what})"


def trt_measure(flavour: str, specs: list[InputSpec], profile: Profile, options: BisectOptions, execute: bool) -> EngineMeasure:
    """The real engine measurer: `precision` conversion, a one-profile build, then (with `execute`) the
    held-out figures and the median GPU ms of the most common batch shape."""
    from trtforge.backends.tensorrt import BuildOptions, build_engine, load_trt
    from trtforge.build.step import model_traits
    from trtforge.calibrate.engine_check import TACTICS_86

    mod = load_trt(flavour)
    tactics = options.tactic_sources or (TACTICS_86 if mod.flavour == "tensorrt" and mod.major < 10 else None)

    def measure(path: Path, qdq: onnx.ModelProto, batches: list, refs: list, kinds: dict) -> dict:
        model = qdq
        if options.precision == "best":
            from trtforge.build.precision import convert_fp16

            model, _ = convert_fp16(qdq, batches[:4], magnitudes_from="the bisection data")
            path = save_onnx(model, path.with_name(path.name.removesuffix(".onnx") + ".best.onnx"))
        has_fp16, has_qdq = model_traits(model)
        start = time.perf_counter()
        out = build_engine(
            mod,
            path,
            [profile],
            BuildOptions(tactic_sources=tactics, has_fp16=has_fp16, has_qdq=has_qdq, optimization_level=options.optimization_level),
        )
        engine = path.with_name(path.name.removesuffix(".onnx") + ".engine")
        engine.write_bytes(out.engine)
        result: dict[str, Any] = {"built": True, "build_s": round(time.perf_counter() - start, 1)}
        if not execute:
            return result
        from trtforge.backends.tensorrt_runtime import TrtRunner
        from trtforge.calibrate.engine_check import NamedOutputs

        runner = TrtRunner(mod, engine, {"profiles": [profile.to_json()], "inputs": [s.model_dump() for s in specs]})
        try:
            acc = evaluate(NamedOutputs(runner, list(refs[0])), batches, refs, kinds)
            timed = max(batches, key=lambda b: sum(v.size for v in b.values()))
            runner.timings.clear()
            for _ in range(options.repeat):
                runner.run(timed)
            result.update(
                mean_cosine=acc.mean_cosine,
                min_cosine=acc.min_cosine,
                gpu_ms=statistics.median(t.gpu_ms for t in runner.timings),
                timed_shape={k: list(v.shape) for k, v in timed.items()},
            )
        finally:
            runner.close()
        return result

    return measure


def _scales(working: onnx.ModelProto, plan, amax: dict[str, float], method: str, calib: list, progress) -> dict[str, float]:
    """The cache's scales plus those it lacks (tensors a default calibration left float, e.g. attention
    inputs), measured on `calib` with the cache's method."""
    missing = [t for t in plan.activation_tensors() if t not in amax]
    if not missing:
        return amax
    progress(f"the cache lacks scales for {len(missing)} tensors (e.g. attention inputs): measuring them with {method}")
    stats = collect(working, calib, missing, None, 2048, None)
    return {
        **amax,
        **{t: compute_amax(stats.histograms[t], method if method in ("entropy", "percentile", "minmax") else "entropy") for t in missing},
    }


@dataclass
class _Setup:
    """The fp32 graph and its smoothed working copy, the plan, its groups, the scales and the data batches:
    what every variant is made from and measured on."""

    model: onnx.ModelProto
    working: onnx.ModelProto
    specs: list[InputSpec]
    plan: QuantPlan
    groups: dict[str, list[str]]
    amax: dict[str, float]
    samples: list[dict[str, np.ndarray]]
    batches: list[dict[str, np.ndarray]]


def bisect(
    onnx_path: Path,
    options: BisectOptions,
    measure: EngineMeasure | None = None,
    availability: tuple[str, str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> BisectResult:
    """Run the bisection (module doc). `measure`/`availability` replace the TensorRT runtime in tests."""
    onnx_path = Path(onnx_path)
    out_dir = options.out_dir or onnx_path.with_name(onnx_path.name.removesuffix(".onnx").removesuffix(".clean") + ".bisect")
    report_path = options.report or out_dir / "bisect.json"
    inputs = [onnx_path, options.cache, options.data]
    refuse_overwrite("bisect", inputs, files=[report_path, out_dir])
    setup = _setup(onnx_path, options, progress)
    reference = OrtRunner(setup.model.SerializeToString())
    refs = reference_outputs(reference, setup.batches)
    require_informative_batches(refs, f"bisect's fp32 reference ({onnx_path.name} on {options.data})")
    kinds = declared_output_kinds(onnx_path)
    mode, why = availability or (engine_availability() if options.engine else ("none", "turned off (--no-engine)"))
    if mode == "build" and not options.build_check:
        mode, why = "none", why + "; build check turned off (--no-build-check)"
    if measure is None and mode in ("run", "build"):
        measure = trt_measure(why.split(" ")[0], setup.specs, data_profile(setup.specs, setup.batches), options, execute=mode == "run")
    _prepare_out_dir(out_dir, report_path, inputs, setup.groups, options, measure is not None)
    rows = [_variant_row(name, on, setup, refs, kinds, measure, out_dir, progress) for name, on in variants(setup.groups, options.modes)]
    named = suspects(rows, options.max_gap)
    status = {"run": "measured", "build": f"built only: {why}", "none": f"absent: {why}"}[mode]
    report = {
        "onnx": str(onnx_path),
        "cache": str(options.cache),
        "data": str(options.data),
        "samples": len(setup.samples),
        "precision": options.precision,
        "max_gap": options.max_gap,
        "engine": status,
        "groups": {g: len(nodes) for g, nodes in setup.groups.items()},
        "group_nodes": setup.groups,
        "rows": rows,
        "suspects": named,
        "out_dir": str(out_dir),
    }
    write_json_atomic(report_path, report)
    report["report"] = str(report_path)
    return BisectResult(rows, setup.groups, named, status, report)


def _read_fp32(onnx_path: Path, options: BisectOptions) -> onnx.ModelProto:
    """The fp32 graph with every node named; a graph already quantized, or a cache that is not there, is refused."""
    model = load_onnx(onnx_path)
    name_all_nodes(model)
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        raise UserError(f"{onnx_path} already holds Q/DQ nodes; bisect the cleaned fp32 ONNX (NAME.clean.onnx) with its --cache.")
    if not Path(options.cache).is_file():
        raise UserError(f"calibration cache {options.cache} does not exist; run `trtforge calibrate` first or pass --cache.")
    return model


def _setup(onnx_path: Path, options: BisectOptions, progress: Callable[[str], None]) -> _Setup:
    """The cache's scales (and SmoothQuant) on the graph, the data, the plan with attention quantized, and its groups."""
    from trtforge.calibrate.data import max_sample_length, tokenizer_factory

    model = _read_fp32(onnx_path, options)
    specs, axes, _ = io_specs(onnx_path, model)
    cache_side = read_sidecar(Path(options.cache), required=False) or {}
    method, amax = read_cache(Path(options.cache))
    method = cache_side.get("method") or method
    smooth = {k: np.asarray(v, dtype=np.float32) for k, v in (cache_side.get("smooth_scales") or {}).items()}
    working = apply_smoothing(model, smooth) if smooth else model
    tokenizer = tokenizer_factory(onnx_path)
    _, samples = data_mod.load_samples(options.data, specs, tokenizer, max_sample_length(specs, axes), options.max_samples)
    batches = list(data_mod.batches(samples, options.batch_size))
    shapes = gemm_shapes(model, random_feeds(specs, {n: r.opt for n, r in axes.items()}))
    plan = plan_quantization(working, shapes, quantize_attention=True)
    try:
        groups = select_groups(role_groups(working, plan, shapes), options.groups)
    except ValueError as exc:
        raise UserError(f"--groups: {exc}.") from None
    if not groups:
        raise UserError(f"{onnx_path} has no quantizable ops in any group; nothing to bisect.")
    calib_folder = Path(cache_side["data"]) if cache_side.get("data") and Path(cache_side["data"]).is_dir() else options.data
    calib = (
        batches
        if calib_folder == options.data
        else list(
            data_mod.batches(
                data_mod.load_samples(calib_folder, specs, tokenizer, max_sample_length(specs, axes), 64)[1], options.batch_size
            )
        )
    )
    amax = _scales(working, plan, amax, str(method).lower(), calib, progress)
    return _Setup(model, working, specs, plan, groups, amax, samples, batches)


def _prepare_out_dir(
    out_dir: Path, report_path: Path, inputs: list[Path], groups: dict[str, list[str]], options: BisectOptions, measured: bool
) -> None:
    """The work folder, made once nothing it would hold (the report, and with an engine measurer each variant's
    files) overwrites an input."""
    ensure_writable_dir(out_dir / "bisect.json")  # a file named like the folder: one sentence, not FileExistsError
    if measured:  # the variant files an engine measurement writes into out_dir
        refuse_overwrite(
            "bisect",
            inputs,
            files=[
                report_path,
                *(
                    out_dir / (_slug(name) + suffix)
                    for name, _ in variants(groups, options.modes)
                    for suffix in (".onnx", ".engine", ".best.onnx", ".best.engine")
                ),
            ],
        )
    out_dir.mkdir(parents=True, exist_ok=True)


def _variant_row(
    name: str,
    on: set[str],
    setup: _Setup,
    refs: list[dict[str, np.ndarray]],
    kinds: dict,
    measure: EngineMeasure | None,
    out_dir: Path,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """One variant's report row: its groups, ORT's accuracy, and the engine's figures (or why none) where measured."""
    progress(f"variant '{name}': {len(on)} group(s) quantized")
    float_nodes = float_nodes_for(setup.plan, setup.groups, on)
    qdq = insert_qdq(setup.working, setup.plan, setup.amax, float_nodes)
    acc = evaluate(OrtRunner(qdq.SerializeToString()), setup.batches, refs, kinds)
    mode_of = {"without": "off", "only": "alone"}
    row: dict[str, Any] = {
        "variant": name,
        "mode": mode_of.get(name.split(" ")[0], "all"),
        "group": name.split(" ", 1)[1] if " " in name else None,
        "groups_on": sorted(on),
        "quantized_nodes": len({t.node for t in setup.plan.targets} - float_nodes),
        "ort_mean_cosine": acc.mean_cosine,
        "ort_min_cosine": acc.min_cosine,
    }
    if measure is not None:
        path = save_onnx(qdq, out_dir / (_slug(name) + ".onnx"))
        try:
            engine = measure(path, qdq, setup.batches, refs, kinds)
        except Exception as exc:  # one variant that fails to build or run is a finding; the others still count
            engine = {"error": str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"}
        row["engine"] = engine
        if engine.get("mean_cosine") is not None:
            row["gap"] = acc.mean_cosine - engine["mean_cosine"]
    return row


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def table_rows(result: BisectResult) -> list[list[Any]]:
    """[variant, quantized ops, ORT mean cosine, engine mean cosine, engine - ORT gap, GPU ms] per variant;
    the engine columns say why they are empty."""
    out = []
    for row in result.rows:
        engine = row.get("engine") or {}
        if "mean_cosine" in engine:
            cells = [engine["mean_cosine"], row["gap"], engine.get("gpu_ms", "-")]
        elif "error" in engine:
            cells = ["failed: " + engine["error"][:80], "-", "-"]
        elif engine.get("built"):
            cells = ["built (not run here)", "-", "-"]
        else:
            cells = ["absent: " + result.engine_status.removeprefix("absent: ")[:60], "-", "-"]
        out.append([row["variant"], row["quantized_nodes"], row["ort_mean_cosine"], *cells])
    return out
