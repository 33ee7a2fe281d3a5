"""`trtforge run` on the ORT backend: MiniLM long documents, tiny-fcn tiles, and its bad input."""

import json

import numpy as np
import pytest

from conftest import assert_user_error, run_cli


def test_minilm_long_documents_report(minilm_clean, tmp_path):
    report_path = tmp_path / "run.json"
    proc = run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--chunk", "256", "--overlap", "32",
                   "--reference", str(minilm_clean), "--report", str(report_path), "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["schema"] == "trtforge.run/1"
    assert len(report["inputs"]) == 6 and all(i["length"] > 4000 and i["chunks"] >= 16 for i in report["inputs"])
    assert report["precision_error"]["worst"]["rel_l2"] == 0.0  # same model on both sides
    chunking = report["chunking_error"]
    assert chunking["per_input_scope"][0] == "prefix of 510 tokens" and 0.5 < chunking["min_pooled_cosine"] < 1.0
    for key in ("p50_ms", "p90_ms", "p99_ms"):
        assert report["latency"]["all"]["wall"][key] > 0
    assert report["throughput"]["tokens_per_s"] > 0 and report["memory"]["peak_rss_mb"] > 0
    assert report["gates"]["passed"]
    assert "latency per batch" in proc.stdout and "chunking" in proc.stdout


def test_fp16_onnx_passes_the_default_gates(minilm_clean, tmp_path):
    """The fp16 ONNX that `build --precision fp16` writes, run on ORT against the fp32 source."""
    pytest.importorskip("tensorrt_rtx")
    proc = run_cli("build", str(minilm_clean), "--precision", "fp16", "--tiers", "256,512", "-o", str(tmp_path / "m.fp16.engine"))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("run", str(tmp_path / "m.fp16.onnx"), "--inputs", "calib_data/minilm_long", "--reference", str(minilm_clean), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    worst = report["precision_error"]["worst"]
    assert 0 < worst["rel_l2"] <= 1e-2 and worst["cosine"] >= 0.99


def test_chunk_equal_to_model_max_has_no_chunking_error(minilm_clean, tmp_path):
    proc = run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--chunk", "512", "--overlap", "0", "--json", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chunking_error"]["rel_l2"] < 1e-6


def test_chunking_gate_fails_with_exit_1(minilm_clean):
    proc = run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--min-chunk-cosine", "0.999", "--warmup", "0")
    assert_user_error(proc, "chunking error: pooled cosine", code=1)


def test_tiny_fcn_tiles_match_whole_image(tiny_fcn_clean, tmp_path):
    data = tmp_path / "images"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(300, 200), (180, 260)]):
        np.savez(data / f"img{i}.npz", image=rng.random((1, 3, h, w), dtype=np.float32))
    proc = run_cli("run", str(tiny_fcn_clean), "--inputs", str(data), "--chunk", "128", "--overlap", "16", "--json", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["chunking_error"]["rel_l2"] < 1e-5  # overlap 16 >= receptive field 9: centre merge is exact
    assert report["inputs"][0]["chunks"] == 6  # 3 rows x 2 columns of 128-pixel tiles, stride 112
    proc = run_cli("run", str(tiny_fcn_clean), "--inputs", str(data), "--chunk", "128", "--overlap", "32", "--merge", "gaussian",
                   "--json", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chunking_error"]["rel_l2"] < 2e-2  # blends weigh some edge pixels too: close, not exact


def test_bad_run_inputs(minilm_clean, tiny_fcn_clean, tmp_path):
    assert_user_error(run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--no-chunking"),
                      "tokens but the model takes at most 512", "--chunk")
    assert_user_error(run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--chunk", "128", "--overlap", "128"),
                      "overlap (128) must be >= 0 and smaller than the chunk size (128)")
    assert_user_error(run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--chunk", "1024"),
                      "--chunk 1024 is larger than the model's axis 'seq' (512)")
    data = tmp_path / "nan"
    data.mkdir()
    bad = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    bad[0, 0, 3, 3] = np.nan
    np.savez(data / "x.npz", image=bad)
    assert_user_error(run_cli("run", str(tiny_fcn_clean), "--inputs", str(data)), "NaN")
    # I/O names that differ between the target and the reference ONNX.
    assert_user_error(run_cli("run", str(tiny_fcn_clean), "--inputs", "calib_data/minilm_long", "--reference", str(minilm_clean)),
                      "pass the ONNX the engine was built from")


def test_logits_are_merged_as_token_weighted_softmax(tmp_path):
    from conftest import FIXTURES

    onnx_path = tmp_path / "cls.onnx"
    assert run_cli("export", "--config", str(FIXTURES / "classifier.yaml"), "-o", str(onnx_path)).returncode == 0
    data = tmp_path / "seqs"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i, n in enumerate((150, 64, 90)):
        np.savez(data / f"s{i}.npz", tokens=rng.integers(0, 50, (1, n)))
    proc = run_cli("run", str(onnx_path), "--inputs", str(data), "--chunk", "32", "--overlap", "0", "--json", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # The model takes 64 positions: s1 runs whole; the others use their 64-position prefix for the chunking error.
    assert report["chunking_error"]["per_input_scope"] == ["prefix of 64 positions", "whole", "prefix of 64 positions"]
    # Mean of embeddings is linear, so a token-weighted merge of 32-token chunks is close to the whole pass.
    assert report["chunking_error"]["cosine"] > 0.95
