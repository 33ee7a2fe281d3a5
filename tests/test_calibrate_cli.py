"""`trtforge calibrate` end to end on MiniLM (real text) and tiny-fcn (arrays), and its bad input."""

import json
import shutil

import numpy as np
import pytest
from conftest import assert_user_error, run_cli


def test_minilm_entropy_reaches_the_gate(minilm_int8):
    int8, report = minilm_int8
    assert int8.is_file() and report["method"] == "entropy" and report["smooth"] == 0.8
    assert report["accuracy"]["mean_cosine"] >= 0.99
    assert report["int8_gemm_flops_fraction"] >= 0.80
    assert report["accuracy"]["samples"] == 189  # the held-out set (160 paragraphs + 29 long), not the calibration text
    cache = int8.with_name("minilm.calib.cache")
    side = json.loads(cache.with_name("minilm.calib.cache.json").read_text())
    assert side["method"] == "entropy" and len(side["graph_hash"]) == 64 and len(side["data_manifest_hash"]) == 64
    assert side["trtforge_version"] and side["tensors"] and side["params"]["smooth"] == 0.8
    assert cache.read_text().startswith("TRT-8600-EntropyCalibration2\n")
    from trtforge.core.onnxio import load_onnx

    ops = [n.op_type for n in load_onnx(int8).graph.node]
    assert ops.count("QuantizeLinear") >= 40 and "LayerNormalization" in ops


