"""The real CLI, end to end: export then clean on MiniLM and tiny-fcn, and the export error cases."""

import json

import numpy as np
import pytest
from conftest import FIXTURES, ROOT, assert_user_error, run_cli

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.verify.metrics import rel_l2


def test_minilm_export_sidecar(minilm_onnx):
    side = json.loads(minilm_onnx.with_name("minilm.onnx.json").read_text())
    assert side["source"] == "minilm" and side["opset"] == 17 and side["torch_version"]
    assert [i["name"] for i in side["inputs"]] == ["input_ids", "attention_mask"]
    assert side["outputs"][0]["name"] == "last_hidden_state"
    # The sidecar contract: the output's kind, and the tokenizer saved beside the ONNX.
    assert side["outputs"][0]["kind"] == "token" and side["tokenizer"] == "minilm.tokenizer"
    assert (minilm_onnx.with_name("minilm.tokenizer") / "tokenizer.json").is_file()
    assert len(side["graph_hash"]) == 64
    checked = {(c["axis"], c["size"]) for c in side["check"]}
    # the config's check sizes, then each axis at its configured max (where a model's own limits show)
    assert checked == {("batch", 1), ("batch", 3), ("batch", 32), ("seq", 7), ("seq", 131), ("seq", 512)}
    assert all(m["rel_l2"] <= 1e-4 for c in side["check"] for m in c["metrics"].values())


def test_minilm_clean_matches_torch_at_seq_16_and_384(minilm_clean):
    """The issue's done-when: ORT on the cleaned ONNX matches PyTorch at seq 16 and 384, batch 2."""
    import torch

    from trtforge.models import load_model

    loaded = load_model("minilm")
    runner = OrtRunner(minilm_clean)
    rng = np.random.default_rng(1)
    for seq in (16, 384):
        ids = rng.integers(1000, 30000, size=(2, seq)).astype(np.int64)
        mask = np.ones((2, seq), dtype=np.int64)
        mask[1, seq // 2 :] = 0  # padding in the second row
        with torch.no_grad():
            ref = loaded.module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        got = runner.run({"input_ids": ids, "attention_mask": mask})["last_hidden_state"]
        assert rel_l2(ref, got) <= 1e-5, (seq, rel_l2(ref, got))
    side = json.loads(minilm_clean.with_name("minilm.clean.onnx.json").read_text())
    assert side["verify_rel_l2"]["last_hidden_state"] <= 1e-5
    assert side["tokenizer"] == "minilm.tokenizer"  # the cleaned ONNX still leads to the tokenizer
    assert side["parent_graph_hash"] != side["graph_hash"] or side["nodes_before"] == side["nodes_after"]


def test_tiny_fcn_export_and_clean(tiny_fcn_clean):
    side = json.loads(tiny_fcn_clean.with_name("tiny-fcn.clean.onnx.json").read_text())
    # BatchNorm is folded into the convolutions by the exporter or the folding pass.
    assert side["nodes_after"] <= side["nodes_before"]
    assert "BatchNormalization" not in json.dumps(side)
    runner = OrtRunner(tiny_fcn_clean)
    out = runner.run({"image": np.random.default_rng(0).random((1, 3, 40, 52), dtype=np.float32)})
    assert out["logits"].shape == (1, 4, 40, 52)


def test_clean_cli_prints_table(minilm_onnx, tmp_path):
    proc = run_cli("clean", str(minilm_onnx), "-o", str(tmp_path / "c.onnx"))
    assert proc.returncode == 0, proc.stderr
    assert "MatMul" in proc.stdout and "initializer MB" in proc.stdout and "rel-L2" in proc.stdout
    assert "\x1b[" not in proc.stdout  # no ANSI codes under CI


def test_dynamo_exporter_with_dropout_model_then_clean(tmp_path):
    out = tmp_path / "mlp.onnx"
    proc = run_cli("export", "--model", f"{FIXTURES}/user_models.py:small_mlp", "--exporter", "dynamo", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exporter"] == "dynamo" and {c["axis"] for c in report["check"]} == {"batch"}
    proc = run_cli("clean", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert max(json.loads(proc.stdout)["verify_rel_l2"].values()) <= 1e-5


def test_baked_sequence_length_is_detected_and_named(tmp_path):
    """The legacy exporter bakes the example length into nn.TransformerEncoderLayer's reshapes."""
    proc = run_cli("export", "--config", str(FIXTURES / "transformer.yaml"), "-o", str(tmp_path / "t.onnx"))
    line = assert_user_error(proc, "not dynamic in axis 'seq'", "Reshape node", "--exporter dynamo")
    assert "seq=5" in line and "exported at 10" in line
    assert not (tmp_path / "t.onnx").exists()
    # The dynamo exporter traces symbolic shapes: the same model passes.
    proc = run_cli("export", "--config", str(FIXTURES / "transformer.yaml"), "--exporter", "dynamo", "-o", str(tmp_path / "t.onnx"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--model", "missing/model.py:factory"], ["missing/model.py", "does not exist"]),
        (["--model", f"{FIXTURES}/user_models.py:broken_factory"], ["raised RuntimeError: weights file corrupted"]),
        (["--model", f"{FIXTURES}/user_models.py:wrong_return"], ["must return (module"]),
        (["--model", f"{FIXTURES}/user_models.py:no_such"], ["has no function 'no_such'"]),
        (["--model", "resnet9000"], ["unknown model 'resnet9000'", "minilm"]),
        (["--model", f"{FIXTURES}/user_models.py:small_mlp", "--opset", "99"], ["--opset must be at most", "got 99"]),
        (["--model", "missing.pt2"], ["missing.pt2 does not exist"]),
    ],
)
def test_export_bad_input(args, fragments, tmp_path):
    proc = run_cli("export", *args, "-o", str(tmp_path / "x.onnx"))
    assert_user_error(proc, *fragments)
    assert not list(tmp_path.iterdir())


def test_export_misspelled_config_key(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text((ROOT / "configs" / "minilm.yaml").read_text().replace("exporter:", "exproter:"))
    proc = run_cli("export", "--config", str(cfg), "-o", str(tmp_path / "x.onnx"))
    assert_user_error(proc, str(cfg), "'export.exproter'", "did you mean 'exporter'")


@pytest.mark.parametrize(
    "content,fragment",
    [
        (b"", "holds no graph nodes"),
        (b"\x08\x07garbage-not-protobuf" * 10, "ONNX"),
    ],
)
def test_clean_corrupt_onnx(tmp_path, content, fragment):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    proc = run_cli("clean", str(bad))
    assert_user_error(proc, fragment)
    assert not (tmp_path / "bad.clean.onnx").exists()


def test_clean_truncated_onnx(minilm_onnx, tmp_path):
    data = minilm_onnx.read_bytes()
    bad = tmp_path / "trunc.onnx"
    bad.write_bytes(data[: len(data) // 3])
    assert_user_error(run_cli("clean", str(bad)), "trunc.onnx")


def test_doctor_reports(tmp_path):
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["versions"]["onnxruntime"] and "CPUExecutionProvider" in data["onnxruntime_providers"]
    assert "build (tensorrt_rtx, ahead of time)" in data["features"]
    proc = run_cli("doctor")
    assert "features" in proc.stdout and "GPU" in proc.stdout
