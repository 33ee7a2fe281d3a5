"""The one gate evaluator: is a measured comparison good enough? Pure.

A gate reads one metric of the comparator's per-output results (compare.py) and bounds its worst value
over the outputs that carry it. Rules every step shares:
- an output whose target values hold NaN/Inf fails, named, whatever its metrics or gates (`screen`);
- a reference that proves nothing (guards.py) is an error (exit 2), not a pass or a fail (`screen`);
- a NaN metric fails every gate that reads it (comparisons are written `not (value <= bound)`);
- every gate a user SET is evaluated or fails saying why it could not be; a default gate that cannot be
  evaluated (the target is its own reference) is listed as not evaluated.

Default gates follow the target's precision (`default_gates`): fp32 targets the export tolerance on
rel-L2 (1e-4: anything looser lets a 1%-perturbed fp32 weight through); fp16 and TF32 targets rel-L2 1e-2
and cosine 0.99; INT8 and FP8-GEMM targets cosine 0.99 alone (their rounding puts rel-L2 at 2-10% on
healthy engines). The report records which precision and which gates were used.

Where the target has a boxes output, box recall >= 0.9 and matched IoU >= 0.9 gate its precision error by default
(`BOX_DEFAULTS`), whatever the precision: the target and the reference run the very same slices, so a healthy fp16 or
INT8 engine finds nearly every reference box (recall ~1; a box whose score sits at the threshold may flip) at nearly
the same place (a few pixels of a box a hundred wide is IoU > 0.95). The sliced-vs-whole box gates have no default:
a slice sees less context than the whole image, so how far sliced detection may differ is the user's call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtforge.verify.guards import unusable_reference
from trtforge.verify.metrics import worst_of


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
    "min_box_recall": GateSpec("min_box_recall", "precision_error", "box_recall", "min", "precision box recall"),
    "min_matched_iou": GateSpec("min_matched_iou", "precision_error", "matched_iou", "min", "precision matched IoU"),
    "min_chunk_box_recall": GateSpec("min_chunk_box_recall", "chunking_error", "box_recall", "min", "slicing box recall"),
    "min_chunk_matched_iou": GateSpec("min_chunk_matched_iou", "chunking_error", "matched_iou", "min", "slicing matched IoU"),
}
BOX_DEFAULTS = {"min_box_recall": 0.9, "min_matched_iou": 0.9}

FP32_TOLERANCE = 1e-4  # the export step's default tolerance (config export.tolerance)
LOW_PRECISIONS = ("fp16", "tf32")
QUANTIZED_PRECISIONS = ("int8", "best", "fp8")
PRECISIONS = ("fp32", *LOW_PRECISIONS, *QUANTIZED_PRECISIONS)
QUANTIZED_NOTE = (
    "max_rel_l2 has no default for an INT8 or FP8-GEMM target (its rounding error is judged by cosine, as "
    "calibrate's and build's gates); set --max-rel-l2 to gate it"
)


def default_gates(precision: str | None, fp32_tolerance: float = FP32_TOLERANCE) -> dict[str, float]:
    """The gates that apply when none is set, by the target's precision (None: unknown, judged as fp32)."""
    if precision in QUANTIZED_PRECISIONS:
        return {"min_cosine": 0.99}
    if precision in LOW_PRECISIONS:
        return {"max_rel_l2": 1e-2, "min_cosine": 0.99}
    return {"max_rel_l2": fp32_tolerance}


@dataclass(frozen=True)
class Gate:
    key: str
    threshold: float
    source: str  # "set" (a flag or config key) | "default for <precision> targets"


def gates_from(
    values: dict[str, float | None], precision: str | None = None, fp32_tolerance: float = FP32_TOLERANCE, boxes: bool = False
) -> list[Gate]:
    """Gates from {key: threshold or None}; None takes the key's default for the target's precision, if any (and with
    `boxes`, a target with a boxes output, the box defaults)."""
    defaults_used = default_gates(precision, fp32_tolerance)
    source = f"default for {precision or 'fp32'} targets"
    gates = []
    for key in GATES:
        value = values.get(key)
        if value is not None:
            gates.append(Gate(key, float(value), "set"))
        elif key in defaults_used:
            gates.append(Gate(key, defaults_used[key], source))
        elif boxes and key in BOX_DEFAULTS:
            gates.append(Gate(key, BOX_DEFAULTS[key], "default for boxes outputs"))
    return gates


def gate_notes(values: dict[str, float | None], precision: str | None) -> list[str]:
    """What the report says about defaults left out for this precision."""
    return [QUANTIZED_NOTE] if precision in QUANTIZED_PRECISIONS and values.get("max_rel_l2") is None else []


def nonfinite_failure(name: str, metrics: dict[str, Any], what: str = "the target") -> str:
    values = metrics.get("values", "?")
    also = (
        " (the reference has NaN/Inf there too: the model itself computes it)"
        if metrics.get("reference_problem", "") and "NaN" in str(metrics.get("reference_problem"))
        else ""
    )
    return f"output '{name}' of {what} has {metrics['candidate_nonfinite']} NaN/Inf values of {values}{also}"


