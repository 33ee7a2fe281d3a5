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
from trtforge.calibrate.evaluate import Accuracy, evaluate, reference_outputs
from trtforge.calibrate.methods import compute_amax
from trtforge.calibrate.options import METHODS, CalibrateOptions, CalibrateResult, MethodResult, gate_record, paths_for
from trtforge.calibrate.quantize import (
    insert_qdq,
    int8_gemm_nodes,
    quantized_nodes,
    residual_adds,
)
from trtforge.calibrate.reuse import cache_decision, expected_fingerprint, int8_decision, int8_reuse_key, reuse_recorded
from trtforge.calibrate.sensitivity import layer_errors
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


def _flops_fraction(flops: dict[str, float], int8_nodes: set[str]) -> float:
    """Share of all GEMM FLOPs (excluded and float layers included) in nodes that really run int8."""
    total = sum(flops.values())
    return 1.0 if total == 0 else sum(v for k, v in flops.items() if k in int8_nodes) / total


# Where the GEMM FLOPs that do not run int8 went, by the reason they stay float (the exclusion rules, the fallback).


def float_flops_shares(flops: dict[str, float], int8_nodes: set[str], excluded: dict[str, str], float_nodes: set[str]) -> dict[str, float]:
    """Share of all GEMM FLOPs in nodes that do not run int8, by why: an exclusion rule, the fallback, or other."""
    total = sum(flops.values())
    shares: dict[str, float] = {}
    for node, value in flops.items():
        if total and node not in int8_nodes:
            why = excluded.get(node) or ("fallback" if node in float_nodes else "other")
            shares[why] = shares.get(why, 0.0) + value / total
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def _planned_int8(plan: QuantPlan, float_nodes: set[str]) -> set[str]:
    """GEMMs that run int8 once `float_nodes` stay float: targets with every input quantized (a target
    whose weight is not a constant, e.g. a Conv with a computed kernel, has a float input)."""
    live = quantized_nodes(plan, float_nodes)
    return {t.node for t in plan.targets if t.node in live and (t.weight is not None or len(t.activations) == 2)}


def _accuracy(
    model: onnx.ModelProto,
    plan: QuantPlan,
    amax: dict[str, float],
    float_nodes: set[str],
    batches: list[dict[str, np.ndarray]],
    refs: list[dict[str, np.ndarray]],
) -> Accuracy:
    qdq = insert_qdq(model, plan, amax, float_nodes)
    return evaluate(OrtRunner(qdq.SerializeToString()), batches, refs)


