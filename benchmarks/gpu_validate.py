"""GPU validation of `build` and `run` on the H200 with TensorRT 8.6 (../shared/gpu/README.md), one call.

Expects the payload in out/gpu/: minilm.clean.onnx(+.json), minilm.calib.cache(+.json) and the
pre-tokenized long documents (the GPU machine's Python 3.10 has no tokenizer). Steps:
1. the Q/DQ model from the cache (qdq_from_cache: identical graph to `calibrate`'s output);
2. fp32, fp16 and int8 engines with tiers 128,256,512 (cuBLAS/cuDNN tactic sources off: only stand-ins
   of those libraries exist there), then fp16 and fp32 rebuilt with their timing caches: both build times;
3. one batch of real text per profile on each engine against ONNX Runtime fp32 (rel-L2, pooled cosine);
4. `trtforge run` on the fp16 and int8 engines over the long documents (chunk 256, overlap 32);
5. benchmarks/run.py (a) and (b) on the fp16 engine with 8192-token documents, chunk 512, overlap 64.
Writes JSON to $OUT (or out/gpu_results) and prints the tables last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from trtforge.artifacts import read_sidecar, write_sidecar  # noqa: E402
from trtforge.backends.onnxruntime import OrtRunner  # noqa: E402
from trtforge.backends.tensorrt import BuildOptions, load_trt  # noqa: E402
from trtforge.backends.tensorrt_runtime import TrtRunner  # noqa: E402
from trtforge.build import build  # noqa: E402
from trtforge.calibrate.step import qdq_from_cache  # noqa: E402
from trtforge.onnxio import save_onnx  # noqa: E402

W = ROOT / "out" / "gpu"
OUT = Path(os.environ.get("OUT") or ROOT / "out" / "gpu_results")
TACTICS = "-CUBLAS,-CUBLAS_LT,-CUDNN"
results: dict = {"builds": {}, "profiles": {}, "runs": {}, "errors": []}


def step(name):
    def wrap(fn):
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            except BaseException as exc:  # keep going: one call must report as much as it can
                results["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
            finally:
                print(f"[{name}] {time.perf_counter() - t:.1f} s", flush=True)
        return inner
    return wrap


@step("int8 onnx")
def make_int8():
    clean = W / "minilm.clean.onnx"
    model = qdq_from_cache(clean, W / "minilm.calib.cache")
    save_onnx(model, W / "minilm.int8.onnx")
    side = read_sidecar(clean) or {}
    write_sidecar(W / "minilm.int8.onnx", {**side, "step": "calibrate", "reference_onnx": str(clean),
                                            "cache": str(W / "minilm.calib.cache")})


@step("build")
def build_one(precision, src, tag="", cache_name=None):
    cache = W / (cache_name or f"tc_{precision}.bin")
    opts = BuildOptions(tactic_sources=TACTICS, timing_cache=cache)
    engine = W / f"minilm.{precision}{tag}.engine"
    r = build(src, engine, precision, tiers="128,256,512", backend="tensorrt", options=opts)
    s = r.sidecar
    results["builds"][f"{precision}{tag}"] = {"build_s": s["build_seconds"], "engine_mb": s["engine_bytes"] / 1e6,
                                             "timing_cache_loaded": s["timing_cache"]["loaded"], "notes": s["notes"],
                                             "layers_by_precision": (s.get("layer_summary") or {}).get("by_precision")}
    print(f"built {engine.name}: {s['build_seconds']:.1f} s (timing cache loaded: {s['timing_cache']['loaded']})", flush=True)


def text_batch(docs, length, batch=8):
    ids = np.concatenate([d for d in docs])
    rows = [ids[i * length:(i + 1) * length] for i in range(batch)]
    full = np.stack([np.concatenate([[101], r, [102]]) for r in rows]).astype(np.int64)
    return {"input_ids": full, "attention_mask": np.ones_like(full)}


@step("profiles")
def per_profile(precision, docs, ref):
    mod = load_trt("tensorrt")
    engine = W / f"minilm.{precision}.engine"
    runner = TrtRunner(mod, engine, read_sidecar(engine))
    rows = {}
    for length in (100, 200, 400):  # one batch in each of the profiles 1-128, 129-256, 257-512
        feeds = text_batch(docs, length)
        got = runner.run(feeds)["last_hidden_state"].astype(np.float64)
        exp = ref.run(feeds)["last_hidden_state"].astype(np.float64)
        rel = float(np.linalg.norm(got - exp) / np.linalg.norm(exp))
        pa, pb = exp.mean(axis=1), got.mean(axis=1)
        cos = (pa * pb).sum(1) / (np.linalg.norm(pa, axis=1) * np.linalg.norm(pb, axis=1))
        rows[f"seq {length + 2} (profile {runner.profile_for(feeds)})"] = {"rel_l2": rel, "pooled_cosine_mean": float(cos.mean()),
                                                                            "pooled_cosine_min": float(cos.min()),
                                                                            "gpu_ms": runner.timings[-1].gpu_ms}
    runner.close()
    results["profiles"][precision] = rows


@step("run")
def run_cli(precision, extra=()):
    report = OUT / f"run_{precision}.json"
    cmd = [sys.executable, "-m", "trtforge", "run", str(W / f"minilm.{precision}.engine"), "--inputs", str(W / "long_tokens.jsonl"),
           "--chunk", "256", "--overlap", "32", "--reference", str(W / "minilm.clean.onnx"), "--report", str(report), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, CI="true"))
    print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    results["runs"][precision] = {"exit_code": proc.returncode}
    if report.is_file():
        r = json.loads(report.read_text())
        results["runs"][precision].update({"precision": r["precision_error"]["worst"], "chunking_min_pooled_cosine": r["chunking_error"].get("min_pooled_cosine"),
                                           "latency": r["latency"], "throughput": r["throughput"], "memory": r["memory"], "gates": r["gates"]})


@step("bench")
def bench():
    out = OUT / "bench_run_fp16.json"
    cmd = [sys.executable, "benchmarks/run.py", str(W / "minilm.fp16.engine"), "--inputs", str(W / "long8k_tokens.jsonl"),
           "--reference", str(W / "minilm.clean.onnx"), "--chunk", "512", "--overlap", "64", "--batch-size", "16", "--repeats", "2", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    print(proc.stdout[-3000:], proc.stderr[-3000:], flush=True)
    if out.is_file():
        results["bench"] = json.loads(out.read_text())


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    docs = [np.asarray(json.loads(l)["input_ids"]) for l in (W / "long_tokens.jsonl").read_text().splitlines() if l.strip()]
    quick = "--quick" in sys.argv  # fp16 only: the run and the benchmarks, after a code change
    precisions = ["fp16"] if quick else ["fp32", "fp16", "int8"]
    make_int8()
    sources = {"fp32": W / "minilm.clean.onnx", "fp16": W / "minilm.clean.onnx", "int8": W / "minilm.int8.onnx"}
    for precision in precisions:
        build_one(precision, sources[precision])
    if not quick:
        build_one("fp16", W / "minilm.clean.onnx", tag=".rebuild", cache_name="tc_fp16.bin")
    ref = OrtRunner(W / "minilm.clean.onnx")
    for precision in precisions:
        per_profile(precision, docs, ref)
    run_cli("fp16")
    if not quick:
        run_cli("int8", ("--max-rel-l2", "0.5", "--min-cosine", "0.95"))
    bench()
    (OUT / "gpu_validate.json").write_text(json.dumps(results, indent=2, default=str))
    print("\n== builds (TensorRT 8.6, H200) ==")
    for k, v in results["builds"].items():
        print(f"{k:14s} build {v['build_s']:7.1f} s  engine {v['engine_mb']:7.1f} MB  timing cache loaded {v['timing_cache_loaded']}  {v['layers_by_precision']}")
    print("\n== one batch (8 x seq) per profile vs ONNX Runtime fp32 ==")
    for prec, rows in results["profiles"].items():
        for k, v in rows.items():
            print(f"{prec:5s} {k:24s} rel-L2 {v['rel_l2']:.2e}  pooled cos mean {v['pooled_cosine_mean']:.5f} min {v['pooled_cosine_min']:.5f}  gpu {v['gpu_ms']:.2f} ms")
    print("\n== trtforge run (6 long docs, chunk 256, overlap 32) ==")
    for prec, v in results["runs"].items():
        if "precision" in v:
            lat = v["latency"]["all"]["wall"]
            print(f"{prec:5s} exit {v['exit_code']}  rel-L2 {v['precision']['rel_l2']:.2e} cos {v['precision']['cosine']:.5f}  chunk pooled cos {v['chunking_min_pooled_cosine']:.4f}"
                  f"  p50 {lat['p50_ms']:.2f} p90 {lat['p90_ms']:.2f} p99 {lat['p99_ms']:.2f} ms  {v['throughput']['tokens_per_s']:.0f} tok/s  peak GPU {v['memory'].get('peak_gpu_mb', 0):.0f} MiB  gates {v['gates']['passed']}")
        else:
            print(prec, v)
    if "bench" in results:
        b = results["bench"]
        print(f"\n== benchmarks/run.py fp16: (a) batched/naive {b['a_batched_over_naive']:.2f}x  (b) e2e/bare {b['b_end_to_end_over_bare']:.3f} "
              f"[{b['batched_tokens_per_s']:.0f} vs {b['naive_tokens_per_s']:.0f} tok/s]")
    print("\nerrors:", results["errors"] or "none")


if __name__ == "__main__":
    main()
