"""The trust issue's done-when on the real commands: NaN fails clean, calibrate and run (exit 1, naming the
output); a 1%-perturbed fp32 target fails run's default gate (the fp32 default, not fp16's 1e-2); a model whose
outputs are too small to measure against is an error (exit 2), never a pass. Each of these exited 0 before
the verification layer (reproduced in the issue on the previous main)."""

import json
import sys

import pytest
from conftest import FIXTURES, assert_user_error, run_cli

sys.path.insert(0, str(FIXTURES))
from trust_models import block_data, block_model  # noqa: E402


@pytest.fixture(scope="module")
def trust(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    return {
        "root": root,
        "two": block_model(root / "two.onnx", nan_output=True),
        "two_b": block_model(root / "two_b.onnx", nan_output=True),
        "ref": block_model(root / "ref.onnx"),
        "pert": block_model(root / "pert.onnx", last_row_scale=1.05),
        "tiny": block_model(root / "tiny.onnx", output_scale=1e-26),
        "calib": block_data(root / "calib", 8, seed=100),
        "eval": block_data(root / "eval", 4, seed=200),
        "in": block_data(root / "in", 3, seed=300),
    }


def test_nan_output_fails_clean(trust):
    proc = run_cli("clean", str(trust["two"]), "-o", str(trust["root"] / "two.clean.onnx"))
    assert_user_error(proc, "output 'y_nan'", "NaN/Inf", code=1)
    assert not (trust["root"] / "two.clean.onnx").exists()


def test_nan_output_fails_calibrate(trust):
    proc = run_cli(
        "calibrate",
        str(trust["two"]),
        "--data",
        str(trust["calib"]),
        "--eval-data",
        str(trust["eval"]),
        "--min-int8-flops",
        "0.1",
        "-o",
        str(trust["root"] / "two.int8.onnx"),
    )
    assert_user_error(proc, "output 'y_nan'", "NaN/Inf", code=1)


def test_nan_output_fails_run(trust):
    report = trust["root"] / "nan.json"
    proc = run_cli(
        "run",
        str(trust["two_b"]),
        "--reference",
        str(trust["two"]),
        "--inputs",
        str(trust["in"]),
        "--output-kind",
        "y=token",
        "--output-kind",
        "y_nan=token",
        "--report",
        str(report),
    )
    assert_user_error(proc, "output 'y_nan'", "NaN/Inf", code=1)
    gates = json.loads(report.read_text())["gates"]
    assert not gates["passed"] and gates["precision"] == "fp32"


def test_perturbed_fp32_target_fails_the_fp32_default_gate(trust):
    report = trust["root"] / "pert.json"
    proc = run_cli(
        "run",
        str(trust["pert"]),
        "--reference",
        str(trust["ref"]),
        "--inputs",
        str(trust["in"]),
        "--output-kind",
        "y=token",
        "--report",
        str(report),
    )
    assert_user_error(proc, "precision rel-L2 of 'y'", "> 0.0001 (max_rel_l2)", code=1)
    gates = json.loads(report.read_text())["gates"]
    assert gates["precision"] == "fp32"
    assert [(c["gate"], c["threshold"], c["source"]) for c in gates["checked"]] == [("max_rel_l2", 1e-4, "default for fp32 targets")]
    # the same target passes when the user says what error an fp16-level check accepts
    ok = run_cli(
        "run",
        str(trust["pert"]),
        "--reference",
        str(trust["ref"]),
        "--inputs",
        str(trust["in"]),
        "--output-kind",
        "y=token",
        "--max-rel-l2",
        "0.05",
    )
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("command", ["clean", "run"])
def test_output_too_small_to_measure_is_an_error(trust, command):
    tiny = trust["tiny"]
    if command == "clean":
        proc = run_cli("clean", str(tiny), "-o", str(trust["root"] / "tiny.clean.onnx"))
    else:
        other = block_model(trust["root"] / "tiny_b.onnx", output_scale=1e-26)
        proc = run_cli("run", str(other), "--reference", str(tiny), "--inputs", str(trust["in"]), "--output-kind", "y=token")
    assert_user_error(proc, "reference output 'y' is too small to measure against", code=2)


def test_tolerances_replace_the_default_gates_and_fail_by_statistic(trust):
    args = ("run", str(trust["pert"]), "--reference", str(trust["ref"]), "--inputs", str(trust["in"]), "--output-kind", "y=token")
    report = trust["root"] / "tol.json"
    proc = run_cli(*args, "--atol", "y:1.0", "--report", str(report))
    assert proc.returncode == 0, proc.stderr  # a loose tolerance the user chose replaces the fp32 default
    tolerance = json.loads(report.read_text())["precision_error"]["per_output"]["y"]["tolerance"]
    assert tolerance["passed"] and tolerance["statistic"] == "elemwise" and tolerance["atol"] == 1.0
    assert_user_error(run_cli(*args, "--atol", "1e-6"), "output 'y':", "values outside atol 1e-06", code=1)
    assert_user_error(
        run_cli(*args, "--atol", "y:1e-6", "--rtol", "y:1e-6", "--error-stat", "median"), "output 'y': median absolute error", code=1
    )
    assert run_cli(*args, "--rtol", "y:0.5", "--error-stat", "median").returncode == 0
    # a tolerance on a target that is its own reference cannot be evaluated: it fails, it does not pass
    assert_user_error(
        run_cli("run", str(trust["ref"]), "--inputs", str(trust["in"]), "--output-kind", "y=token", "--atol", "1"),
        "--atol/--rtol could not be evaluated",
        code=1,
    )


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (("--atol", "y:-1"), "--atol 'y:-1' is not NAME:VALUE"),
        (("--rtol", "nope:0.1"), "--rtol names output 'nope'"),
        (("--error-stat", "p99"), "--error-stat 'p99' is not one of"),
        (("--load-reference", "missing.npz"), "--load-reference missing.npz does not exist"),
    ],
)
def test_comparison_options_refuse_bad_values(trust, flags, fragment):
    proc = run_cli(
        "run",
        str(trust["pert"]),
        "--reference",
        str(trust["ref"]),
        "--inputs",
        str(trust["in"]),
        "--output-kind",
        "y=token",
        *flags,
        cwd=trust["root"],
    )
    assert_user_error(proc, fragment)


