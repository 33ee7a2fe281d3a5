"""The verification layer (trtforge/verify): metrics, the comparator, the guards and the gate evaluator.

Each rule here is one a check could silently break: NaN must never pass, a relative metric must scale with
the reference (no absolute floor), a reference that proves nothing is an error, and the worst output is the
worst even when it is NaN."""

import numpy as np
import pytest

from trtforge.core.errors import UserError
from trtforge.verify import metrics
from trtforge.verify.compare import Comparator, compare_arrays, compare_outputs, worst
from trtforge.verify.gates import (
    check_outputs,
    default_gates,
    evaluate_gates,
    gates_from,
    screen,
)
from trtforge.verify.guards import (
    ReferenceUnusable,
    ValueStats,
    reference_problem,
    vacuous_reason,
)
from trtforge.verify.tolerances import (
    ErrorHistogram,
    Tolerance,
    check_statistic,
    parse_tolerances,
    tolerances_for,
)

RNG = np.random.default_rng(0)


def test_identical_arrays():
    a = RNG.normal(size=(4, 8))
    m = compare_arrays(a, a.copy(), "logits")
    assert m["rel_l2"] == 0 and m["max_abs"] == 0
    assert m["cosine"] == pytest.approx(1.0) and m["top1_agreement"] == 1.0


def test_known_values():
    a = np.array([[3.0, 4.0]])
    b = np.array([[3.0, 4.5]])
    assert metrics.rel_l2(a, b) == pytest.approx(0.5 / 5.0)
    assert metrics.max_abs(a, b) == pytest.approx(0.5)
    assert metrics.cosine([1, 0], [0, 1]) == pytest.approx(0.0)
    assert metrics.top1_agreement([[1, 2], [2, 1]], [[1, 2], [1, 2]]) == 0.5


def test_rowwise_cosine_exposes_one_bad_row():
    a = np.ones((10, 4))
    b = a.copy()
    b[3] = -1
    rows = metrics.rowwise_cosine(a, b)
    assert rows.min() == pytest.approx(-1.0) and np.sum(rows > 0.999) == 9


def test_zero_vectors_equal_only_zero_vectors():
    a = np.array([[0.0, 0.0], [1.0, 2.0]])
    assert list(metrics.rowwise_cosine(a, a)) == [1.0, pytest.approx(1.0)]
    assert metrics.rowwise_cosine(a, np.array([[1.0, 0.0], [1.0, 2.0]]))[0] == 0.0
    assert metrics.cosine(np.zeros(3), np.zeros(3)) == 1.0 and metrics.cosine(np.zeros(3), np.ones(3)) == 0.0


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_is_never_hidden(bad):
    """The old metrics took max(0.0, nan) == 0.0 and min(1.0, nan) == 1.0: a NaN output measured as exact."""
    a = RNG.normal(size=(2, 3, 8))
    b = a.copy()
    b[1, 2, 5] = bad
    assert np.isnan(metrics.max_abs(a, b)) or metrics.max_abs(a, b) == np.inf
    assert np.isnan(metrics.rel_l2(a, b)) or metrics.rel_l2(a, b) == np.inf
    assert np.isnan(metrics.rowwise_cosine(a, b)).sum() == 1
    m = compare_arrays(a, b, "token")
    assert m["candidate_nonfinite"] == 1
    for key in ("rel_l2", "cosine", "min_row_cosine", "max_abs", "min_item_cosine", "mean_item_cosine"):
        assert np.isnan(m[key]), key


def test_nan_in_a_later_batch_survives_accumulation():
    comparator = Comparator({"y": "token"})
    a = RNG.normal(size=(2, 3, 8))
    comparator.add({"y": a}, {"y": a})
    b = a.copy()
    b[0, 0, 0] = np.nan
    comparator.add({"y": a}, {"y": b})
    m = comparator.result()["y"]
    assert m["candidate_nonfinite"] == 1 and np.isnan(m["min_row_cosine"]) and np.isnan(m["max_abs"])


