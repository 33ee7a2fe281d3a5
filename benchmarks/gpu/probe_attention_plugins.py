"""Which fused-attention plugins of TensorRT 8.6's plugin library run on this GPU, how fast, how right.

For each candidate it builds a one-layer fp16 network at BERT-base sizes
(12 heads x 64), checks the output against a numpy softmax(QK^T/sqrt(d))V on the same data, and times
it with CUDA events; the comparison is one unfused attention (MatMul, Softmax, MatMul) built by
TensorRT itself from the same network API. Records every error instead of stopping.

    $PY310 benchmarks/gpu/probe_attention_plugins.py --json plugins.json
Candidates: CustomQKVToContextPluginDynamic v2 with var_seqlen=1 (what trtforge's attention pass emits:
packed tokens [B*S, 3E, 1, 1] with each head's q, k, v adjacent, cu_seqlens [B+1], a dummy of length S;
8.6's FusedMHARunnerFP16v2 has sm_90 kernels for S <= 512), v1 (input [S, B, 3E, 1, 1]; its fused sm_90
kernels take EmbLayerNorm's packed mask [B, packed] and only S in 64/96/128/384, else it runs cuBLAS; v1
without a mask hands its fused kernel a null mask pointer, the likely cause of the first probe's segfault)
and fMHA_V2 (input [B, S, N, 3, H], no mask).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trtforge.backends.cuda_memory import DeviceBuffer, cuda_check, cuda_handle, cuda_runtime  # noqa: E402

HEADS, HEAD = 12, 64
HIDDEN = HEADS * HEAD


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q, k, v [B, N, S, H] -> [B, N, S, H], fp32 math."""
    scores = np.einsum("bnsh,bnth->bnst", q, k) / np.sqrt(q.shape[-1])
    scores -= scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnst,bnth->bnsh", probs, v)


