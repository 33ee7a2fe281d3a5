"""`trtforge calibrate`: cleaned ONNX + data -> TensorRT calibration cache (+ sidecar) + Q/DQ ONNX.

Order of work:
1. samples from the data folder (any lengths), held-out samples from the eval folder;
2. the cache, if its sidecar matches (graph, data, method, parameters) and the cache is the file the sidecar
   recorded (content hash, header algorithm): reused, nothing recomputed; when the Q/DQ ONNX beside it is also
   the one its sidecar recorded, made from this cache for the same held-out data, its recorded results are
   reused too and nothing is evaluated or rewritten;
3. otherwise: optional SmoothQuant (one pass for per-channel abs-max, then migration), one streamed
   pass for histograms, amax per the method, then accuracy-driven fallback: while the held-out mean
   cosine misses the gate, the most sensitive quantized layer is kept in float, as long as the GEMM
   FLOPs left in INT8 stay above their floor. Layers are ranked by their local INT8 error from one
   ORT run (sensitivity.py); only the top few get an end-to-end leave-one-out check;
4. the cache, its sidecar (naming the cache's hash), NAME.int8.onnx and its sidecar (naming both files'
   hashes), each written atomically, in that order, while the step holds its outputs' locks.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from trtforge import __version__
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate import data as data_mod
from trtforge.calibrate import recheck
from trtforge.calibrate.cache import read_cache, write_cache
from trtforge.calibrate.collect import (
    QuantPlan,
    collect,
    gemm_flops,
    gemm_shapes,
    plan_quantization,
)
from trtforge.calibrate.data import limited_batches, max_sample_length, tokenizer_factory
from trtforge.calibrate.evaluate import evaluate, reference_outputs
from trtforge.calibrate.fallback import fallback_search, float_flops_shares, flops_fraction, planned_int8, qdq_accuracy
from trtforge.calibrate.methods import compute_amax
from trtforge.calibrate.options import METHODS, CalibrateOptions, CalibrateResult, MethodResult, gate_record, paths_for
from trtforge.calibrate.quantize import (
    insert_qdq,
    int8_gemm_nodes,
    quantized_nodes,
    residual_adds,
)
from trtforge.calibrate.reuse import cache_decision, expected_fingerprint, int8_decision, int8_reuse_key, reuse_recorded
from trtforge.calibrate.smooth import (
    apply_smoothing,
    smoothing_groups,
    smoothing_scales,
)
from trtforge.core import interrupts
from trtforge.core.artifacts import (
    content_sha256,
    onnx_graph_hash,
    output_locks,
    refuse_overwrite,
    write_sidecar,
)
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError
from trtforge.core.onnxio import load_onnx, save_onnx
from trtforge.graph.index import io_specs, name_all_nodes
from trtforge.runtime.feeds import random_feeds


def _coverage(amax: dict[str, float], needed: list[str], cache: Path) -> None:
    missing = [t for t in needed if t not in amax]
    if missing:
        shown = ", ".join(f"'{m}'" for m in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise UserError(
            f"calibration cache {cache} lacks scales for {len(missing)} tensors the graph needs ({shown}); "
            "it was made for another model: recalibrate."
        )


def _needed_tensors(plan: QuantPlan, float_nodes: set[str]) -> list[str]:
    """Activation tensors whose scales the Q/DQ model needs once `float_nodes` stay float."""
    return plan.activation_tensors(quantized_nodes(plan, float_nodes) | set(residual_adds(plan, float_nodes)))


def _measure_smoothing(
    model: onnx.ModelProto, calib_batches: list, options: CalibrateOptions, progress: Callable[[str], None], progress_bar: Any
) -> dict[str, np.ndarray]:
    """SmoothQuant scales: one pass for per-channel abs-max of each smoothable activation."""
    from onnx import numpy_helper

    groups = smoothing_groups(model)
    progress(f"SmoothQuant alpha {options.smooth}: per-channel abs-max of {len(groups)} activations")
    stats = _collector(options)(model, calib_batches, [], list(groups), options.num_bins, progress_bar)
    inits = {i.name: i for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    return {
        tensor: smoothing_scales(
            stats.channel_amax[tensor], [numpy_helper.to_array(inits[nodes[m].input[1]]) for m in members], options.smooth
        )
        for tensor, members in groups.items()
    }


def _collector(options: CalibrateOptions) -> Callable[..., Any]:
    """collect() in this process, or sharded over Ray actors (the statistics merge exactly: same cache)."""
    if not options.ray:
        return collect
    from functools import partial

    from trtforge.scaleout.ray_calibrate import collect_ray

    return partial(collect_ray, address=options.ray, actors=options.ray_actors)


class _Lazy:
    """A value computed on first call, then kept."""

    def __init__(self, make: Callable[[], Any]):
        self._make, self._done, self._value = make, False, None

    def __call__(self) -> Any:
        if not self._done:
            self._value, self._done = self._make(), True
        return self._value


def _refuse_quantized(onnx_path: Path, model: Any) -> None:
    """A model that already holds Q/DQ nodes was quantized: calibrating it again would measure scales on rounded
    activations and stack a second Q/DQ pair on each tensor."""
    count = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    if count:
        from trtforge.core.artifacts import read_sidecar

        try:
            source = (read_sidecar(onnx_path, required=False) or {}).get("reference_onnx")
        except UserError:
            source = None
        origin = f" ({source})" if source else ""
        raise UserError(
            f"{onnx_path} is already quantized ({count} QuantizeLinear/DequantizeLinear nodes); calibrate the "
            f"float model it came from{origin} instead."
        )


def calibrate(
    onnx_path: Path,
    options: CalibrateOptions,
    compare_methods: bool = False,
    progress: Callable[[str], None] = lambda _: None,
    progress_bar: Any = None,
    engine_hooks: Any = None,
) -> CalibrateResult:
    """engine_hooks: engine_check.EngineHooks for the engine re-check (default: the real TensorRT runtime).

    Refuses outputs that would overwrite an input (artifacts.refuse_overwrite). Holds the Q/DQ ONNX's and the cache's
    locks from its reuse decision to its last write: two runs aimed at the same files run one after the other, so the
    files on disk always come from one run and the int8 sidecar's cache hash is the cache beside it."""
    start = time.perf_counter()
    onnx_path = Path(onnx_path)
    if options.method not in METHODS:
        raise UserError(f"unknown calibration method '{options.method}'; use entropy, percentile or minmax.")
    int8_path, cache_path = paths_for(onnx_path, options.output)
    refuse_overwrite("calibrate", [onnx_path, options.from_cache, options.data, options.eval_data], [int8_path, cache_path])
    with output_locks([int8_path, cache_path], waiting=progress):
        return _calibrate(onnx_path, int8_path, cache_path, options, compare_methods, progress, progress_bar, engine_hooks, start)


