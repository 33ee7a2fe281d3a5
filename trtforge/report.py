"""Latency statistics and the run report's schema. Pure functions on plain numbers.

The report is one JSON document, schema `trtforge.run/1` (documented in the README): what ran, the two
error kinds (precision: engine vs ONNX Runtime fp32 on identical chunks; chunking: chunked-and-merged
vs one whole pass), latency percentiles per profile, throughput, memory and the gates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SCHEMA = "trtforge.run/1"


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"count": 0}
    values = np.asarray(samples_ms, dtype=np.float64)
    return {"count": int(values.size), "mean_ms": float(values.mean()), "p50_ms": float(np.percentile(values, 50)),
            "p90_ms": float(np.percentile(values, 90)), "p99_ms": float(np.percentile(values, 99)),
            "min_ms": float(values.min()), "max_ms": float(values.max())}


def merge_metrics(per_output: dict[str, dict[str, float]]) -> dict[str, float]:
    """Worst case across outputs: the largest errors, the smallest agreements."""
    worst: dict[str, float] = {}
    for metrics in per_output.values():
        for key, value in metrics.items():
            if key in ("rel_l2", "max_abs"):
                worst[key] = max(worst.get(key, value), value)
            else:
                worst[key] = min(worst.get(key, value), value)
    return worst


def gate_failures(report: dict[str, Any], max_rel_l2: float, min_cosine: float, min_chunk_cosine: float | None) -> list[str]:
    """Precision gates always apply; the chunking gate only when set, since chunking a context model
    (BERT with absolute positions) changes its result by design and the right floor is model-specific."""
    failures = []
    precision = report.get("precision_error") or {}
    worst = precision.get("worst") or {}
    if worst and worst.get("rel_l2", 0.0) > max_rel_l2:
        failures.append(f"precision error rel-L2 {worst['rel_l2']:.3g} > {max_rel_l2:g}")
    if worst and worst.get("cosine", 1.0) < min_cosine:
        failures.append(f"precision error cosine {worst['cosine']:.5f} < {min_cosine:g}")
    chunking = report.get("chunking_error") or {}
    if min_chunk_cosine is not None and chunking.get("min_pooled_cosine") is not None and chunking["min_pooled_cosine"] < min_chunk_cosine:
        failures.append(f"chunking error: pooled cosine {chunking['min_pooled_cosine']:.5f} < {min_chunk_cosine:g}")
    return failures
