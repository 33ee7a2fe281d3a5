"""TrtforgeFlashAttention (trtforge/native/sdpa_plugin.cpp) on its own, on the GPU machine under TensorRT 8.6: one
engine per case holding just the plugin node, checked against a float64 numpy attention on random packed QKV, and
timed beside TensorRT 8.6's own CustomQKVToContextPluginDynamic v2 on the same input (where it has a kernel).

    $PY310 benchmarks/gpu/flash_plugin_check.py LIB.so --out W/plugin_check.json

Prints a table last: case, rel-L2 vs float64, ms per attention (CUDA events, median of 5 x 50), TFLOP/s
(4·B·S²·E, halved when causal), v2's ms where it runs. Every case records its error instead of stopping the script."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trtforge.backends.tensorrt_runtime import DeviceBuffer, _cudart, _handle, _ok  # noqa: E402
from trtforge.fusion.plugins import FLASH_PLUGIN, FLASH_VERSION, PLUGIN, PLUGIN_DOMAIN, PLUGIN_VERSION  # noqa: E402

CASES = [  # (batch, seq, heads, head, causal)
    (2, 128, 12, 64, 0), (3, 77, 12, 64, 0), (2, 200, 12, 64, 1), (4, 256, 12, 32, 0), (16, 512, 12, 64, 0),
    (64, 512, 12, 64, 0), (16, 512, 12, 32, 0), (16, 1024, 12, 64, 1),
]


def attention_model(op: str, e: int, heads: int, scale: float, causal: int) -> onnx.ModelProto:
    qkv = helper.make_tensor_value_info("qkv", TensorProto.FLOAT16, ["T", 3 * e, 1, 1])
    seq = helper.make_tensor_value_info("seq", TensorProto.INT32, ["S"])
    out = helper.make_tensor_value_info("ctx", TensorProto.FLOAT16, ["T", e, 1, 1])
    if op == FLASH_PLUGIN:
        node = helper.make_node(FLASH_PLUGIN, ["qkv", "seq"], ["ctx"], domain=PLUGIN_DOMAIN, plugin_version=FLASH_VERSION,
                                plugin_namespace="", hidden_size=e, num_heads=heads, scale=scale, causal=causal)
        inputs = [qkv, seq]
    else:  # v2, var_seqlen: every row full; it scales by 1/sqrt(head) itself
        cu = helper.make_tensor_value_info("cu_seqlens", TensorProto.INT32, ["B1"])
        node = helper.make_node(PLUGIN, ["qkv", "seq", "cu_seqlens", "seq"], ["ctx"], domain=PLUGIN_DOMAIN,
                                plugin_version=PLUGIN_VERSION, plugin_namespace="", type_id=1, hidden_size=e, num_heads=heads,
                                has_mask=1, var_seqlen=1)
        inputs = [qkv, seq, cu]
    graph = helper.make_graph([node], "attention", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(PLUGIN_DOMAIN, 1)])


# (plugin, tokens, K, N, bias): FC1 + GELU at BERT-base's 2x1024 / 16x512 / 64x512 and MiniLM's; TrtforgeGemm at the
# output projection (with bias) and FC2 (without: the skip-LayerNorm plugin takes FC2's bias).
GEMM_CASES = [("gelu", 2048, 768, 3072, True), ("gelu", 8192, 768, 3072, True), ("gelu", 32768, 768, 3072, True),
              ("gelu", 1000, 384, 1536, True), ("gemm", 8192, 768, 768, True), ("gemm", 32768, 768, 768, True),
              ("gemm", 32768, 3072, 768, False), ("gemm", 32768, 768, 2304, True)]


def gemm_gelu_model(k: int, n: int, w: np.ndarray, b: np.ndarray | None, gelu: bool = True) -> onnx.ModelProto:
    from onnx import numpy_helper

    from trtforge.fusion.gelu import GEMM_PLUGIN, GEMM_VERSION
    from trtforge.fusion.gemm import PLUGIN as GEMM_ONLY

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["T", k])
    y = helper.make_tensor_value_info("ctx", TensorProto.FLOAT16, ["T", n])
    bias = {"bias": numpy_helper.from_array(b, "b")} if b is not None else {}
    node = helper.make_node(GEMM_PLUGIN if gelu else GEMM_ONLY, ["x"], ["ctx"], domain=PLUGIN_DOMAIN, plugin_version=GEMM_VERSION,
                            plugin_namespace="", weight=numpy_helper.from_array(w.reshape(-1), "w"), k=k, n=n, **bias)
    graph = helper.make_graph([node], "gemm_gelu", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(PLUGIN_DOMAIN, 1)])


def reference(qkv: np.ndarray, b: int, s: int, heads: int, d: int, scale: float, causal: int) -> np.ndarray:
    x = qkv.astype(np.float64).reshape(b, s, heads, 3, d)
    q, k, v = (x[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) * scale
    if causal:
        scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(b * s, heads * d)


class OneNode:
    """An engine of one attention node, built for exactly the case's shapes."""

    def __init__(self, trt, op: str, b: int, s: int, heads: int, d: int, scale: float, causal: int,
                 model: onnx.ModelProto | None = None, shapes: dict | None = None):
        self.trt, self.cudart = trt, _cudart()
        e = heads * d
        logger = trt.Logger(trt.Logger.ERROR)
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
        parser = trt.OnnxParser(network, logger)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "a.onnx"
            onnx.save(model if model is not None else attention_model(op, e, heads, scale, causal), path)
            if not parser.parse_from_file(str(path)):
                raise RuntimeError("; ".join(parser.get_error(i).desc() for i in range(parser.num_errors)))
        config = builder.create_builder_config()
        config.set_flag(trt.BuilderFlag.FP16)
        config.set_tactic_sources(0)  # the staged 8.6 has no cuBLAS/cuDNN of its own (gpu/README.md)
        profile = builder.create_optimization_profile()
        self.shapes = shapes or {"qkv": (b * s, 3 * e, 1, 1), "seq": (s,), "cu_seqlens": (b + 1,)}
        for i in range(network.num_inputs):
            name = network.get_input(i).name
            profile.set_shape(name, self.shapes[name], self.shapes[name], self.shapes[name])
        config.add_optimization_profile(profile)
        blob = builder.build_serialized_network(network, config)
        if blob is None:
            raise RuntimeError(f"{op}: build_serialized_network returned None")
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(bytes(blob))
        self.ctx = self.engine.create_execution_context()
        self.stream = _ok(self.cudart.cudaStreamCreate())
        self.buffers = {}
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        for name in self.names:
            if self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                self.ctx.set_input_shape(name, self.shapes[name])
        self.out_shape = tuple(self.ctx.get_tensor_shape("ctx"))

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        cudart = self.cudart
        for name, host in feeds.items():
            if name not in self.names:
                continue
            host = np.ascontiguousarray(host)
            buf = self.buffers[name] = DeviceBuffer(host.nbytes)
            _ok(cudart.cudaMemcpy(buf.ptr, host.ctypes.data, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            self.ctx.set_tensor_address(name, buf.ptr)
        out = np.empty(self.out_shape, np.float16)
        buf = self.buffers["ctx"] = DeviceBuffer(out.nbytes)
        _ok(cudart.cudaMemset(buf.ptr, 0xFF, out.nbytes))  # poisoned: an unwritten element stays NaN
        self.ctx.set_tensor_address("ctx", buf.ptr)
        if not self.ctx.execute_async_v3(_handle(self.stream)):
            raise RuntimeError("execute_async_v3 failed")
        _ok(cudart.cudaStreamSynchronize(self.stream))
        _ok(cudart.cudaMemcpy(out.ctypes.data, buf.ptr, out.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return out

    def time_ms(self, iters: int = 50, rounds: int = 5) -> float:
        cudart = self.cudart
        start, stop = _ok(cudart.cudaEventCreate()), _ok(cudart.cudaEventCreate())
        for _ in range(5):
            self.ctx.execute_async_v3(_handle(self.stream))
        per = []
        for _ in range(rounds):
            _ok(cudart.cudaEventRecord(start, self.stream))
            for _ in range(iters):
                self.ctx.execute_async_v3(_handle(self.stream))
            _ok(cudart.cudaEventRecord(stop, self.stream))
            _ok(cudart.cudaEventSynchronize(stop))
            per.append(_ok(cudart.cudaEventElapsedTime(start, stop)) / iters)
        return statistics.median(per)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("library", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-attention", action="store_true", help="only the TrtforgeGemmGelu / TrtforgeGemm cases")
    args = ap.parse_args()
    import tensorrt as trt

    from trtforge.backends.tensorrt import load_plugin_libraries, load_trt

    mod = load_trt("tensorrt")
    load_plugin_libraries(mod, [str(args.library)])
    rows = []
    for b, s, heads, d, causal in ([] if args.skip_attention else CASES):
        row = {"batch": b, "seq": s, "heads": heads, "head": d, "causal": causal}
        scale = float(1 / np.sqrt(d))
        rng = np.random.default_rng(b * 1000 + s)
        qkv = rng.standard_normal((b * s, 3 * heads * d, 1, 1)).astype(np.float16)
        feeds = {"qkv": qkv, "seq": np.zeros(s, np.int32), "cu_seqlens": (np.arange(b + 1) * s).astype(np.int32)}
        flops = 4.0 * b * s * s * heads * d * (0.5 if causal else 1.0)
        try:
            eng = OneNode(trt, FLASH_PLUGIN, b, s, heads, d, scale, causal)
            got = eng.run(feeds).reshape(b * s, heads * d).astype(np.float64)
            want = reference(qkv, b, s, heads, d, scale, causal)
            row["nan"] = int(np.isnan(got).sum())
            row["rel_l2"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            row["ms"] = eng.time_ms()
            row["tflops"] = flops / row["ms"] / 1e9
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        if not causal and d == 64 and s <= 512:
            try:
                v2 = OneNode(trt, PLUGIN, b, s, heads, d, scale, causal)
                got = v2.run(feeds).reshape(b * s, heads * d).astype(np.float64)
                row["v2_rel_l2"] = float(np.linalg.norm(got - reference(qkv, b, s, heads, d, scale, 0)) /
                                         np.linalg.norm(reference(qkv, b, s, heads, d, scale, 0)))
                row["v2_ms"] = v2.time_ms()
                row["v2_tflops"] = flops / row["v2_ms"] / 1e9
            except Exception as exc:
                row["v2_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps({"tensorrt": trt.__version__, "cases": rows}, indent=1))
    gemms = []
    for kind, t, k, n, has_bias in GEMM_CASES:
        row = {"plugin": kind, "tokens": t, "k": k, "n": n, "bias": has_bias}
        rng = np.random.default_rng(t)
        x = (rng.standard_normal((t, k)) * 0.5).astype(np.float16)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
        bias = rng.standard_normal(n).astype(np.float16)
        try:
            model = gemm_gelu_model(k, n, w, bias if has_bias else None, gelu=kind == "gelu")
            eng = OneNode(trt, "gemm", 1, 1, 1, 8, 1.0, 0, model=model, shapes={"x": (t, k)})
            got = eng.run({"x": x}).astype(np.float64)
            z = x.astype(np.float64) @ w.astype(np.float64) + (bias.astype(np.float64) if has_bias else 0.0)
            want = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))) if kind == "gelu" else z
            row["nan"] = int(np.isnan(got).sum())
            row["rel_l2"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            row["ms"] = eng.time_ms()
            row["tflops"] = 2.0 * t * k * n / row["ms"] / 1e9
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        gemms.append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps({"tensorrt": trt.__version__, "cases": rows, "gemm_gelu": gemms}, indent=1))
    f = lambda r, k, spec: format(r[k], spec) if k in r else "-"  # noqa: E731
    print("| plugin | tokens x K x N | bias | rel-L2 vs fp64 | ms | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for r in gemms:
        print(f"| {r['plugin']} | {r['tokens']}x{r['k']}x{r['n']} | {r['bias']} | {f(r, 'rel_l2', '.2e')} | {f(r, 'ms', '.4f')} | {f(r, 'tflops', '.0f')} |"
              + (f" {r['error']}" if "error" in r else ""))
    print("| BxS | heads x head | causal | rel-L2 vs fp64 | ms | TFLOP/s | v2 ms | v2 TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']}x{r['seq']} | {r['heads']}x{r['head']} | {r['causal']} | {f(r, 'rel_l2', '.2e')} | {f(r, 'ms', '.4f')} "
              f"| {f(r, 'tflops', '.0f')} | {f(r, 'v2_ms', '.4f')} | {f(r, 'v2_tflops', '.0f')} |" + (f" {r['error']}" if "error" in r else ""))


if __name__ == "__main__":
    main()