def test_worst_output_is_nan_when_any_is():
    """max/min over outputs skip NaN unless it comes first: the NaN output second was never the worst."""
    per_output = {"y": {"rel_l2": 0.0, "cosine": 1.0}, "y_nan": {"rel_l2": float("nan"), "cosine": float("nan")}}
    w = worst(per_output)
    assert np.isnan(w["rel_l2"]) and np.isnan(w["cosine"])
    assert np.isnan(metrics.worst_of([0.1, float("nan")], "max")) and metrics.worst_of([0.1, 0.3], "min") == 0.1


def test_relative_metrics_scale_with_the_reference():
    """Outputs around 1e-15 (measurable): rel-L2 is the real relative error, not diff / 1e-12."""
    a = RNG.normal(size=(4, 16)) * 1e-15
    b = a * 1.01
    m = compare_arrays(a, b)
    assert m["rel_l2"] == pytest.approx(0.01, rel=1e-6) and m["cosine"] == pytest.approx(1.0)
    old_floor = float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12))
    assert old_floor < 1e-3  # what the old absolute floor reported for a 1% error


def test_reference_problems():
    assert vacuous_reason(np.zeros((2, 10))) == "all zeros"
    assert vacuous_reason(np.full((2, 10), 0.37, dtype=np.float32)).startswith("constant")
    assert vacuous_reason(RNG.normal(size=(2, 4)) * 1e-25).startswith("too small to measure")
    assert vacuous_reason(np.array([1.0, np.nan])) == "1 of 2 values are NaN or Inf"
    assert vacuous_reason(RNG.normal(size=(2, 4))) is None
    stats = ValueStats.of(np.zeros(4))
    stats.add(np.ones(4))  # constant per batch, not over both
    assert reference_problem(stats) is None


def test_screen_fails_nan_candidates_and_errors_on_vacuous_references():
    a = RNG.normal(size=(2, 8))
    nan = a * np.nan
    per_output = compare_outputs({"y": None, "y_nan": None}, {"y": a, "y_nan": nan}, {"y": a, "y_nan": nan})
    failures = screen(per_output, "clean")
    assert len(failures) == 1 and "'y_nan'" in failures[0] and "the model itself computes it" in failures[0]
    zero = compare_outputs({"z": None}, {"z": np.zeros((2, 8))}, {"z": np.zeros((2, 8))})
    with pytest.raises(ReferenceUnusable, match="reference output 'z' is all zeros"):
        screen(zero, "clean")
    tiny = compare_outputs({"t": None}, {"t": a * 1e-25}, {"t": a * 1e-25})
    with pytest.raises(UserError, match="too small to measure"):
        check_outputs(tiny, [("rel_l2", "max", 1e-5, "rel-L2", "clean.tolerance")], "clean")


def test_check_outputs_names_the_nan_output_and_skips_its_metrics():
    a = RNG.normal(size=(2, 8))
    per_output = compare_outputs({"y": None, "y_nan": None}, {"y": a, "y_nan": a}, {"y": a, "y_nan": a * np.nan})
    failures = check_outputs(per_output, [("rel_l2", "max", 1e-5, "rel-L2", "clean.tolerance")], "clean")
    assert failures == ["output 'y_nan' of the target has 16 NaN/Inf values of 16"]


def _report(per_output):
    return {
        "outputs": {n: {"kind": "token"} for n in per_output},
        "precision_error": {"measured": True, "per_output": per_output},
        "chunking_error": {"measured": False, "reason": "no input was chunked"},
    }


def test_run_gates_fail_on_a_nan_second_output():
    a = RNG.normal(size=(2, 3, 8))
    per_output = compare_outputs({"y": "token", "y_nan": "token"}, {"y": a, "y_nan": a}, {"y": a, "y_nan": a * np.nan})
    result = evaluate_gates(_report(per_output), gates_from({}, "fp32"))
    assert not result["passed"] and "'y_nan'" in result["failures"][0]