@dataclass
class _Source:
    """The graph to calibrate and what its sidecar chain says of it, read once for every later phase."""

    model: onnx.ModelProto
    specs: list[InputSpec]
    axes: dict[str, AxisRange]
    parent: dict[str, Any] | None
    graph_hash: str
    declared: dict[str, AxisRange] | None


@dataclass
class _CacheState:
    """The cache's fingerprint and the decision to reuse it, which the data check, the scales and both sidecars follow."""

    fingerprint: dict[str, Any]
    reused_sidecar: dict[str, Any] | None
    reason: str
    held_out_manifest: str


@dataclass
class _Prepared:
    """The calibration samples and the quantization plan on the (smoothed) graph, shared by the scale search and the records."""

    tokenizer: Any
    max_len: int
    samples: list[dict[str, np.ndarray]]
    calib_batches: list[dict[str, np.ndarray]]
    smooth_scales: dict[str, np.ndarray]
    working: onnx.ModelProto
    opt_sizes: dict[str, Any]
    plan: QuantPlan
    flops: dict[str, float]


@dataclass
class _HeldOut:
    """Held-out batches and the float model's outputs on them: what every accuracy check compares against."""

    eval_batches: list[dict[str, np.ndarray]]
    eval_refs: list[dict[str, np.ndarray]]
    sens_batches: list[dict[str, np.ndarray]]
    sens_refs: _Lazy
    kinds: dict[str, str | None]


