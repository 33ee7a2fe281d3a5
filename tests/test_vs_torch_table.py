"""benchmarks/vs_torch.py table: the end-to-end pair says which batch each loop ran, and flags a pair of unequal batches
(the zoo's full-size configs run 64 windows a batch; the torch loop defaults to 16)."""

import json
import subprocess
import sys


def _table(tmp_path, torch_batch):
    (tmp_path / "t.json").write_text(json.dumps({"models": {"minilm": {"end_to_end": {"tokens_per_s": 100.0, "batch": torch_batch}}}}))
    (tmp_path / "r.json").write_text(
        json.dumps(
            {
                "throughput": {"tokens_per_s": 500.0},
                "memory": {},
                "chunking": {"batch_size": 64},
                "latency": {"all": {"wall_over_gpu": 1.5, "wall_over_gpu_p50": 1.1}},
            }
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/vs_torch.py",
            "table",
            "--torch",
            str(tmp_path / "t.json"),
            "--run",
            f"minilm={tmp_path / 'r.json'}",
            "--out",
            str(tmp_path / "o.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout, json.loads((tmp_path / "o.json").read_text())["end_to_end"][0]


def test_the_end_to_end_pair_names_both_batches_and_flags_unequal_ones(tmp_path):
    text, row = _table(tmp_path, 16)
    assert "| minilm | 64 / 16 (unequal!) | 500 | 100 | 5.00x |" in text and (row["trtforge_batch"], row["torch_loop_batch"]) == (64, 16)
    text, _ = _table(tmp_path, 64)
    assert "| minilm | 64 / 64 | 500 |" in text and "unequal" not in text


def test_an_engine_named_model_variant_is_compared_with_the_models_torch_figures(tmp_path):
    """bert-base-fp8 (an FP8 engine of bert-base) gets bert-base's torch eager time, so its ratio is in the table; a
    name that is no model's variant gets none."""
    shape = {"64x512": {"eager_sdpa": {"median_ms": 16.5}}}
    (tmp_path / "t.json").write_text(json.dumps({"models": {"bert-base": {"shapes": shape}}}))
    (tmp_path / "e.json").write_text(
        json.dumps(
            {
                "models": {
                    "bert-base": {"shapes": {"64x512": {"median_ms": 11.0}}},
                    "bert-base-fp8": {"shapes": {"64x512": {"median_ms": 10.0}}, "gemm_precision": "fp8"},
                    "bertbase": {"shapes": {"64x512": {"median_ms": 10.0}}},
                }
            }
        )
    )
    subprocess.run(
        [
            sys.executable,
            "benchmarks/vs_torch.py",
            "table",
            "--torch",
            str(tmp_path / "t.json"),
            "--engine",
            str(tmp_path / "e.json"),
            "--shapes",
            "64x512",
            "--out",
            str(tmp_path / "o.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {r["model"]: r for r in json.loads((tmp_path / "o.json").read_text())["kernels"]}
    assert rows["bert-base"]["eager_over_engine"] == 1.5 and rows["bert-base-fp8"]["eager_over_engine"] == 1.65
    assert rows["bertbase"]["eager_over_engine"] is None


def test_each_model_is_tabled_at_its_own_shapes_and_prefill_engines_against_torch_and_the_one_pass_engine(tmp_path):
    """wav2vec2-base at 8x160000 and the decoder's prefill at 1x4096 without --shapes; two torch halves (eager, and
    torch.compile timed in a step of its own) merged; a stateful engine set against torch eager, torch.compile and the
    one-pass engine of the same model."""
    eager = {
        "models": {
            "qwen2-prefill": {"shapes": {"1x4096": {"eager_sdpa": {"median_ms": 20.0}, "eager_chunked": {"median_ms": 30.0}}}},
            "wav2vec2-base": {"shapes": {"8x160000": {"eager_sdpa": {"median_ms": 60.0}}}},
        }
    }
    compiled = {"models": {"qwen2-prefill": {"shapes": {"1x4096": {"compile": {"median_ms": 15.0}}}}}}
    engines = {
        "models": {
            "qwen2-prefill": {"shapes": {"1x4096": {"median_ms": 10.0, "mode": "one pass", "one_pass": {"median_ms": 10.0}}}},
            "qwen2-prefill-stateful": {
                "shapes": {
                    "1x4096": {"median_ms": 12.5, "mode": "chunk 512", "one_pass": {"skipped": "seq"}, "chunked": {"median_ms": 12.5}}
                }
            },
            "wav2vec2-base": {"shapes": {"8x160000": {"median_ms": 40.0}}},
        }
    }
    for name, data in (("t1", eager), ("t2", compiled), ("e", engines)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    out = subprocess.run(
        [sys.executable, "benchmarks/vs_torch.py", "table", "--torch", str(tmp_path / "t1.json"), "--torch", str(tmp_path / "t2.json")]
        + ["--engine", str(tmp_path / "e.json"), "--out", str(tmp_path / "o.json")],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads((tmp_path / "o.json").read_text())
    kernels = {(r["model"], r["shape"]): r for r in result["kernels"]}
    assert set(kernels) == {("qwen2-prefill", "1x4096"), ("qwen2-prefill-stateful", "1x4096"), ("wav2vec2-base", "8x160000")}
    assert kernels[("wav2vec2-base", "8x160000")]["eager_over_engine"] == 1.5
    assert kernels[("qwen2-prefill-stateful", "1x4096")]["mode"] == "chunk 512"
    prefill = {r["model"]: r for r in result["prefill"]}
    stateful = prefill["qwen2-prefill-stateful"]
    assert stateful["torch_eager_over_engine"] == 1.6 and stateful["torch_compile_over_engine"] == 1.2
    assert stateful["engine_over_one_pass_engine"] == 0.8 and stateful["torch_eager_chunked_ms"] == 30.0
    assert stateful["engine_tokens_per_s"] == 4096 / 12.5 * 1e3
    assert "| qwen2-prefill-stateful | 1x4096 | chunk 512 | 12.50 | 327,680 | 20.00 | 30.00 | 15.00 | 1.60x | 1.20x | 0.80x |" in out.stdout
