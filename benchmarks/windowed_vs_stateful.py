"""Windowed (overlap) vs stateful (KV-cache) chunking for causal decoders, on the same documents.

For each model (zoo GPT-2 LM: absolute positions; zoo LLaMA: rotary, GQA; small random init) and each
document of calib_data/minilm_long cut to --tokens tokens:
- full: one pass over the whole document (the reference);
- windowed: windows of --chunk tokens overlapping by O, each run from position 0 with no context before
  it (what `trtforge run --chunk --overlap` does), merged with the center rule (trtforge.chunking);
- stateful: chunks of --chunk tokens, each attending to the KV cache of all earlier ones.
Error = rel-L2 and top-1 agreement of the logits against the full pass; throughput = tokens/s (wall,
ONNX Runtime CPU). Prints a table; writes benchmarks/results/windowed_vs_stateful.json.

    PYTHONPATH=. python benchmarks/windowed_vs_stateful.py [--tokens 1024] [--chunk 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trtforge.artifacts import write_json_atomic  # noqa: E402
from trtforge.chunking import merge_windows, plan_windows  # noqa: E402
from trtforge.config import load_config  # noqa: E402
from trtforge.kvcache import export_kv  # noqa: E402
from trtforge.verify.compare import compare_arrays as compare  # noqa: E402
from trtforge.stateful import OrtStepper, load_token_docs, tokenizer_encoder  # noqa: E402

CONFIGS = {"gpt2-lm": "zoo/configs/gpt2-kv.yaml", "llama": "zoo/configs/llama-kv.yaml"}


def windowed(stepper: OrtStepper, ids: np.ndarray, chunk: int, overlap: int) -> np.ndarray:
    windows = plan_windows(ids.size, chunk, overlap)
    outs = []
    for w in windows:
        stepper.reset()
        outs.append(stepper.step(ids[w.start:w.end], 0))  # positions 0.., no context: a model without cache
    return merge_windows(outs, windows, ids.size, "center")


def stateful(stepper: OrtStepper, ids: np.ndarray, chunk: int) -> np.ndarray:
    stepper.reset()
    return np.concatenate([stepper.step(ids[a:a + chunk], a) for a in range(0, ids.size, chunk)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--overlaps", default="0,32,64")
    ap.add_argument("--docs", type=Path, default=ROOT / "calib_data/minilm_long")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/windowed_vs_stateful.json")
    args = ap.parse_args()
    overlaps = [int(v) for v in args.overlaps.split(",")]
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for label, cfg_path in CONFIGS.items():
            cfg = load_config(ROOT / cfg_path)
            onnx_path = Path(tmp) / f"{label}.kv.onnx"
            side = export_kv(cfg, onnx_path).sidecar
            stepper = OrtStepper(onnx_path, side["kv_cache"]["layout"])
            docs = load_token_docs(args.docs, tokenizer_encoder(side, onnx_path), args.tokens)
            modes = [("stateful", None)] + [("windowed", o) for o in overlaps]
            acc = {m: {"ref": [], "got": [], "seconds": 0.0} for m in modes}
            full_seconds, tokens = 0.0, 0
            for _name, ids in docs:
                t0 = time.perf_counter()
                full = stepper.full(ids)
                full_seconds += time.perf_counter() - t0
                tokens += ids.size
                for mode in modes:
                    t0 = time.perf_counter()
                    got = stateful(stepper, ids, args.chunk) if mode[0] == "stateful" else windowed(stepper, ids, args.chunk, mode[1])
                    acc[mode]["seconds"] += time.perf_counter() - t0
                    acc[mode]["ref"].append(full)
                    acc[mode]["got"].append(got)
            for mode in modes:
                m = compare(np.concatenate(acc[mode]["ref"]), np.concatenate(acc[mode]["got"]), "logits")
                tps = tokens / acc[mode]["seconds"]
                results.append({"model": label, "mode": mode[0], "overlap": mode[1], "chunk": args.chunk, "documents": len(docs),
                                "tokens": int(tokens), **m, "tokens_per_s": tps, "full_pass_tokens_per_s": tokens / full_seconds})
                rows.append((label, mode[0] if mode[1] is None else f"windowed o={mode[1]}", m["rel_l2"], m["top1_agreement"], tps))
    print(f"{'model':8} {'mode':14} {'rel-L2 vs full':>15} {'top-1 agree':>12} {'tokens/s':>10}")
    for r in rows:
        print(f"{r[0]:8} {r[1]:14} {r[2]:15.3e} {r[3]:12.4f} {r[4]:10.0f}")
    write_json_atomic(args.out, {"schema": "trtforge.bench.windowed_vs_stateful/1", "tokens_per_document": args.tokens,
                                 "backend": "onnxruntime CPU fp32", "results": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