@dataclass
class _Int8Model:
    """The Q/DQ graph of the chosen scales and what was measured on it, before any file is written."""

    qdq: onnx.ModelProto
    float_shares: dict[str, float]
    accuracy_json: dict[str, Any]


def _calibrate(
    onnx_path: Path,
    int8_path: Path,
    cache_path: Path,
    options: CalibrateOptions,
    compare_methods: bool,
    progress: Callable[[str], None],
    progress_bar: Any,
    engine_hooks: Any,
    start: float,
) -> CalibrateResult:
    source = _read_source(onnx_path)
    cache = _cache_state(cache_path, source, options, progress)
    if cache.reused_sidecar is not None:
        reused = _reused_int8(int8_path, cache_path, cache, source, options, engine_hooks, progress, start)
        if reused is not None:
            return reused
    prepared = _prepare(onnx_path, source, cache, options, progress, progress_bar)
    held = _held_out(onnx_path, source, prepared, options)
    if cache.reused_sidecar is not None:
        result, comparison = _reused_scales(cache_path, cache.reused_sidecar, prepared, held, options), []
    elif options.from_cache:
        result, comparison = _imported_scales(options.from_cache, prepared, held, options, progress), []
    else:
        comparison = _measured_scales(prepared, held, options, compare_methods, progress, progress_bar)
        result = next(r for r in comparison if r.method == options.method)
    int8 = _int8_model(prepared, held, result)
    # One unit, in this order: the cache, its sidecar naming the cache's hash, the Q/DQ ONNX, its sidecar naming both
    # hashes. A crash between any two leaves a sidecar that does not describe its file, which the next run's hash tells.
    with interrupts.deferred():
        if cache.reused_sidecar is None:
            cache_sha = _write_cache_files(onnx_path, cache_path, cache, prepared, result, options)
        else:
            cache_sha = cache.reused_sidecar["cache_sha256"]
        save_onnx(int8.qdq, int8_path)
        sidecar = _int8_sidecar(
            onnx_path, int8_path, cache_path, cache_sha, source, cache, prepared, int8, result, comparison, options, start
        )
        write_sidecar(int8_path, sidecar)
    sidecar["engine_check"] = _engine_check(int8_path, sidecar, options, engine_hooks, held.eval_batches, progress)
    write_sidecar(int8_path, sidecar)
    return CalibrateResult(
        int8_path, cache_path, cache.reused_sidecar is not None, cache.reason, result, sidecar, comparison, time.perf_counter() - start
    )


def _read_source(onnx_path: Path) -> _Source:
    """The graph, refused when already quantized, with every node named (the plan and the records name nodes)."""
    model = load_onnx(onnx_path)
    _refuse_quantized(onnx_path, model)
    name_all_nodes(model)
    specs, axes, parent = io_specs(onnx_path, model)
    graph_hash = (parent or {}).get("graph_hash") or onnx_graph_hash(model)
    # Axis ranges a sidecar declares bound the data; those read off a bare graph (1..64) are placeholders.
    declared = axes if parent and "inputs" in parent else None
    return _Source(model, specs, axes, parent, graph_hash, declared)


def _cache_state(cache_path: Path, source: _Source, options: CalibrateOptions, progress: Callable[[str], None]) -> _CacheState:
    """Whether the cache beside the output is reused (never silently: a cache not reused says why)."""
    dataset = data_mod.scan(options.data)
    fingerprint = expected_fingerprint(source.graph_hash, dataset.manifest_hash, options)
    reused_sidecar, reason = (
        (None, f"imported {options.from_cache}") if options.from_cache else cache_decision(cache_path, fingerprint, options.strict_cache)
    )
    if reused_sidecar is None and not options.from_cache and cache_path.exists():
        progress(reason)
    held_out_manifest = data_mod.scan(options.eval_data).manifest_hash if options.eval_data else dataset.manifest_hash
    return _CacheState(fingerprint, reused_sidecar, reason, held_out_manifest)


def _int8_key(cache_sha: str, source: _Source, cache: _CacheState, options: CalibrateOptions) -> str:
    """The reuse key the Q/DQ ONNX's sidecar records: made from this cache, graph and held-out data."""
    return int8_reuse_key(cache_sha, source.graph_hash, cache.held_out_manifest, options, source.parent)


