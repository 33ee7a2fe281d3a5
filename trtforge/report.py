"""Latency statistics and the run report's schema. Pure functions on plain numbers.

The report is one JSON document, schema `trtforge.run/2` (documented in the README): what ran, each
output's kind, the two error kinds (precision: engine vs ONNX Runtime fp32 on identical chunks;
chunking: chunked-and-merged vs one whole pass), each either measured (metrics per output, by kind)
or not (with the reason), latency percentiles per profile, throughput, memory and the gates.

Gate rule: every gate whose threshold was SET (a flag or a config key) is evaluated or fails saying
why it could not be (the error was not measured, or no output has the metric). The two precision
gates have defaults (max_rel_l2 1e-2, min_cosine 0.99; an INT8 or FP8-GEMM target only min_cosine) that apply when
precision is measured and are listed as not evaluated, without failing, when it is not (a target that is
its own reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

SCHEMA = "trtforge.run/2"


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"count": 0}
    values = np.asarray(samples_ms, dtype=np.float64)
    return {"count": int(values.size), "mean_ms": float(values.mean()), "p50_ms": float(np.percentile(values, 50)),
            "p90_ms": float(np.percentile(values, 90)), "p99_ms": float(np.percentile(values, 99)),
            "min_ms": float(values.min()), "max_ms": float(values.max())}


@dataclass(frozen=True)
class GateSpec:
    key: str  # the config key under `run` / `calibrate`, and the flag --key-with-dashes
    section: str  # the report section whose metrics it reads
    metric: str
    bound: str  # "max" | "min"
    label: str


GATES = {
    "max_rel_l2": GateSpec("max_rel_l2", "precision_error", "rel_l2", "max", "precision rel-L2"),
    "min_cosine": GateSpec("min_cosine", "precision_error", "cosine", "min", "precision cosine"),
    "min_top1_agreement": GateSpec("min_top1_agreement", "precision_error", "top1_agreement", "min", "precision top-1 agreement"),
    "min_pixel_agreement": GateSpec("min_pixel_agreement", "precision_error", "pixel_agreement", "min", "precision pixel agreement"),
    "min_chunk_cosine": GateSpec("min_chunk_cosine", "chunking_error", "min_item_cosine", "min", "chunking item cosine"),
}
DEFAULTS = {"max_rel_l2": 1e-2, "min_cosine": 0.99}
# INT8 targets are judged by cosine alone by default, like calibrate's held-out gate: INT8 rounding puts
# rel-L2 at 2-9% on engines whose cosine is 0.997-0.9998 (H200, TensorRT 8.6: BERT-base 0.025, MiniLM
# 0.085), so the fp16-level rel-L2 default would fail every healthy INT8 engine. --max-rel-l2 still sets one.
# FP8 GEMMs (build --gemm-precision fp8) likewise: rel-L2 0.07 (BERT-base) and 0.10 (MiniLM) at cosine 0.998 / 0.995 on
# real text (H100, 2026-12-06 w37c), judged at build by the engine's cosine (build.fp8_min_cosine).
INT8_PRECISIONS = ("int8", "best", "fp8")
INT8_DEFAULTS = {"min_cosine": 0.99}
INT8_NOTE = ("max_rel_l2 has no default for an INT8 or FP8-GEMM target (its rounding error is judged by cosine, as "
             "calibrate's and build's gates); set --max-rel-l2 to gate it")


@dataclass(frozen=True)
class Gate:
    key: str
    threshold: float
    source: str  # "set" (a flag or config key) | "default"


def gates_from(values: dict[str, float | None], precision: str | None = None) -> list[Gate]:
    """Gates from {key: threshold or None}; None takes the key's default for the target's precision, if any."""
    defaults = INT8_DEFAULTS if precision in INT8_PRECISIONS else DEFAULTS
    gates = []
    for key, spec in GATES.items():
        value = values.get(key)
        if value is not None:
            gates.append(Gate(key, float(value), "set"))
        elif key in defaults:
            gates.append(Gate(key, defaults[key], "default"))
    return gates


def gate_notes(values: dict[str, float | None], precision: str | None) -> list[str]:
    """What the report says about defaults left out for this precision."""
    return [INT8_NOTE] if precision in INT8_PRECISIONS and values.get("max_rel_l2") is None else []


def target_precision(engine_sidecar: dict[str, Any] | None, onnx_sidecar: dict[str, Any] | None) -> str | None:
    """An engine's build precision ('fp8' for an fp16 engine whose GEMMs are FP8); for an ONNX target, 'int8' when
    calibrate wrote it (a Q/DQ model)."""
    if engine_sidecar is not None:
        if (engine_sidecar.get("gemm_precision") or {}).get("precision") == "fp8":
            return "fp8"
        return engine_sidecar.get("precision")
    side = onnx_sidecar or {}
    if side.get("step") == "calibrate":
        return "int8"
    return side.get("precision") if side.get("precision") in INT8_PRECISIONS else None  # build's NAME.best.onnx


def evaluate_gates(report: dict[str, Any], gates: list[Gate]) -> dict[str, Any]:
    """{passed, failures[], checked[]}: each gate's worst value over the outputs that carry its metric."""
    failures, checked = [], []
    for gate in gates:
        spec = GATES[gate.key]
        section = report.get(spec.section) or {}
        entry: dict[str, Any] = {"gate": gate.key, "threshold": gate.threshold, "source": gate.source}
        checked.append(entry)
        if not section.get("measured"):
            why = section.get("reason", "not measured")
            entry.update(status="not evaluated", reason=why)
            if gate.source == "set":
                entry["status"] = "failed"
                failures.append(f"{gate.key} {gate.threshold:g} could not be evaluated: {spec.section.replace('_', ' ')} not measured: {why}")
            continue
        values = {name: m[spec.metric] for name, m in (section.get("per_output") or {}).items() if spec.metric in m}
        if not values:
            kinds = ", ".join(f"{n} ({o.get('kind')})" for n, o in (report.get("outputs") or {}).items())
            entry.update(status="failed", reason=f"no output has {spec.metric}")
            failures.append(f"{gate.key} {gate.threshold:g} could not be evaluated: no output has {spec.metric} (outputs: {kinds})")
            continue
        pick = max if spec.bound == "max" else min
        name = pick(values, key=values.get)
        value = values[name]
        ok = value <= gate.threshold if spec.bound == "max" else value >= gate.threshold
        entry.update(value=value, output=name, status="passed" if ok else "failed")
        if not ok:
            sign = ">" if spec.bound == "max" else "<"
            failures.append(f"{spec.label} of '{name}' {value:.5g} {sign} {gate.threshold:g} ({gate.key})")
    return {"passed": not failures, "failures": failures, "checked": checked}
