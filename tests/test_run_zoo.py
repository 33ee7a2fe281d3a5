"""`trtforge run` on zoo models exported with the real CLI: RoBERTa's own specials (0/2) from its
tokenizer, SegFormer's dense output at 1/4 tiled over 1024x1024 images, ViT's fixed 32x32 input."""

import json

import numpy as np
from conftest import ROOT, run_cli


def _export(workdir, name):
    out = workdir / f"zoo-{name}.onnx"
    if not out.exists():
        proc = run_cli("export", "--config", f"zoo/configs/{name}.yaml", "-o", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_roberta_windows_carry_its_own_specials(workdir, tmp_path):
    onnx_path = _export(workdir, "roberta")
    saved = tmp_path / "out.npz"
    proc = run_cli(
        "run",
        str(onnx_path),
        "--inputs",
        "calib_data/minilm_long",
        "--chunk",
        "64",
        "--overlap",
        "16",
        "--warmup",
        "0",
        "--tokenizer",
        "zoo/tokenizers/roberta-bpe",
        "--json",
        "--save-outputs",
        str(saved),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["outputs"]["last_hidden_state"]["kind"] == "token"
    with np.load(saved) as merged:
        first = report["inputs"][0]
        assert merged[f"{first['name']}/last_hidden_state"].shape[0] == first["length"]  # document positions, no specials
    assert report["chunking_error"]["measured"]


def test_roberta_text_feeds_use_0_and_2():
    """The window feeds themselves: <s>=0 ... </s>=2, never BERT's 101/102."""
    from trtforge.core.config import InputSpec
    from trtforge.core.layout import model_layout
    from trtforge.runtime.documents import Document
    from trtforge.runtime.planning import Limits, plan_document
    from trtforge.runtime.tokenize import TextTokenizer

    tok = TextTokenizer(ROOT / "zoo/tokenizers/roberta-bpe")
    specs = [
        InputSpec(name="input_ids", dtype="int64", shape=["batch", "seq"]),
        InputSpec(name="attention_mask", dtype="int64", shape=["batch", "seq"]),
    ]
    text = (ROOT / "calib_data/minilm_long/turtle_doctest.txt").read_text()[:3000]
    ids = tok.document(text)
    chunks = plan_document(0, Document("t", "text", {}, ids.size, ids, text), specs, model_layout(specs), 64, 16, Limits(seq=128), tok, [])
    assert len(chunks) > 2
    for c in chunks:
        row = c.feeds["input_ids"][0]
        assert row[0] == 0 and row[-1] == 2 and 101 not in row[[0, -1]]
        np.testing.assert_array_equal(row[c.content], ids[c.window.start : c.window.end])


def test_segformer_dense_quarter_scale_tiled_on_large_images(workdir):
    """Issue 9: tile merging assumed output size == input size and crashed at 1/4 resolution."""
    onnx_path = _export(workdir, "segformer")
    clean = run_cli("clean", str(onnx_path))
    assert clean.returncode == 0, clean.stderr[-2000:]
    clean_path = onnx_path.with_name("zoo-segformer.clean.onnx")
    proc = run_cli(
        "run",
        str(clean_path),
        "--inputs",
        "calib_data/images_large",
        "--chunk",
        "128",
        "--overlap",
        "32",
        "--merge",
        "linear",
        "--reference",
        str(onnx_path),
        "--min-pixel-agreement",
        "0.99",
        "--warmup",
        "0",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["outputs"]["logits"]["kind"] == "dense" and report["outputs"]["logits"]["scale"] == 0.25
    assert report["inputs"][0]["length"] == 1024 * 1024 and report["inputs"][0]["chunks"] == 121  # 11 x 11 tiles, stride 96
    assert report["precision_error"]["per_output"]["logits"]["pixel_agreement"] >= 0.99
    chunking = report["chunking_error"]
    assert chunking["measured"] and chunking["per_input"][0]["scope"] == "top-left 256x256 crop"
    assert 0.5 < chunking["per_output"]["logits"]["pixel_agreement"] <= 1.0
    bad = run_cli("run", str(clean_path), "--inputs", "calib_data/images_large", "--chunk", "130", "--overlap", "30", "--warmup", "0")
    assert bad.returncode == 2 and "multiples of 4" in bad.stderr


def test_vit_fixed_size_images_are_resized(workdir):
    onnx_path = _export(workdir, "vit")
    proc = run_cli(
        "run",
        str(onnx_path),
        "--inputs",
        "calib_data/images_eval",
        "--no-chunking",
        "--warmup",
        "0",
        "--json",
        "--output-kind",
        "logits=logits",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert len(report["inputs"]) == 16 and report["inputs"][0]["length"] == 32 * 32  # 96x96 PNGs resized to 32x32
