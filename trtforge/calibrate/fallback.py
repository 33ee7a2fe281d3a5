"""calibrate's accuracy-driven fallback: which quantized layers stay float, bounded by the share of GEMM FLOPs left in INT8."""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate.collect import QuantPlan
from trtforge.calibrate.evaluate import Accuracy, evaluate
from trtforge.calibrate.options import CalibrateOptions
from trtforge.calibrate.quantize import insert_qdq, quantized_nodes
from trtforge.calibrate.sensitivity import layer_errors


def flops_fraction(flops: dict[str, float], int8_nodes: set[str]) -> float:
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


def planned_int8(plan: QuantPlan, float_nodes: set[str]) -> set[str]:
    """GEMMs that run int8 once `float_nodes` stay float: targets with every input quantized (a target
    whose weight is not a constant, e.g. a Conv with a computed kernel, has a float input)."""
    live = quantized_nodes(plan, float_nodes)
    return {t.node for t in plan.targets if t.node in live and (t.weight is not None or len(t.activations) == 2)}


def qdq_accuracy(
    model: onnx.ModelProto,
    plan: QuantPlan,
    amax: dict[str, float],
    float_nodes: set[str],
    batches: list[dict[str, np.ndarray]],
    refs: list[dict[str, np.ndarray]],
) -> Accuracy:
    """The Q/DQ model's accuracy against the float model's outputs, with `float_nodes` kept float."""
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
    accuracy = qdq_accuracy(model, plan, amax, float_nodes, eval_batches, eval_refs)
    if not options.fallback or accuracy.mean_cosine >= options.min_cosine:
        return float_nodes, accuracy, {}, {}
    progress(f"mean cosine {accuracy.mean_cosine:.4f} < {options.min_cosine}: ranking layers by their local INT8 error")
    errors = layer_errors(model, plan, amax, sens_batches)
    sens_refs = sens_refs() if callable(sens_refs) else sens_refs
    ranked = sorted(errors, key=lambda n: -errors[n])
    top = ranked[: options.sensitivity_top]
    base = qdq_accuracy(model, plan, amax, set(), sens_batches, sens_refs).mean_cosine
    sensitivity = {node: qdq_accuracy(model, plan, amax, {node}, sens_batches, sens_refs).mean_cosine - base for node in top}
    order = sorted(top, key=lambda n: -sensitivity[n]) + ranked[len(top) :]
    for node in order:
        if node in sensitivity and sensitivity[node] <= 0:
            continue  # measured: keeping it float does not help
        if flops_fraction(flops, planned_int8(plan, float_nodes | {node})) < options.min_int8_flops:
            continue  # too expensive to keep in float; a cheaper sensitive layer may still fit
        float_nodes.add(node)
        accuracy = qdq_accuracy(model, plan, amax, float_nodes, eval_batches, eval_refs)
        progress(
            f"kept {node} in float: mean cosine {accuracy.mean_cosine:.4f}, "
            f"INT8 FLOPs {flops_fraction(flops, planned_int8(plan, float_nodes)):.1%}"
        )
        if accuracy.mean_cosine >= options.min_cosine:
            break
    return float_nodes, accuracy, sensitivity, errors