def fallback_search(
    model: onnx.ModelProto,
    plan: QuantPlan,
    amax: dict[str, float],
    flops: dict[str, float],
    eval_batches: list,
    eval_refs: list,
    sens_batches: list,
    sens_refs: list,
    options: CalibrateOptions,
    progress: Callable[[str], None],
) -> tuple[set[str], Accuracy, dict[str, float]]:
    """Keep the most sensitive layers in float until the gate holds or the INT8 FLOPs floor is reached.

    Order: the top `sensitivity_top` layers by local error, re-ranked by their measured end-to-end gain
    (leave one out), then the rest by local error. Returns (float nodes, accuracy, leave-one-out gains,
    local errors)."""
    float_nodes: set[str] = set()
    accuracy = _accuracy(model, plan, amax, float_nodes, eval_batches, eval_refs)
    if not options.fallback or accuracy.mean_cosine >= options.min_cosine:
        return float_nodes, accuracy, {}, {}
    progress(f"mean cosine {accuracy.mean_cosine:.4f} < {options.min_cosine}: ranking layers by their local INT8 error")
    errors = layer_errors(model, plan, amax, sens_batches)
    sens_refs = sens_refs() if callable(sens_refs) else sens_refs
    ranked = sorted(errors, key=lambda n: -errors[n])
    top = ranked[: options.sensitivity_top]
    base = _accuracy(model, plan, amax, set(), sens_batches, sens_refs).mean_cosine
    sensitivity = {node: _accuracy(model, plan, amax, {node}, sens_batches, sens_refs).mean_cosine - base for node in top}
    order = sorted(top, key=lambda n: -sensitivity[n]) + ranked[len(top) :]
    for node in order:
        if node in sensitivity and sensitivity[node] <= 0:
            continue  # measured: keeping it float does not help
        if _flops_fraction(flops, _planned_int8(plan, float_nodes | {node})) < options.min_int8_flops:
            continue  # too expensive to keep in float; a cheaper sensitive layer may still fit
        float_nodes.add(node)
        accuracy = _accuracy(model, plan, amax, float_nodes, eval_batches, eval_refs)
        progress(
            f"kept {node} in float: mean cosine {accuracy.mean_cosine:.4f}, "
            f"INT8 FLOPs {_flops_fraction(flops, _planned_int8(plan, float_nodes)):.1%}"
        )
        if accuracy.mean_cosine >= options.min_cosine:
            break
    return float_nodes, accuracy, sensitivity, errors


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
    model = load_onnx(onnx_path)
    _refuse_quantized(onnx_path, model)
    name_all_nodes(model)
    specs, axes, parent = io_specs(onnx_path, model)
    graph_hash = (parent or {}).get("graph_hash") or onnx_graph_hash(model)
    # Axis ranges a sidecar declares bound the data; those read off a bare graph (1..64) are placeholders.
    declared = axes if parent and "inputs" in parent else None
    dataset = data_mod.scan(options.data)
    fingerprint = expected_fingerprint(graph_hash, dataset.manifest_hash, options)

    reused_sidecar, reason = (
        (None, f"imported {options.from_cache}") if options.from_cache else cache_decision(cache_path, fingerprint, options.strict_cache)
    )
    if reused_sidecar is None and not options.from_cache and cache_path.exists():
        progress(reason)
    held_out_manifest = data_mod.scan(options.eval_data).manifest_hash if options.eval_data else dataset.manifest_hash
    if reused_sidecar is not None:
        recorded, why = int8_decision(
            int8_path, int8_reuse_key(reused_sidecar["cache_sha256"], graph_hash, held_out_manifest, options, parent), options, engine_hooks
        )
        if recorded is not None:
            progress(f"reused {why}: its recorded held-out results stand, nothing re-evaluated")
            return reuse_recorded(
                int8_path,
                cache_path,
                reused_sidecar,
                recorded,
                f"{reason}; reused {int8_path} and its recorded held-out results (verified)",
                options,
                start,
            )
        progress(f"{why}; writing it again from the reused cache")
    tokenizer = tokenizer_factory(onnx_path)
    max_len = max_sample_length(specs, axes)
    dataset, samples = data_mod.load_samples(options.data, specs, tokenizer, max_len, options.max_samples, declared)
    if dataset.manifest_hash != fingerprint["data_manifest_hash"]:
        raise UserError(f"calibration data {options.data} changed while calibrate read it; run it again once the folder is settled.")
    recalibrate = reused_sidecar is None and not options.from_cache
    calib_batches = list(data_mod.batches(samples, options.batch_size)) if recalibrate else []
    smooth_scales: dict[str, np.ndarray] = {}
    if reused_sidecar is not None:
        smooth_scales = {k: np.asarray(v, dtype=np.float32) for k, v in (reused_sidecar.get("smooth_scales") or {}).items()}
    elif recalibrate and options.smooth is not None:
        smooth_scales = _measure_smoothing(model, calib_batches, options, progress, progress_bar)
    working = apply_smoothing(model, smooth_scales) if smooth_scales else model
    # Shapes at the axes' opt sizes (the shape the engine is tuned for) drive the GEMV rule and the FLOPs.
    opt_sizes = {name: rng.opt for name, rng in axes.items()}
    shapes = gemm_shapes(model, random_feeds(specs, opt_sizes))
    plan = plan_quantization(working, shapes, options.quantize_attention)

    eval_samples = samples
    if options.eval_data:
        _, eval_samples = data_mod.load_samples(options.eval_data, specs, tokenizer, max_len, options.max_eval_samples, declared)
    eval_batches = limited_batches(eval_samples, options.max_eval_samples)
    reference = OrtRunner(model.SerializeToString())
    kinds = output_kinds_of(reference, onnx_path, specs, axes)
    eval_refs = reference_outputs(reference, eval_batches)
    sens_batches = limited_batches(eval_samples, options.sensitivity_samples)
    sens_refs = _Lazy(lambda: reference_outputs(reference, sens_batches))  # only the fallback needs them
    flops = gemm_flops(model, shapes)

    if reused_sidecar is not None:
        _, amax = read_cache(cache_path)
        float_nodes = set(reused_sidecar.get("float_nodes", []))
        _coverage(amax, _needed_tensors(plan, float_nodes), cache_path)
        accuracy = _accuracy(working, plan, amax, float_nodes, eval_batches, eval_refs)
        result = MethodResult(
            options.method,
            amax,
            sorted(float_nodes),
            accuracy,
            0.0,
            reused_sidecar.get("sensitivity", {}),
            reused_sidecar.get("layer_errors", {}),
        )
        comparison: list[MethodResult] = []
    elif options.from_cache:
        _, amax = read_cache(options.from_cache)
        _coverage(amax, plan.activation_tensors(), options.from_cache)
        float_nodes, accuracy, sensitivity, errors = fallback_search(
            working, plan, amax, flops, eval_batches, eval_refs, sens_batches, sens_refs, options, progress
        )
        result = MethodResult(
            options.method,
            {t: amax[t] for t in plan.activation_tensors()},
            sorted(float_nodes),
            accuracy,
            _flops_fraction(flops, _planned_int8(plan, float_nodes)),
            sensitivity,
            errors,
        )
        comparison = []
    else:
        tensors = plan.activation_tensors()
        progress(f"collecting histograms of {len(tensors)} tensors over {len(samples)} samples")
        stats = _collector(options)(working, calib_batches, tensors, None, options.num_bins, progress_bar)
        methods = list(METHODS) if compare_methods else [options.method]
        comparison = []
        for method in methods:
            amax = {t: compute_amax(stats.histograms[t], method, options.percentile) for t in tensors}
            float_nodes, accuracy, sensitivity, errors = fallback_search(
                working, plan, amax, flops, eval_batches, eval_refs, sens_batches, sens_refs, options, progress
            )
            comparison.append(
                MethodResult(
                    method,
                    amax,
                    sorted(float_nodes),
                    accuracy,
                    _flops_fraction(flops, _planned_int8(plan, float_nodes)),
                    sensitivity,
                    errors,
                )
            )
        result = next(r for r in comparison if r.method == options.method)

    qdq = insert_qdq(working, plan, result.amax, set(result.float_nodes))
    # What really runs int8 is read off the written graph: both GEMM inputs behind a DequantizeLinear.
    int8_nodes = int8_gemm_nodes(qdq)
    result.int8_flops_fraction = _flops_fraction(flops, int8_nodes)
    float_shares = float_flops_shares(flops, int8_nodes, plan.excluded, set(result.float_nodes))
    # Task metrics by output kind (top-1 / pixel agreement) on the held-out data, for the chosen model.
    accuracy_json = evaluate(OrtRunner(qdq.SerializeToString()), eval_batches, eval_refs, kinds).to_json()
    accuracy_json["output_kinds"] = kinds
    # One unit, in this order: the cache, its sidecar naming the cache's hash, the Q/DQ ONNX, its sidecar naming both
    # hashes. A crash between any two leaves a sidecar that does not describe its file, which the next run's hash tells.
    with interrupts.deferred():
        if reused_sidecar is None:
            cache_sha = write_cache(cache_path, result.amax, result.method)
            cache_sidecar = {
                **fingerprint,
                "kind": "calibration_cache",
                "cache_sha256": cache_sha,
                "tensors": result.amax,
                "smooth_scales": {k: v.tolist() for k, v in smooth_scales.items()},
                "float_nodes": result.float_nodes,
                "sensitivity": result.sensitivity,
                "layer_errors": result.layer_errors,
                "excluded": plan.excluded,
                "samples": len(samples),
                "data": str(options.data),
                "source_onnx": str(onnx_path),
            }
            write_sidecar(cache_path, cache_sidecar)
        else:
            cache_sha = reused_sidecar["cache_sha256"]
        save_onnx(qdq, int8_path)
        sidecar = {
            "kind": "onnx",
            "step": "calibrate",
            "trtforge_version": __version__,
            "parent": os.path.abspath(onnx_path),
            "reference_onnx": os.path.abspath(onnx_path),
            "parent_graph_hash": graph_hash,
            "graph_hash": onnx_graph_hash(qdq),
            "sha256": content_sha256(int8_path),
            "reuse_key": int8_reuse_key(cache_sha, graph_hash, held_out_manifest, options, parent),
            "inputs": [s.model_dump() for s in specs],
            "axes": {k: v.model_dump() for k, v in axes.items()},
            "outputs": (parent or {}).get("outputs"),
            "source": (parent or {}).get("source"),
            "config_name": (parent or {}).get("config_name"),
            "cache": str(cache_path),
            "cache_sha256": cache_sha,
            "cache_reused": reused_sidecar is not None,
            "cache_reason": reason,
            "method": result.method,
            "smooth": options.smooth if smooth_scales else None,
            "quantized_nodes": len(plan.targets) - len(result.float_nodes),
            "float_nodes": result.float_nodes,
            "excluded": plan.excluded,
            "quantize_attention": options.quantize_attention,
            "int8_gemm_flops_fraction": result.int8_flops_fraction,
            "float_gemm_flops": float_shares,
            "accuracy": accuracy_json,
            **gate_record(options),
            "flops_at": opt_sizes,
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
        write_sidecar(int8_path, sidecar)
    sidecar["engine_check"] = _engine_check(int8_path, sidecar, options, engine_hooks, eval_batches, progress)
    write_sidecar(int8_path, sidecar)
    return CalibrateResult(
        int8_path, cache_path, reused_sidecar is not None, reason, result, sidecar, comparison, time.perf_counter() - start
    )


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