def build_and_time(trt, make_network, feeds: dict[str, np.ndarray], out_name: str, iters: int = 50) -> dict:
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    make_network(trt, network)
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    off = sum(1 << int(getattr(trt.TacticSource, n)) for n in ("CUBLAS", "CUBLAS_LT", "CUDNN") if hasattr(trt.TacticSource, n))
    config.set_tactic_sources(config.get_tactic_sources() & ~off)  # cuBLAS/cuDNN are stand-ins on this machine
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        return {"error": "build_serialized_network returned None"}
    engine = trt.Runtime(logger).deserialize_cuda_engine(blob)
    context = engine.create_execution_context()
    cudart = cuda_runtime()
    stream = cuda_check(cudart.cudaStreamCreate())
    buffers = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        dtype = trt.nptype(engine.get_tensor_dtype(name))
        if name in feeds:
            host = np.ascontiguousarray(feeds[name].astype(dtype))
            buf = DeviceBuffer(host.nbytes)
            cuda_check(cudart.cudaMemcpy(buf.ptr, host.ctypes.data, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
        else:
            shape = tuple(context.get_tensor_shape(name))
            host = np.empty(shape, dtype=dtype)
            buf = DeviceBuffer(host.nbytes)
        buffers[name] = (buf, host)
        context.set_tensor_address(name, buf.ptr)
    for _ in range(5):
        context.execute_async_v3(cuda_handle(stream))
    start, end = cuda_check(cudart.cudaEventCreate()), cuda_check(cudart.cudaEventCreate())
    cuda_check(cudart.cudaEventRecord(start, stream))
    for _ in range(iters):
        context.execute_async_v3(cuda_handle(stream))
    cuda_check(cudart.cudaEventRecord(end, stream))
    cuda_check(cudart.cudaEventSynchronize(end))
    ms = cuda_check(cudart.cudaEventElapsedTime(start, end)) / iters
    buf, host = buffers[out_name]
    cuda_check(cudart.cudaMemcpy(host.ctypes.data, buf.ptr, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
    inspector = engine.create_engine_inspector()
    layers = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    kernels = sorted(
        {
            w
            for w in layers.replace('"', " ").replace(",", " ").split()
            if any(t in w.lower() for t in ("fmha", "mha", "flash", "attention", "softmax", "gemm", "myelin"))
        }
    )[:40]
    return {"ms": ms, "output": host.astype(np.float32), "kernels": kernels, "engine_mb": blob.nbytes / 2**20}


CANDIDATES = (
    "CustomQKVToContextPluginDynamic v2 var_seqlen fp16",
    "CustomQKVToContextPluginDynamic v1 fp16 masked",
    "CustomQKVToContextPluginDynamic v1 fp16 no mask",
    "fMHA_V2 fp16",
    "unfused MatMul-Softmax-MatMul fp16",
)


def probe(trt, batch: int, seq: int, only: str | None = None) -> list[dict]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((batch, HEADS, seq, HEAD)).astype(np.float32) for _ in range(3))
    expected = reference(q, k, v)  # [B, N, S, H]
    results = []

    def record(name, fn, to_bnsh):
        if only is not None and name != only:
            return
        entry = {"candidate": name, "batch": batch, "seq": seq}
        try:
            got = fn()
            if "error" in got:
                entry.update(got)
            else:
                out = to_bnsh(got.pop("output"))
                diff = np.linalg.norm(out - expected) / np.linalg.norm(expected)
                entry.update({k2: v2 for k2, v2 in got.items()}, rel_l2=float(diff))
        except Exception as exc:  # record and go on: the point is to learn what fails and how
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["trace"] = traceback.format_exc()[-800:]
        results.append(entry)
        print(json.dumps({k2: v2 for k2, v2 in entry.items() if k2 != "trace"}), flush=True)

    registry = trt.get_plugin_registry()

    def creator(name, version="1"):
        found = registry.get_plugin_creator(name, version, "")
        if found is None:
            raise RuntimeError(f"no plugin creator {name} v{version} in the registry")
        return found

    # CustomQKVToContextPluginDynamic v1: [S, B, 3E, 1, 1] with each head's q, k, v adjacent (N x 3 x H).
    qkv_sb = np.stack([q, k, v], axis=2)  # [B, N, 3, S, H]
    qkv_sb = qkv_sb.transpose(3, 0, 1, 2, 4).reshape(seq, batch, 3 * HIDDEN, 1, 1)
    lengths = np.full((batch,), seq, dtype=np.int32)

    def bert_plugin(mask: bool):
        def make(trt_, network):
            x = network.add_input("qkv", trt_.float16, qkv_sb.shape)
            fields = [
                trt_.PluginField("type_id", np.array([1], np.int32), trt_.PluginFieldType.INT32),
                trt_.PluginField("hidden_size", np.array([HIDDEN], np.int32), trt_.PluginFieldType.INT32),
                trt_.PluginField("num_heads", np.array([HEADS], np.int32), trt_.PluginFieldType.INT32),
                trt_.PluginField("has_mask", np.array([int(mask)], np.int32), trt_.PluginFieldType.INT32),
            ]
            plugin = creator("CustomQKVToContextPluginDynamic").create_plugin("mha", trt_.PluginFieldCollection(fields))
            inputs = [x]
            if mask:
                inputs.append(network.add_input("mask", trt_.int32, (batch, 1)))  # 2-D: supportsFormatCombination
            layer = network.add_plugin_v2(inputs, plugin)
            layer.get_output(0).name = "out"
            layer.get_output(0).dtype = trt_.float16
            network.mark_output(layer.get_output(0))

        feeds = {"qkv": qkv_sb}
        if mask:
            feeds["mask"] = lengths.reshape(batch, 1)
        return lambda: build_and_time(trt, make, feeds, "out")

    # v2 var_seqlen: tokens [B*S, 3E, 1, 1] (batch-major), mask dummy, cu_seqlens [B+1], dummy [S].
    qkv_tok = np.stack([q, k, v], axis=2).transpose(0, 3, 1, 2, 4).reshape(batch * seq, 3 * HIDDEN, 1, 1)  # [B,S,N,3,H]
    cu = (np.arange(batch + 1) * seq).astype(np.int32)

    def bert_v2():
        def make(trt_, network):
            x = network.add_input("qkv", trt_.float16, qkv_tok.shape)
            cu_t = network.add_input("cu_seqlens", trt_.int32, cu.shape)
            dummy = network.add_input("max_seqlen", trt_.int32, (seq,))
            fields = [
                trt_.PluginField(n, np.array([val], np.int32), trt_.PluginFieldType.INT32)
                for n, val in (("type_id", 1), ("hidden_size", HIDDEN), ("num_heads", HEADS), ("has_mask", 1), ("var_seqlen", 1))
            ]
            plugin = creator("CustomQKVToContextPluginDynamic", "2").create_plugin("mha", trt_.PluginFieldCollection(fields))
            layer = network.add_plugin_v2([x, dummy, cu_t, dummy], plugin)
            layer.get_output(0).name = "out"
            network.mark_output(layer.get_output(0))

        return build_and_time(trt, make, {"qkv": qkv_tok, "cu_seqlens": cu, "max_seqlen": np.zeros(seq, np.int32)}, "out")

    record(
        "CustomQKVToContextPluginDynamic v2 var_seqlen fp16", bert_v2, lambda o: o.reshape(batch, seq, HEADS, HEAD).transpose(0, 2, 1, 3)
    )

    to_bnsh_sb = lambda o: o.reshape(seq, batch, HEADS, HEAD).transpose(1, 2, 0, 3)  # noqa: E731
    record("CustomQKVToContextPluginDynamic v1 fp16 masked", bert_plugin(True), to_bnsh_sb)
    record("CustomQKVToContextPluginDynamic v1 fp16 no mask", bert_plugin(False), to_bnsh_sb)

    # fMHA_V2: [B, S, N, 3, H] -> [B, S, N, H], no mask.
    packed = np.stack([q, k, v], axis=3).transpose(0, 2, 1, 3, 4)  # [B, S, N, 3, H]

    def fmha():
        def make(trt_, network):
            x = network.add_input("qkv", trt_.float16, packed.shape)
            plugin = creator("fMHA_V2").create_plugin("fmha", trt_.PluginFieldCollection([]))
            layer = network.add_plugin_v2([x], plugin)
            layer.get_output(0).name = "out"
            network.mark_output(layer.get_output(0))

        return build_and_time(trt, make, {"qkv": packed}, "out")

    record("fMHA_V2 fp16", fmha, lambda o: o.reshape(batch, seq, HEADS, HEAD).transpose(0, 2, 1, 3))

    # The unfused baseline TensorRT builds from MatMul / Softmax / MatMul (scale on Q, as its docs ask).
    def unfused():
        def make(trt_, network):
            tq, tk, tv = (network.add_input(n, trt_.float16, (batch, HEADS, seq, HEAD)) for n in ("q", "k", "v"))
            scale = network.add_constant((1, 1, 1, 1), np.array([1 / np.sqrt(HEAD)], np.float16)).get_output(0)
            qs = network.add_elementwise(tq, scale, trt_.ElementWiseOperation.PROD).get_output(0)
            scores = network.add_matrix_multiply(qs, trt_.MatrixOperation.NONE, tk, trt_.MatrixOperation.TRANSPOSE).get_output(0)
            soft = network.add_softmax(scores)
            soft.axes = 1 << 3
            out = network.add_matrix_multiply(soft.get_output(0), trt_.MatrixOperation.NONE, tv, trt_.MatrixOperation.NONE).get_output(0)
            out.name = "out"
            network.mark_output(out)

        return build_and_time(trt, make, {"q": q, "k": k, "v": v}, "out")

    record("unfused MatMul-Softmax-MatMul fp16", unfused, lambda o: o)
    return results


def one_in_a_process(name: str, batch: int, seq: int) -> dict:
    """A candidate in its own process: a plugin that crashes (a segfault killed the first version of this
    probe, taking every other figure with it) is recorded with its exit code and stderr."""
    import subprocess

    cmd = [sys.executable, __file__, "--one", name, "--batch", str(batch), "--seq", str(seq)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return {"candidate": name, "batch": batch, "seq": seq, "error": "timed out after 180 s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {
        "candidate": name,
        "batch": batch,
        "seq": seq,
        "error": f"exit code {proc.returncode}",
        "trace": (proc.stderr or proc.stdout)[-800:],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", help="run one candidate in this process and print its JSON line")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--shapes", default="16x128,16x512,64x512", help="BATCHxSEQ,... to probe")
    parser.add_argument("--only", help="comma-separated candidate names (default: all)")
    args = parser.parse_args()
    import tensorrt as trt

    trt.init_libnvinfer_plugins(trt.Logger(trt.Logger.ERROR), "")
    if args.one:
        probe(trt, args.batch, args.seq, only=args.one)  # prints the entry as a JSON line
        return
    creators = sorted({(c.name, c.plugin_version) for c in trt.get_plugin_registry().plugin_creator_list})
    print("plugin creators:", ", ".join(f"{n} v{v}" for n, v in creators), flush=True)
    results = {"tensorrt": trt.__version__, "creators": creators, "probes": []}
    shapes = [tuple(int(v) for v in part.split("x")) for part in args.shapes.split(",") if part]
    names = [n.strip() for n in args.only.split(",")] if args.only else list(CANDIDATES)
    for batch, seq in shapes:
        for name in names:
            entry = one_in_a_process(name, batch, seq)
            print(json.dumps({k: v for k, v in entry.items() if k != "trace"}), flush=True)
            results["probes"].append(entry)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1, default=str))
    print("\n| candidate | batch x seq | ms | rel-L2 vs numpy | error |")
    print("|---|---|---|---|---|")
    for r in results["probes"]:
        print(
            f"| {r['candidate']} | {r['batch']}x{r['seq']} | {r.get('ms', float('nan')):.3f} | {r.get('rel_l2', float('nan')):.2e} | {r.get('error', '')[:120]} |"
        )


if __name__ == "__main__":
    main()