def test_default_gates_follow_precision():
    assert default_gates("fp32") == {"max_rel_l2": 1e-4}
    assert default_gates(None) == {"max_rel_l2": 1e-4}
    assert default_gates("fp16") == {"max_rel_l2": 1e-2, "min_cosine": 0.99} == default_gates("tf32")
    assert default_gates("int8") == {"min_cosine": 0.99} == default_gates("fp8")
    gates = gates_from({}, "fp32")
    assert [(g.key, g.threshold, g.source) for g in gates] == [("max_rel_l2", 1e-4, "default for fp32 targets")]
    # a 1% error passes an fp16 target's default, fails an fp32 target's
    per_output = {"y": {"rel_l2": 0.01, "cosine": 0.99995}}
    assert evaluate_gates(_report(per_output), gates_from({}, "fp16"))["passed"]
    assert not evaluate_gates(_report(per_output), gates_from({}, "fp32"))["passed"]


def test_error_histogram_quantiles_are_conservative():
    errors = np.concatenate([np.zeros(51), np.linspace(1e-6, 1e-3, 49)])
    h = ErrorHistogram()
    h.add(errors[:30])
    h.add(errors[30:])
    assert h.statistic("max") == pytest.approx(1e-3) and h.statistic("mean") == pytest.approx(errors.mean())
    assert h.statistic("median") == 0.0  # most of them are exact
    exact = float(np.quantile(errors, 0.9, method="higher"))
    assert exact <= h.statistic("q90") <= exact * 1.04


def test_tolerances_elementwise_and_by_statistic():
    ref = np.array([[1.0, 2.0, 4.0, 0.0]])
    cand = np.array([[1.0, 2.1, 4.0, 0.0]])
    elem = compare_outputs({"y": None}, {"y": ref}, {"y": cand}, tolerances={"y": Tolerance(0.05, 0.0)})["y"]["tolerance"]
    assert not elem["passed"] and elem["violations"] == 1
    assert compare_outputs({"y": None}, {"y": ref}, {"y": cand}, tolerances={"y": Tolerance(0.0, 0.06)})["y"]["tolerance"]["passed"]
    median = compare_outputs({"y": None}, {"y": ref}, {"y": cand}, tolerances={"y": Tolerance(1e-6, 0.0, "median")})["y"]["tolerance"]
    assert median["passed"] and median["abs_error"] == 0.0
    nan = compare_outputs({"y": None}, {"y": ref}, {"y": cand * np.nan}, tolerances={"y": Tolerance(1.0, 1.0, "mean")})["y"]["tolerance"]
    assert not nan["passed"]


def test_tolerance_parsing_and_errors():
    assert parse_tolerances(["logits:1e-3", "2e-2"], "--atol") == {"logits": 1e-3, None: 2e-2}
    assert tolerances_for(["logits", "h"], {"logits": 1e-3}, {None: 0.1}, "max") == {
        "logits": Tolerance(1e-3, 0.1, "max"),
        "h": Tolerance(0.0, 0.1, "max"),
    }
    for bad in ("x:-1", "x:nan", "x:abc"):
        with pytest.raises(UserError, match="--atol"):
            parse_tolerances([bad], "--atol")
    with pytest.raises(UserError, match="names output 'nope'"):
        tolerances_for(["logits"], {"nope": 1.0}, {}, "max")
    assert check_statistic("q99.9") == "q99.9"
    for bad in ("q100", "q0", "p99", "avg"):
        with pytest.raises(UserError):
            check_statistic(bad)


def test_a_tolerance_replaces_the_default_gates_of_its_output_only():
    per_output = {"tolerated": {"rel_l2": 0.5, "cosine": 0.9}, "other": {"rel_l2": 0.5, "cosine": 0.9}}
    defaults = gates_from({}, "fp16")
    result = evaluate_gates(_report(per_output), defaults, tolerated=frozenset({"tolerated"}))
    assert not result["passed"] and all("'other'" in f for f in result["failures"])
    only = evaluate_gates(_report({"tolerated": per_output["tolerated"]}), defaults, tolerated=frozenset({"tolerated"}))
    assert only["passed"] and {c["status"] for c in only["checked"]} == {"not evaluated"}
    # a gate the user set reads every output, tolerated or not
    explicit = evaluate_gates(_report(per_output), gates_from({"max_rel_l2": 0.1}, "fp16"), tolerated=frozenset(per_output))
    assert not explicit["passed"] and "max_rel_l2" in explicit["failures"][0]