def test_second_run_reuses_the_cache(minilm_int8, tmp_path):
    int8, _ = minilm_int8
    clean = int8.with_name("minilm.clean.onnx")
    proc = run_cli("calibrate", str(clean), "--data", "calib_data/minilm", "--method", "entropy", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["cache_reused"] and report["cache_reason"].startswith("reused")
    assert "collecting histograms" not in proc.stderr  # nothing recomputed


def test_changed_method_recalibrates_or_fails_strict(minilm_int8, tmp_path):
    int8, _ = minilm_int8
    work = tmp_path / "w"
    work.mkdir()
    for name in ("minilm.clean.onnx", "minilm.clean.onnx.json", "minilm.calib.cache", "minilm.calib.cache.json"):
        shutil.copy(int8.with_name(name), work / name)
    proc = run_cli("calibrate", str(work / "minilm.clean.onnx"), "--data", "calib_data/minilm", "--method", "minmax", "--strict-cache")
    assert_user_error(proc, "minilm.calib.cache was made for another method", "--strict-cache")
    proc = run_cli(
        "calibrate",
        str(work / "minilm.clean.onnx"),
        "--data",
        "calib_data/minilm",
        "--method",
        "minmax",
        "--max-samples",
        "24",
        "--max-eval-samples",
        "24",
        "--no-fallback",
        "--min-cosine",
        "0.5",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert not report["cache_reused"] and "another method" in report["cache_reason"]
    assert (work / "minilm.calib.cache").read_text().startswith("TRT-8600-MinMaxCalibration")


def test_compare_methods_prints_all_three(minilm_clean, tmp_path):
    proc = run_cli(
        "calibrate",
        str(minilm_clean),
        "--data",
        "calib_data/minilm",
        "--compare-methods",
        "--max-samples",
        "16",
        "--max-eval-samples",
        "16",
        "--no-fallback",
        "--min-cosine",
        "0",
        "-o",
        str(tmp_path / "m.int8.onnx"),
    )
    assert proc.returncode == 0, proc.stderr
    for method in ("entropy", "percentile", "minmax"):
        assert method in proc.stdout
    assert "INT8 GEMM FLOPs" in proc.stdout


def test_gate_failure_exits_1(minilm_clean, tmp_path):
    proc = run_cli(
        "calibrate",
        str(minilm_clean),
        "--data",
        "calib_data/minilm",
        "--no-smooth",
        "--no-fallback",
        "--max-samples",
        "16",
        "--max-eval-samples",
        "16",
        "--min-cosine",
        "0.9999",
        "-o",
        str(tmp_path / "m.int8.onnx"),
    )
    assert_user_error(proc, "below the gate 0.9999", code=1)


def test_int8_flops_floor_failure_says_where_the_float_flops_are(minilm_clean, tmp_path):
    """A DeBERTa-v3 at a small hidden size spends most GEMM FLOPs in its relative-position attention MatMuls and
    failed the floor with a bare percentage; the failure now names the float share by reason, and what to do."""
    out = tmp_path / "m.int8.onnx"
    proc = run_cli(
        "calibrate",
        str(minilm_clean),
        "--data",
        "calib_data/minilm",
        "--max-samples",
        "16",
        "--max-eval-samples",
        "16",
        "--min-int8-flops",
        "0.99",
        "-o",
        str(out),
    )
    assert_user_error(
        proc,
        "below the floor 99% (min_int8_flops); float: attention's activation x activation MatMuls (--quantize-attention quantizes them)",
        "lower --min-int8-flops",
        code=1,
    )
    side = json.loads(out.with_name("m.int8.onnx.json").read_text())
    shares = side["float_gemm_flops"]
    assert set(shares) <= {"attention_bmm", "output_layer", "fallback", "gemv"} and shares["attention_bmm"] > 0.05
    assert side["int8_gemm_flops_fraction"] + sum(shares.values()) == pytest.approx(1.0)
    assert f"{shares['attention_bmm']:.1%}" in proc.stderr


def test_float_flops_shares_by_reason():
    from trtforge.calibrate.step import float_flops_shares

    flops = {"qkv": 60.0, "bmm": 30.0, "head": 5.0, "kept": 4.0, "odd": 1.0}
    shares = float_flops_shares(flops, {"qkv"}, {"bmm": "attention_bmm", "head": "output_layer"}, {"kept"})
    assert shares == pytest.approx({"attention_bmm": 0.30, "output_layer": 0.05, "fallback": 0.04, "other": 0.01})
    assert list(shares) == ["attention_bmm", "output_layer", "fallback", "other"]  # largest first
    assert float_flops_shares({}, set(), {}, set()) == {}


def _tiny_samples(folder, n=6, name="image", dtype=np.float32, rank=4):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        shape = (1, 3, 24 + 8 * (i % 2), 32)[4 - rank :]
        np.savez(folder / f"s{i}.npz", **{name: rng.random(shape).astype(dtype)})
    return folder


def test_tiny_fcn_with_arrays(tiny_fcn_clean, tmp_path):
    data = _tiny_samples(tmp_path / "data")
    proc = run_cli(
        "calibrate",
        str(tiny_fcn_clean),
        "--data",
        str(data),
        "--method",
        "percentile",
        "--min-cosine",
        "0.95",
        "-o",
        str(tmp_path / "fcn.int8.onnx"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["accuracy"]["mean_cosine"] >= 0.95 and report["int8_gemm_flops_fraction"] > 0.8
    assert (tmp_path / "fcn.calib.cache").read_text().startswith("TRT-8600-LegacyCalibration")


@pytest.mark.parametrize(
    "make,fragments",
    [
        (lambda d: d.mkdir(), ["holds no .npy/.npz"]),
        (lambda d: _tiny_samples(d, name="pixels"), ["has no array 'image'", "pixels"]),
        (lambda d: _tiny_samples(d, dtype=np.int32), ["dtype int32", "float32"]),
        (lambda d: _tiny_samples(d, rank=2), ["rank 2", "rank 4"]),
    ],
)
def test_calibrate_bad_data(tiny_fcn_clean, tmp_path, make, fragments):
    make(tmp_path / "data")
    proc = run_cli("calibrate", str(tiny_fcn_clean), "--data", str(tmp_path / "data"), "-o", str(tmp_path / "x.int8.onnx"))
    assert_user_error(proc, *fragments)
    assert not list(tmp_path.glob("x.*"))


def test_nan_in_calibration_data(tiny_fcn_clean, tmp_path):
    data = _tiny_samples(tmp_path / "data")
    bad = np.full((1, 3, 24, 32), np.nan, dtype=np.float32)
    np.savez(data / "s0.npz", image=bad)
    assert_user_error(run_cli("calibrate", str(tiny_fcn_clean), "--data", str(data), "-o", str(tmp_path / "x.int8.onnx")), "NaN")


def test_cache_for_another_model_and_corrupt_cache(tiny_fcn_clean, minilm_int8, tmp_path):
    data = _tiny_samples(tmp_path / "data")
    other = minilm_int8[0].with_name("minilm.calib.cache")
    proc = run_cli("calibrate", str(tiny_fcn_clean), "--data", str(data), "--from-cache", str(other), "-o", str(tmp_path / "x.int8.onnx"))
    assert_user_error(proc, "lacks scales for", "another model")
    corrupt = tmp_path / "corrupt.cache"
    corrupt.write_text("TRT-8600-EntropyCalibration2\nimage: 3f80zz00\n")
    proc = run_cli("calibrate", str(tiny_fcn_clean), "--data", str(data), "--from-cache", str(corrupt), "-o", str(tmp_path / "x.int8.onnx"))
    assert_user_error(proc, "corrupt.cache line 2")
    assert not (tmp_path / "x.int8.onnx").exists()


def test_import_cache_from_elsewhere(tiny_fcn_clean, tmp_path):
    data = _tiny_samples(tmp_path / "data")
    proc = run_cli("calibrate", str(tiny_fcn_clean), "--data", str(data), "-o", str(tmp_path / "a.int8.onnx"), "--min-cosine", "0.9")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(
        "calibrate",
        str(tiny_fcn_clean),
        "--data",
        str(data),
        "--from-cache",
        str(tmp_path / "a.calib.cache"),
        "-o",
        str(tmp_path / "b.int8.onnx"),
        "--min-cosine",
        "0.9",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cache_reason"].startswith("imported")


def test_unknown_method(tiny_fcn_clean, tmp_path):
    data = _tiny_samples(tmp_path / "data")
    assert_user_error(
        run_cli("calibrate", str(tiny_fcn_clean), "--data", str(data), "--method", "kl"),
        "--method must be 'entropy', 'percentile' or 'minmax', got 'kl'",
    )


def test_images_folder_for_a_cnn(tiny_fcn_clean, tmp_path):
    """Image files are read with Pillow, scaled to [0, 1], NCHW; each keeps its own size."""
    Image = pytest.importorskip("PIL.Image")
    data = tmp_path / "imgs"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(40, 56), (64, 48), (32, 32)]):
        yy, xx = np.mgrid[0:h, 0:w]
        pixels = np.stack([(np.sin(xx / (3 + c + i)) + np.cos(yy / (4 + c))) * 60 + 128 for c in range(3)], -1)
        Image.fromarray(np.clip(pixels + rng.normal(0, 5, pixels.shape), 0, 255).astype(np.uint8)).save(data / f"img{i}.png")
    proc = run_cli(
        "calibrate",
        str(tiny_fcn_clean),
        "--data",
        str(data),
        "--method",
        "minmax",
        "--min-cosine",
        "0.95",
        "-o",
        str(tmp_path / "img.int8.onnx"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["accuracy"]["samples"] == 3