def _reused_int8(
    int8_path: Path,
    cache_path: Path,
    cache: _CacheState,
    source: _Source,
    options: CalibrateOptions,
    engine_hooks: Any,
    progress: Callable[[str], None],
    start: float,
) -> CalibrateResult | None:
    """The recorded result when the Q/DQ ONNX beside a reused cache was verifiably made from it (None: write it again)."""
    assert cache.reused_sidecar is not None
    recorded, why = int8_decision(int8_path, _int8_key(cache.reused_sidecar["cache_sha256"], source, cache, options), options, engine_hooks)
    if recorded is None:
        progress(f"{why}; writing it again from the reused cache")
        return None
    progress(f"reused {why}: its recorded held-out results stand, nothing re-evaluated")
    return reuse_recorded(
        int8_path,
        cache_path,
        cache.reused_sidecar,
        recorded,
        f"{cache.reason}; reused {int8_path} and its recorded held-out results (verified)",
        options,
        start,
    )


def _prepare(
    onnx_path: Path,
    source: _Source,
    cache: _CacheState,
    options: CalibrateOptions,
    progress: Callable[[str], None],
    progress_bar: Any,
) -> _Prepared:
    """The calibration samples (the folder unchanged since its fingerprint), SmoothQuant's scales and the plan."""
    tokenizer = tokenizer_factory(onnx_path)
    max_len = max_sample_length(source.specs, source.axes)
    dataset, samples = data_mod.load_samples(options.data, source.specs, tokenizer, max_len, options.max_samples, source.declared)
    if dataset.manifest_hash != cache.fingerprint["data_manifest_hash"]:
        raise UserError(f"calibration data {options.data} changed while calibrate read it; run it again once the folder is settled.")
    recalibrate = cache.reused_sidecar is None and not options.from_cache
    calib_batches = list(data_mod.batches(samples, options.batch_size)) if recalibrate else []
    smooth_scales: dict[str, np.ndarray] = {}
    if cache.reused_sidecar is not None:
        smooth_scales = {k: np.asarray(v, dtype=np.float32) for k, v in (cache.reused_sidecar.get("smooth_scales") or {}).items()}
    elif recalibrate and options.smooth is not None:
        smooth_scales = _measure_smoothing(source.model, calib_batches, options, progress, progress_bar)
    working = apply_smoothing(source.model, smooth_scales) if smooth_scales else source.model
    # Shapes at the axes' opt sizes (the shape the engine is tuned for) drive the GEMV rule and the FLOPs.
    opt_sizes = {name: rng.opt for name, rng in source.axes.items()}
    shapes = gemm_shapes(source.model, random_feeds(source.specs, opt_sizes))
    plan = plan_quantization(working, shapes, options.quantize_attention)
    flops = gemm_flops(source.model, shapes)
    return _Prepared(tokenizer, max_len, samples, calib_batches, smooth_scales, working, opt_sizes, plan, flops)


def _held_out(onnx_path: Path, source: _Source, prepared: _Prepared, options: CalibrateOptions) -> _HeldOut:
    """The held-out samples (the calibration samples when no eval folder is given) and the float model's outputs."""
    eval_samples = prepared.samples
    if options.eval_data:
        _, eval_samples = data_mod.load_samples(
            options.eval_data, source.specs, prepared.tokenizer, prepared.max_len, options.max_eval_samples, source.declared
        )
    eval_batches = limited_batches(eval_samples, options.max_eval_samples)
    reference = OrtRunner(source.model.SerializeToString())
    kinds = output_kinds_of(reference, onnx_path, source.specs, source.axes)
    eval_refs = reference_outputs(reference, eval_batches)
    sens_batches = limited_batches(eval_samples, options.sensitivity_samples)
    sens_refs = _Lazy(lambda: reference_outputs(reference, sens_batches))  # only the fallback needs them
    return _HeldOut(eval_batches, eval_refs, sens_batches, sens_refs, kinds)


