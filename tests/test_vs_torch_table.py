"""benchmarks/vs_torch.py table: the end-to-end pair says which batch each loop ran, and flags a pair of unequal batches
(the zoo's H200 configs run 64 windows a batch; the torch loop defaults to 16)."""

import json
import subprocess
import sys


def _table(tmp_path, torch_batch):
    (tmp_path / "t.json").write_text(json.dumps({"models": {"minilm": {"end_to_end": {"tokens_per_s": 100.0, "batch": torch_batch}}}}))
    (tmp_path / "r.json").write_text(json.dumps({"throughput": {"tokens_per_s": 500.0}, "memory": {}, "chunking": {"batch_size": 64},
                                                 "latency": {"all": {"wall_over_gpu": 1.5, "wall_over_gpu_p50": 1.1}}}))
    out = subprocess.run([sys.executable, "benchmarks/vs_torch.py", "table", "--torch", str(tmp_path / "t.json"), "--run",
                          f"minilm={tmp_path / 'r.json'}", "--out", str(tmp_path / "o.json")], capture_output=True, text=True, check=True)
    return out.stdout, json.loads((tmp_path / "o.json").read_text())["end_to_end"][0]


def test_the_end_to_end_pair_names_both_batches_and_flags_unequal_ones(tmp_path):
    text, row = _table(tmp_path, 16)
    assert "| minilm | 64 / 16 (unequal!) | 500 | 100 | 5.00x |" in text and (row["trtforge_batch"], row["torch_loop_batch"]) == (64, 16)
    text, _ = _table(tmp_path, 64)
    assert "| minilm | 64 / 64 | 500 |" in text and "unequal" not in text
