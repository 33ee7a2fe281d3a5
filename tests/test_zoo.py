"""The zoo through the whole CPU pipeline: real transformers architectures trtforge did not write,
given as `zoo/models.py:FACTORY` with no wrapper, default exporter, export -> clean -> calibrate ->
build (tensorrt-rtx) -> run (ONNX Runtime on the engine's ONNX), with gates that are evaluated.

Each config's gates must show up as evaluated and passed in the reports, the task metric of each
output kind must be measured (top-1 for logits, per-pixel argmax for dense, cosine for token and
pooled), and the chunking error must be measured wherever the config chunks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, require, run_cli

require("tensorrt_rtx")

# DETR and wav2vec2 are in test_export_zoo and test_new_families: DETR's outputs have no kind yet, and no audio
# calibration set exists.
ZOO = (
    "bert",
    "roberta",
    "gpt2",
    "vit",
    "resnet",
    "segformer",
    "distilbert",
    "deberta",
    "t5-encoder",
    "swin",
    "convnext",
    "clip-vision",
    "dinov2",
    "mpnet",
)
TASK_METRIC = {"logits": "top1_agreement", "dense": "pixel_agreement", "token": "mean_item_cosine", "pooled": "mean_item_cosine"}


@pytest.fixture(scope="module")
def zoo_runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    out = tmp_path_factory.mktemp("zoo")
    results = {}
    for name in ZOO:
        proc = run_cli("pipeline", f"zoo/configs/{name}.yaml", "--out-dir", str(out / name), "--json", timeout=1200)
        results[name] = (out / name, proc)
    return results


def _config(name: str):
    from trtforge.core.config import load_config

    return load_config(ROOT / "zoo" / "configs" / f"{name}.yaml")


@pytest.mark.parametrize("name", ZOO)
def test_pipeline_passes_with_gates(zoo_runs, name):
    folder, proc = zoo_runs[name]
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout)
    assert {s["step"]: s["status"] for s in report["steps"]} == dict.fromkeys(("export", "clean", "calibrate", "build", "run"), "ran")
    cfg = _config(name)
    run = json.loads((folder / f"{cfg.name}.run.json").read_text())
    kinds = {o.name: o.kind for o in cfg.outputs}
    assert {k: v["kind"] for k, v in run["outputs"].items()} == kinds
    images = any(i.dtype.startswith("float") and len(i.shape) == 4 for i in cfg.inputs)
    assert run["throughput"]["unit"] == ("pixels" if images else "tokens")  # not 'tokens/s' of pixels

    # Precision: the engine's ONNX against the fp32 reference, measured (not a comparison with itself).
    assert run["precision_error"]["measured"], run["precision_error"]
    for output, kind in kinds.items():
        assert TASK_METRIC[kind] in run["precision_error"]["per_output"][output], (output, kind)

    # Every gate the config sets was evaluated and passed.
    checked = {c["gate"]: c for c in run["gates"]["checked"]}
    for gate in ("min_top1_agreement", "min_pixel_agreement", "min_chunk_cosine"):
        if getattr(cfg.run, gate) is not None:
            assert checked[gate]["status"] == "passed", checked.get(gate)
    assert run["gates"]["passed"] and not run["gates"]["failures"]

    # Chunking, where the config chunks: measured on an input the model also takes whole.
    if cfg.run.chunk is not None:
        assert run["chunking_error"]["measured"], run["chunking_error"]

    # Calibration judged by the task metric of each output kind on held-out data.
    int8 = json.loads((folder / f"{cfg.name}.int8.onnx.json").read_text())
    held_out = int8["accuracy"]["per_output"]
    for output, kind in kinds.items():
        assert TASK_METRIC[kind] in held_out[output], (output, held_out[output])
    if cfg.calibrate.min_top1_agreement is not None:
        assert min(m["top1_agreement"] for m in held_out.values() if "top1_agreement" in m) >= cfg.calibrate.min_top1_agreement
    if cfg.calibrate.min_pixel_agreement is not None:
        assert min(m["pixel_agreement"] for m in held_out.values() if "pixel_agreement" in m) >= cfg.calibrate.min_pixel_agreement


def test_text_models_use_their_own_special_tokens(zoo_runs):
    """The tokenizer export saved beside each text model wraps windows in that model's own specials:
    BERT [CLS]=101 ... [SEP]=102, RoBERTa <s>=0 ... </s>=2, GPT-2 none."""
    from trtforge.runtime.tokenize import TextTokenizer

    expected = {"bert": ([101], [102]), "roberta": ([0], [2]), "gpt2": ([], [])}
    for name, (prefix, suffix) in expected.items():
        folder, proc = zoo_runs[name]
        assert proc.returncode == 0, proc.stderr[-2000:]
        tok = TextTokenizer(folder / f"{_config(name).name}.tokenizer")
        window = tok.windows("The module is imported once. " * 40, 64, 16)[1]
        ids = window.ids.tolist()
        assert (tok.prefix, tok.suffix) == (prefix, suffix), name
        assert ids[: len(prefix)] == prefix and ids[len(ids) - len(suffix) :] == suffix, (name, ids)


def test_int8_gate_can_fail_on_the_zoo(zoo_runs, tmp_path):
    """The held-out gate is not vacuous on these models: minmax without smoothing or fallback, with the
    attention MatMuls quantized too, misses a tight floor and exits 1."""
    folder, proc = zoo_runs["bert"]
    assert proc.returncode == 0
    clean = folder / "zoo-bert.clean.onnx"
    res = run_cli(
        "calibrate",
        str(clean),
        "--data",
        "calib_data/minilm",
        "--eval-data",
        "calib_data/minilm_eval",
        "--max-samples",
        "32",
        "--max-eval-samples",
        "32",
        "--method",
        "percentile",
        "--percentile",
        "90",
        "--no-smooth",
        "--no-fallback",
        "--quantize-attention",
        "--min-cosine",
        "0.999",
        "-o",
        str(tmp_path / "bad.int8.onnx"),
    )
    assert res.returncode == 1, (res.returncode, res.stdout[-1500:], res.stderr[-1500:])