def _reused_scales(
    cache_path: Path, reused_sidecar: dict[str, Any], prepared: _Prepared, held: _HeldOut, options: CalibrateOptions
) -> MethodResult:
    """The reused cache's scales and float layers, evaluated again on this held-out data."""
    _, amax = read_cache(cache_path)
    float_nodes = set(reused_sidecar.get("float_nodes", []))
    _coverage(amax, _needed_tensors(prepared.plan, float_nodes), cache_path)
    accuracy = qdq_accuracy(prepared.working, prepared.plan, amax, float_nodes, held.eval_batches, held.eval_refs)
    return MethodResult(
        options.method,
        amax,
        sorted(float_nodes),
        accuracy,
        0.0,
        reused_sidecar.get("sensitivity", {}),
        reused_sidecar.get("layer_errors", {}),
    )


def _searched(
    method: str, amax: dict[str, float], prepared: _Prepared, held: _HeldOut, options: CalibrateOptions, progress: Callable[[str], None]
) -> MethodResult:
    """One method's scales with the float layers the accuracy fallback chose for them."""
    float_nodes, accuracy, sensitivity, errors = fallback_search(
        prepared.working,
        prepared.plan,
        amax,
        prepared.flops,
        held.eval_batches,
        held.eval_refs,
        held.sens_batches,
        held.sens_refs,
        options,
        progress,
    )
    return MethodResult(
        method,
        amax,
        sorted(float_nodes),
        accuracy,
        flops_fraction(prepared.flops, planned_int8(prepared.plan, float_nodes)),
        sensitivity,
        errors,
    )


def _imported_scales(
    from_cache: Path, prepared: _Prepared, held: _HeldOut, options: CalibrateOptions, progress: Callable[[str], None]
) -> MethodResult:
    """Scales imported from another cache (only the tensors this plan needs), then the accuracy fallback."""
    _, amax = read_cache(from_cache)
    _coverage(amax, prepared.plan.activation_tensors(), from_cache)
    result = _searched(options.method, amax, prepared, held, options, progress)
    result.amax = {t: amax[t] for t in prepared.plan.activation_tensors()}  # the search saw every imported scale
    return result


def _measured_scales(
    prepared: _Prepared,
    held: _HeldOut,
    options: CalibrateOptions,
    compare_methods: bool,
    progress: Callable[[str], None],
    progress_bar: Any,
) -> list[MethodResult]:
    """Histograms from one streamed pass, then each method's scales and float layers (every method when compared)."""
    tensors = prepared.plan.activation_tensors()
    progress(f"collecting histograms of {len(tensors)} tensors over {len(prepared.samples)} samples")
    stats = _collector(options)(prepared.working, prepared.calib_batches, tensors, None, options.num_bins, progress_bar)
    methods = list(METHODS) if compare_methods else [options.method]
    comparison = []
    for method in methods:
        amax = {t: compute_amax(stats.histograms[t], method, options.percentile) for t in tensors}
        comparison.append(_searched(method, amax, prepared, held, options, progress))
    return comparison


def _int8_model(prepared: _Prepared, held: _HeldOut, result: MethodResult) -> _Int8Model:
    """The Q/DQ graph, its real INT8 FLOPs share (set on `result`) and its task metrics on the held-out data."""
    qdq = insert_qdq(prepared.working, prepared.plan, result.amax, set(result.float_nodes))
    # What really runs int8 is read off the written graph: both GEMM inputs behind a DequantizeLinear.
    int8_nodes = int8_gemm_nodes(qdq)
    result.int8_flops_fraction = flops_fraction(prepared.flops, int8_nodes)
    float_shares = float_flops_shares(prepared.flops, int8_nodes, prepared.plan.excluded, set(result.float_nodes))
    # Task metrics by output kind (top-1 / pixel agreement) on the held-out data, for the chosen model.
    accuracy_json = evaluate(OrtRunner(qdq.SerializeToString()), held.eval_batches, held.eval_refs, held.kinds).to_json()
    accuracy_json["output_kinds"] = held.kinds
    return _Int8Model(qdq, float_shares, accuracy_json)


