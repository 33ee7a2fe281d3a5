"""benchmarks/memory.py (c): peak memory of a chunked run against one whole pass at 8192 tokens.

The model is BERT-shaped with 8192 position embeddings and random weights (4 layers, hidden 256,
4 heads), so that the whole 8192-token input is a legal single pass. Target: chunked <= 0.1x whole.

    python benchmarks/memory.py export out/bert8k.onnx              # needs torch + transformers
    python benchmarks/memory.py measure out/bert8k.onnx --backend tensorrt|onnxruntime [--json F]

TensorRT: two engines (chunked: batch <= 16, seq <= 512; whole: batch 1, seq 8192), each run through
trtforge's runner; the figure is its peak GPU memory (engine, contexts, buffers). ONNX Runtime (CPU):
each mode in a fresh process, the peak RSS growth over the loaded session.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKENS, CHUNK, OVERLAP, BATCH = 8192, 512, 64, 16


def export(path: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    from trtforge.core.artifacts import write_sidecar

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=TOKENS,
        attn_implementation="eager",
    )
    model = BertModel(config).eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(1000, 30000, (2, 64))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        Wrap(model),
        (ids, torch.ones_like(ids)),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
    )
    spec = lambda n, r: {"name": n, "dtype": "int64", "shape": ["batch", "seq"], "value_range": r}  # noqa: E731
    write_sidecar(
        path,
        {
            "kind": "onnx",
            "step": "export",
            "inputs": [spec("input_ids", [1000, 30000]), spec("attention_mask", [1, 2])],
            "axes": {"batch": {"min": 1, "opt": 8, "max": 16}, "seq": {"min": 1, "opt": 512, "max": TOKENS}},
        },
    )


def _chunk_batches(batch: int = BATCH) -> list[dict[str, np.ndarray]]:
    from trtforge.runtime.chunking import plan_windows
    from trtforge.runtime.documents import Chunk
    from trtforge.runtime.planning import make_batches, stack

    ids = np.random.default_rng(0).integers(1000, 30000, TOKENS)
    chunks = []
    for i, w in enumerate(plan_windows(TOKENS, CHUNK, OVERLAP)):
        x = ids[w.start : w.end][None].astype(np.int64)
        chunks.append(Chunk(0, i, {"input_ids": x, "attention_mask": np.ones_like(x)}, w, w.length))
    return [stack(b) for b in make_batches(chunks, batch)]


def _whole() -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).integers(1000, 30000, (1, TOKENS)).astype(np.int64)
    return {"input_ids": x, "attention_mask": np.ones_like(x)}


def measure_tensorrt(onnx_path: Path) -> dict:
    from trtforge.backends.tensorrt import BuildOptions, load_trt
    from trtforge.backends.tensorrt_runtime import TrtRunner
    from trtforge.build.step import build
    from trtforge.core.artifacts import read_sidecar

    mod = load_trt("tensorrt")
    out = {}
    modes = [(f"chunked_batch{b}", f"seq={CHUNK};batch={b}", _chunk_batches(b)) for b in (1, BATCH)]
    for mode, tiers, feeds in modes + [("whole", f"seq={TOKENS};batch=1", [_whole()])]:
        engine = onnx_path.with_name(f"{onnx_path.stem}.{mode}.engine")
        build(onnx_path, engine, "fp16", tiers=tiers, backend="tensorrt", options=BuildOptions(tactic_sources="-CUBLAS,-CUBLAS_LT,-CUDNN"))
        # one staging slot in every mode: the pipeline's extra slots would inflate both sides alike
        runner = TrtRunner(mod, engine, read_sidecar(engine), slots=1)
        list(runner.run_many([(i, f) for i, f in enumerate(feeds)]))
        out[mode] = {"peak_mb": runner.peak_bytes / 2**20, "batches": len(feeds)}
        runner.close()
    out["chunked"] = out[f"chunked_batch{BATCH}"]
    return out


def _ort_child(onnx_path: str, mode: str) -> None:
    import resource

    from trtforge.backends.onnxruntime import OrtRunner

    runner = OrtRunner(onnx_path)
    small = {"input_ids": np.full((1, 8), 1000, np.int64), "attention_mask": np.ones((1, 8), np.int64)}
    runner.run(small)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for feeds in _chunk_batches() if mode == "chunked" else [_whole()]:
        runner.run(feeds)
    print(json.dumps({"peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))


def measure_ort(onnx_path: Path) -> dict:
    out = {}
    for mode in ("chunked", "whole"):
        proc = subprocess.run([sys.executable, __file__, "_child", str(onnx_path), mode], capture_output=True, text=True, check=True)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _ort_child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["export", "measure"])
    parser.add_argument("onnx", type=Path)
    parser.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "tensorrt"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.action == "export":
        export(args.onnx)
        return
    result = measure_tensorrt(args.onnx) if args.backend == "tensorrt" else measure_ort(args.onnx)
    result["ratio_chunked_over_whole"] = result["chunked"]["peak_mb"] / result["whole"]["peak_mb"]
    result["backend"] = args.backend
    print(
        f"(c) {args.backend}: chunked peak {result['chunked']['peak_mb']:.0f} MiB, whole 8192-token pass "
        f"{result['whole']['peak_mb']:.0f} MiB, ratio {result['ratio_chunked_over_whole']:.3f} (target <= 0.1)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