def test_saved_reference_is_reused_without_the_reference_model(trust):
    stored = trust["root"] / "stored.npz"
    common = ("--inputs", str(trust["in"]), "--output-kind", "y=token")
    assert (
        run_cli(
            "run", str(trust["pert"]), "--reference", str(trust["ref"]), *common, "--max-rel-l2", "0.05", "--save-reference", str(stored)
        ).returncode
        == 0
    )
    report = trust["root"] / "loaded.json"
    # ref.onnx judged against the stored outputs of ref.onnx: equal; pert.onnx: the same error as when computed
    assert run_cli("run", str(trust["ref"]), *common, "--load-reference", str(stored)).returncode == 0
    proc = run_cli("run", str(trust["pert"]), *common, "--load-reference", str(stored), "--report", str(report))
    assert_user_error(proc, "precision rel-L2 of 'y'", "(max_rel_l2)", code=1)
    section = json.loads(report.read_text())["precision_error"]
    assert "stored in" in section["scope"] and section["per_output"]["y"]["rel_l2"] > 1e-3
    # other chunks than the stored run's: refused, not compared against the wrong rows
    assert_user_error(
        run_cli("run", str(trust["ref"]), *common, "--load-reference", str(stored), "--chunk", "8", "--overlap", "2"),
        "has no reference outputs for a chunk of this run",
    )
    not_npz = trust["root"] / "not.npz"
    not_npz.write_bytes(b"garbage")
    assert_user_error(run_cli("run", str(trust["ref"]), *common, "--load-reference", str(not_npz)), "is not a stored reference")