def screen(per_output: dict[str, dict[str, Any]], where: str, what: str = "the target") -> list[str]:
    """Failures for outputs whose target values hold NaN/Inf; raises ReferenceUnusable (exit 2) for the first
    other output whose reference proves nothing."""
    failures = [nonfinite_failure(name, m, what) for name, m in per_output.items() if m.get("candidate_nonfinite")]
    for name, m in per_output.items():
        if not m.get("candidate_nonfinite") and m.get("reference_problem"):
            raise unusable_reference(name, m["reference_problem"], where)
    return failures


def finite_outputs(per_output: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The outputs a gate reads: those whose target values are finite (the others failed the screen already)."""
    return {name: m for name, m in per_output.items() if not m.get("candidate_nonfinite")}


def passes(value: float, bound: str, threshold: float) -> bool:
    """value within the bound; NaN never is."""
    return bool(value <= threshold) if bound == "max" else bool(value >= threshold)


def bound_failure(label: str, name: str, value: float, bound: str, threshold: float, key: str) -> str:
    sign = ">" if bound == "max" else "<"
    shown = "NaN" if value != value else f"{value:.5g}"
    return (
        f"{label} of '{name}' {shown} {sign} {threshold:g} ({key})"
        if value == value
        else f"{label} of '{name}' is NaN, not within {threshold:g} ({key})"
    )


def judge_metric(
    per_output: dict[str, dict[str, Any]], metric: str, bound: str, threshold: float, label: str, key: str
) -> tuple[str | None, float, str | None]:
    """(the worst output's name, its value, a failure sentence or None) for one bound on one metric."""
    values = {name: m[metric] for name, m in per_output.items() if metric in m}
    if not values:
        return None, float("nan"), f"{key} {threshold:g} could not be evaluated: no output has {metric}"
    value = worst_of(list(values.values()), bound)
    name = next((n for n, v in values.items() if v != v), None) if value != value else next(n for n, v in values.items() if v == value)
    ok = passes(value, bound, threshold)
    return name, value, None if ok else bound_failure(label, name or "?", value, bound, threshold, key)


def tolerance_failures(per_output: dict[str, dict[str, Any]]) -> list[str]:
    """Failures of the per-output tolerances (--atol/--rtol) the comparator judged."""
    out = []
    for name, m in per_output.items():
        tol = m.get("tolerance")
        if tol and not tol["passed"]:
            if tol["statistic"] == "elemwise":
                out.append(
                    f"output '{name}': {tol['violations']} of {m.get('values')} values outside atol {tol['atol']:g} + "
                    f"rtol {tol['rtol']:g} x |reference| (largest absolute error {tol['abs_error']:.3g})"
                )
            else:
                out.append(
                    f"output '{name}': {tol['statistic']} absolute error {tol['abs_error']:.3g} > atol {tol['atol']:g} "
                    f"and relative error {tol['rel_error']:.3g} > rtol {tol['rtol']:g}"
                )
    return out


def evaluate_gates(
    report: dict[str, Any], gates: list[Gate], where: str = "run", tolerated: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """{passed, failures[], checked[]}: NaN/Inf screens and tolerances of every measured section, then each
    gate's worst value over the outputs that carry its metric. A default gate skips the `tolerated` outputs: a
    tolerance the user set for an output replaces its defaults (a gate the user set still reads every output)."""
    failures: list[str] = []
    checked: list[dict[str, Any]] = []
    for section_name in ("precision_error", "chunking_error"):
        section = report.get(section_name) or {}
        if section.get("measured"):
            what = "the target" if section_name == "precision_error" else "the chunked run"
            failures += screen(section.get("per_output") or {}, f"{where}'s {section_name.replace('_', ' ')} check", what)
            failures += tolerance_failures(section.get("per_output") or {})
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
                failures.append(
                    f"{gate.key} {gate.threshold:g} could not be evaluated: {spec.section.replace('_', ' ')} not measured: {why}"
                )
            continue
        per_output = section.get("per_output") or {}
        if gate.source != "set":
            per_output = {n: m for n, m in per_output.items() if n not in tolerated}
            if not per_output and tolerated:
                entry.update(status="not evaluated", reason="every output has a tolerance")
                continue
        usable = finite_outputs(per_output)
        if per_output and not usable:
            entry.update(status="failed", reason="every output holds NaN/Inf")
            continue
        name, value, failure = judge_metric(usable, spec.metric, spec.bound, gate.threshold, spec.label, gate.key)
        if name is None:
            kinds = ", ".join(f"{n} ({o.get('kind')})" for n, o in (report.get("outputs") or {}).items())
            entry.update(status="failed", reason=f"no output has {spec.metric}")
            failures.append(f"{failure} (outputs: {kinds})")
            continue
        entry.update(value=value, output=name, status="passed" if failure is None else "failed")
        if failure:
            failures.append(failure)
    return {"passed": not failures, "failures": failures, "checked": checked}


def check_outputs(
    per_output: dict[str, dict[str, Any]], bounds: list[tuple[str, str, float, str, str]], where: str, what: str = "the target"
) -> list[str]:
    """The failures of one step's check: the NaN/Inf screen, tolerances, then each (metric, bound, threshold,
    label, key) over every output. Raises ReferenceUnusable for a reference that proves nothing."""
    failures = screen(per_output, where, what) + tolerance_failures(per_output)
    usable = finite_outputs(per_output)
    for metric, bound, threshold, label, key in bounds if usable else []:
        _, _, failure = judge_metric(usable, metric, bound, threshold, label, key)
        if failure:
            failures.append(failure)
    return failures
