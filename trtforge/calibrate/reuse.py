"""When a calibration may be reused instead of run again: the fingerprint a cache and an INT8 ONNX must match, and what their sidecars recorded."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtforge import __version__
from trtforge.calibrate.cache import cache_mismatch, read_cache
from trtforge.calibrate.options import CalibrateOptions, CalibrateResult, MethodResult, gate_record
from trtforge.calibrate.placement import PLACEMENT_VERSION
from trtforge.core.artifacts import (
    content_mismatch,
    read_sidecar,
    sha256_bytes,
    write_sidecar,
)
from trtforge.core.errors import UserError


def expected_fingerprint(graph_hash: str, manifest: str, options: CalibrateOptions) -> dict[str, Any]:
    params: dict[str, Any] = {
        "num_bins": options.num_bins,
        "max_samples": options.max_samples,
        "smooth": options.smooth,
        "fallback": options.fallback,
        "min_cosine": options.min_cosine,
        "min_int8_flops": options.min_int8_flops,
        "quantize_attention": options.quantize_attention,
        "placement": PLACEMENT_VERSION,
    }
    if options.method == "percentile":
        params["percentile"] = options.percentile
    return {
        "graph_hash": graph_hash,
        "data_manifest_hash": manifest,
        "method": options.method,
        "params": params,
        "trtforge_version": __version__,
    }


def cache_decision(cache: Path, fingerprint: dict[str, Any], strict: bool) -> tuple[dict[str, Any] | None, str]:
    """(the sidecar to reuse, or None; why). Never reuses silently: every outcome has a reason. Reused only when the
    sidecar matches and the cache is the file it recorded (its bytes, its header's algorithm)."""
    if not cache.exists():
        return None, "no cache yet"
    try:
        sidecar = read_sidecar(cache, required=False)
    except UserError as exc:
        sidecar, unreadable = None, str(exc)
    else:
        unreadable = None
    if sidecar is None:
        why = unreadable.rstrip(".") if unreadable else f"cache {cache} has no sidecar, so what it was computed from is unknown"
    else:
        diffs = [k for k in fingerprint if sidecar.get(k) != fingerprint[k]]
        labels = {
            "graph_hash": "another model graph",
            "data_manifest_hash": "other calibration data",
            "method": "another method",
            "params": "other parameters",
            "trtforge_version": "another trtforge version",
        }
        mismatch = None if diffs else cache_mismatch(cache, sidecar, fingerprint["method"])
        if not diffs and not mismatch:
            return sidecar, f"reused {cache}: graph, data, method and parameters match and the cache is the file its sidecar recorded"
        why = f"cache {cache} was made for {', '.join(labels[d] for d in diffs)}" if diffs else str(mismatch)
    if strict:
        raise UserError(f"{why}; delete it or run without --strict-cache to recalibrate.")
    return None, why + "; recalibrating"


@dataclass
class RecordedAccuracy:
    """Held-out accuracy as a sidecar recorded it (a verified reuse evaluates nothing): what Accuracy's readers use."""

    mean_cosine: float
    min_cosine: float
    per_output: dict[str, dict[str, float]] = field(default_factory=dict)


def int8_reuse_key(
    cache_sha256: str, graph_hash: str, held_out_manifest: str, options: CalibrateOptions, parent: dict[str, Any] | None
) -> str:
    """What the Q/DQ ONNX's recorded results depend on beyond its cache (whose own sidecar covers graph, data, method
    and parameters): the held-out data and its limit, the declared output kinds, and whether the engine re-check runs."""
    return sha256_bytes(
        json.dumps(
            {
                "cache_sha256": cache_sha256,
                "parent_graph_hash": graph_hash,
                "held_out_manifest_hash": held_out_manifest,
                "max_eval_samples": options.max_eval_samples,
                "outputs": (parent or {}).get("outputs"),
                "engine_check": options.engine_check,
                "trtforge_version": __version__,
            },
            sort_keys=True,
            default=str,
        ).encode()
    )


def int8_decision(int8_path: Path, key: str, options: CalibrateOptions, hooks: Any) -> tuple[dict[str, Any] | None, str]:
    """(the Q/DQ ONNX's sidecar whose results stand, or None; why). Its results stand when the sidecar was written for
    `key` and the file (weights included) is the one it recorded. An engine re-check that was skipped for want of a
    runtime is run now where one has appeared."""
    if not int8_path.exists():
        return None, f"no Q/DQ ONNX {int8_path} yet"
    try:
        side = read_sidecar(int8_path, required=False)
    except UserError as exc:
        return None, str(exc).rstrip(".")
    if not side or side.get("step") != "calibrate":
        return None, f"{int8_path} has no calibrate sidecar"
    if side.get("reuse_key") != key:
        return None, f"{int8_path} was made from another cache, held-out data or options"
    why = content_mismatch(int8_path, side.get("sha256"))
    if why:
        return None, why
    check = side.get("engine_check") or {}
    if options.engine_check and check.get("status") == "skipped":
        from trtforge.calibrate.engine_check import runtime_hooks

        if (hooks or runtime_hooks()).available()[0]:
            return None, f"{int8_path}'s engine re-check was skipped and can run here"
    return side, f"{int8_path} is the file its sidecar recorded, made from this cache for the same held-out data"


def reuse_recorded(
    int8_path: Path,
    cache_path: Path,
    cache_sidecar: dict[str, Any],
    side: dict[str, Any],
    reason: str,
    options: CalibrateOptions,
    start: float,
) -> CalibrateResult:
    """A verified reuse: the cache's scales and the Q/DQ ONNX's recorded results, nothing evaluated or rewritten but the
    sidecar's account of this run (reused, why, the gates and held-out paths asked for now)."""
    _, amax = read_cache(cache_path)
    acc = side.get("accuracy") or {}
    accuracy = RecordedAccuracy(acc["mean_cosine"], acc["min_cosine"], acc.get("per_output") or {}) if acc else None
    result = MethodResult(
        side["method"],
        amax,
        list(side.get("float_nodes") or []),
        accuracy,
        side["int8_gemm_flops_fraction"],
        cache_sidecar.get("sensitivity", {}),
        cache_sidecar.get("layer_errors", {}),
    )
    side = {
        **side,
        "cache_reused": True,
        "cache_reason": reason,
        **gate_record(options),
    }
    write_sidecar(int8_path, side)
    return CalibrateResult(int8_path, cache_path, True, reason, result, side, [], time.perf_counter() - start)