def _write_cache_files(
    onnx_path: Path, cache_path: Path, cache: _CacheState, prepared: _Prepared, result: MethodResult, options: CalibrateOptions
) -> str:
    """The cache, then its sidecar naming the cache's hash; returns that hash."""
    cache_sha = write_cache(cache_path, result.amax, result.method)
    cache_sidecar = {
        **cache.fingerprint,
        "kind": "calibration_cache",
        "cache_sha256": cache_sha,
        "tensors": result.amax,
        "smooth_scales": {k: v.tolist() for k, v in prepared.smooth_scales.items()},
        "float_nodes": result.float_nodes,
        "sensitivity": result.sensitivity,
        "layer_errors": result.layer_errors,
        "excluded": prepared.plan.excluded,
        "samples": len(prepared.samples),
        "data": str(options.data),
        "source_onnx": str(onnx_path),
    }
    write_sidecar(cache_path, cache_sidecar)
    return cache_sha


def _int8_sidecar(
    onnx_path: Path,
    int8_path: Path,
    cache_path: Path,
    cache_sha: str,
    source: _Source,
    cache: _CacheState,
    prepared: _Prepared,
    int8: _Int8Model,
    result: MethodResult,
    comparison: list[MethodResult],
    options: CalibrateOptions,
    start: float,
) -> dict[str, Any]:
    """The Q/DQ ONNX's sidecar (once the file is written: it names its hash), what build and a later reuse read."""
    parent = source.parent or {}
    return {
        "kind": "onnx",
        "step": "calibrate",
        "trtforge_version": __version__,
        "parent": os.path.abspath(onnx_path),
        "reference_onnx": os.path.abspath(onnx_path),
        "parent_graph_hash": source.graph_hash,
        "graph_hash": onnx_graph_hash(int8.qdq),
        "sha256": content_sha256(int8_path),
        "reuse_key": _int8_key(cache_sha, source, cache, options),
        "inputs": [s.model_dump() for s in source.specs],
        "axes": {k: v.model_dump() for k, v in source.axes.items()},
        "outputs": parent.get("outputs"),
        "source": parent.get("source"),
        "config_name": parent.get("config_name"),
        "cache": str(cache_path),
        "cache_sha256": cache_sha,
        "cache_reused": cache.reused_sidecar is not None,
        "cache_reason": cache.reason,
        "method": result.method,
        "smooth": options.smooth if prepared.smooth_scales else None,
        "quantized_nodes": len(prepared.plan.targets) - len(result.float_nodes),
        "float_nodes": result.float_nodes,
        "excluded": prepared.plan.excluded,
        "quantize_attention": options.quantize_attention,
        "int8_gemm_flops_fraction": result.int8_flops_fraction,
        "float_gemm_flops": int8.float_shares,
        "accuracy": int8.accuracy_json,
        **gate_record(options),
        "flops_at": prepared.opt_sizes,
        "seconds": round(time.perf_counter() - start, 3),
        "comparison": [
            {
                "method": r.method,
                "mean_cosine": r.accuracy.mean_cosine if r.accuracy else None,
                "min_cosine": r.accuracy.min_cosine if r.accuracy else None,
                "int8_gemm_flops_fraction": r.int8_flops_fraction,
                "float_nodes": len(r.float_nodes),
            }
            for r in comparison
        ],
    }


def _engine_check(
    int8_path: Path, sidecar: dict[str, Any], options: CalibrateOptions, hooks: Any, eval_batches: list, progress: Callable[[str], None]
) -> dict[str, Any]:

    if not options.engine_check:
        return {"status": "skipped", "message": "engine re-check: skipped (turned off)", "reason": options.engine_check_off}
    return recheck.after_calibrate(int8_path, sidecar, hooks, eval_batches, progress)


def output_kinds_of(reference: OrtRunner, onnx_path: Path, specs: list[InputSpec], axes: dict[str, AxisRange]) -> dict[str, str | None]:
    """{output: kind or None}: declared in the sidecar chain or inferred (None where undecidable: metrics only)."""
    from trtforge.core.layout import model_layout
    from trtforge.graph.probe import output_kinds

    return {name: k.kind for name, k in output_kinds(reference, onnx_path, specs, axes, model_layout(specs), strict=False).items()}
