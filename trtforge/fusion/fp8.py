"""FP8 GEMMs (`build --gemm-precision fp8`): the GEMM passes' plugin nodes (TrtforgeGemm, TrtforgeGemmGelu) become
TrtforgeGemmFp8, which runs the same product on e4m3 operands (trtforge/native/gemm_plugin.cpp).

Why: at 64x512 the GEMMs are most of BERT-base's fp16 engine time even at cuBLASLt's best kernels, and Hopper's FP8
tensor cores do twice fp16's FLOPs (docs/performance.md#fp8-defaults). TensorRT 8.6 has no FP8
type, so the GEMMs go through trtforge's cuBLASLt plugin, which converts x itself.

Scales are per tensor, the standard FP8 recipe (ModelOpt's FP8 default, TransformerEngine's delayed scaling):
- weights: w_scale = max|W| / 448, so the largest weight lands on e4m3's largest finite value;
- activations: x_scale = HEADROOM * max|x| / 448, with max|x| observed by ONNX Runtime on the build's sample feeds (the
  calibration data where the model has some, else random feeds: precision.sample_feeds). Values beyond it saturate;
  the headroom costs no precision in e4m3's normal range (a float format: the same 3 mantissa bits at every scale).

Chaining (`build --fp8-chain-ffn auto`, the default with fp8): where a TrtforgeGemmGelu's output is read by one GEMM
alone (FC1 -> FC2), FC1 writes e4m3 bytes and FC2 reads them, so FC2's input (BERT-base: 32768 x 3072 fp16 at 64x512) is
neither written in fp16 nor converted. TensorRT 8.6 has no FP8 tensor type: the bytes travel in an fp16 tensor of half
the width, which only the pair touches. It costs no accuracy (FC2 rounded FC1's output to e4m3 at the same scale
anyway) and made BERT-base's 64x512 engine faster (docs/performance.md#fp8-defaults).

Accuracy is not assumed: where the engine can execute, the build runs held-out feeds through it against ONNX Runtime
fp32 and fails (exit 1) under build.fp8_min_cosine (calibrate.engine_check.after_fp8_build). quantize_e4m3 and
fp8_gemm emulate the plugin's arithmetic on the CPU (ml_dtypes' e4m3, onnx's own dependency) so the tests can check the
rewrite's numbers. Timings and engine accuracy: docs/performance.md#fp8-defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.fusion.gelu import GEMM_PLUGIN as GEMM_GELU_PLUGIN
from trtforge.fusion.gelu import gelu_tanh
from trtforge.fusion.gemm import PLUGIN as GEMM_PLUGIN
from trtforge.fusion.index import PassReport
from trtforge.fusion.plugins import PLUGIN_DOMAIN

PLUGIN = "TrtforgeGemmFp8"
PLUGIN_VERSION = "1"
SOURCE_PLUGINS = (GEMM_PLUGIN, GEMM_GELU_PLUGIN)
E4M3_MAX = 448.0
HEADROOM = 2.0
GEMM_PRECISIONS = ("fp16", "fp8")
CHAIN_MODES = ("auto", "on", "off")  # build.fp8_chain_ffn
MIN_COMPUTE_CAPABILITY = 89  # FP8 tensor cores: Ada (8.9) and Hopper (9.0) on


def weight_scale(w: np.ndarray) -> float:
    """max|W| / 448 (a zero weight gets 1: any scale represents it)."""
    peak = float(np.abs(w.astype(np.float32)).max()) if w.size else 0.0
    return peak / E4M3_MAX if peak > 0 else 1.0


def activation_scale(amax: float, headroom: float = HEADROOM) -> float:
    """headroom * max|x| / 448: the observed peak lands at 448 / headroom."""
    return headroom * amax / E4M3_MAX


def quantize_e4m3(x: np.ndarray, scale: float) -> np.ndarray:
    """The e4m3 values the plugin computes for x / scale (fp32 multiply by 1/scale, round to nearest even, saturate
    at +-448), as float32."""
    scaled = x.astype(np.float32) * np.float32(1.0 / scale)
    return np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def fp8_gemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, gelu: bool, x_scale: float, w_scale: float) -> np.ndarray:
    """What TrtforgeGemmFp8 computes, in fp32 then fp16: [gelu](e4m3(x/x_scale) @ e4m3(W/w_scale) * x_scale * w_scale + b)."""
    y = quantize_e4m3(x, x_scale) @ quantize_e4m3(w, w_scale) * np.float32(x_scale * w_scale)
    if bias is not None:
        y = y + bias.astype(np.float32)
    return (gelu_tanh(y) if gelu else y).astype(np.float16)


@dataclass
class PluginGemm:
    """A TrtforgeGemm / TrtforgeGemmGelu node's contract, read back from its fields."""

    node: onnx.NodeProto
    x: str
    weight: np.ndarray  # fp16 [K, N]
    bias: np.ndarray | None
    gelu: bool


def plugin_gemms(model: onnx.ModelProto) -> list[PluginGemm]:
    """The GEMM plugin nodes the GELU and GEMM passes wrote."""
    found = []
    for node in model.graph.node:
        if node.domain != PLUGIN_DOMAIN or node.op_type not in SOURCE_PLUGINS:
            continue
        attrs = {a.name: a for a in node.attribute}
        k, n = attrs["k"].i, attrs["n"].i
        weight = numpy_helper.to_array(attrs["weight"].t).reshape(k, n)
        bias = numpy_helper.to_array(attrs["bias"].t) if "bias" in attrs else None
        found.append(PluginGemm(node, node.input[0], weight, bias, node.op_type == GEMM_GELU_PLUGIN))
    return found


def refusal(g: PluginGemm, amax: float | None) -> str | None:
    """Why this GEMM stays fp16, or None."""
    k, n = g.weight.shape
    if k % 16 or n % 16:
        return f"K {k} and N {n} must be multiples of 16 for cuBLASLt's FP8 kernels"
    if amax is None:
        return f"its input '{g.x}' is not a tensor of the observed graph (made by another plugin), so it has no scale"
    if not np.isfinite(amax) or amax <= 0:
        return f"its input '{g.x}' was observed at max |x| = {amax:g}; FP8 needs a finite, non-zero peak"
    return None


def observe_peaks(observe_model: onnx.ModelProto, feeds_list: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, float]:
    """max |value| of each named tensor of observe_model (those it has) over the feeds, from ONNX Runtime."""
    from trtforge.backends.onnxruntime import OrtRunner
    from trtforge.graph.index import expose_tensors

    present = {o for node in observe_model.graph.node for o in node.output} | {i.name for i in observe_model.graph.input}
    wanted = [n for n in dict.fromkeys(names) if n in present]
    if not wanted:
        return {}
    runner = OrtRunner(expose_tensors(observe_model, wanted, typed=False).SerializeToString())
    peaks: dict[str, float] = {}
    for feeds in feeds_list:
        inputs = {k: v for k, v in feeds.items() if k in runner.input_names}
        for name, value in runner.run(inputs, wanted).items():
            value = np.abs(np.asarray(value, dtype=np.float32))
            peaks[name] = max(peaks.get(name, 0.0), float(value.max()) if value.size else 0.0)
    return peaks


def fp8_chains(model: onnx.ModelProto, converted: set[str]) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(FC1, FC2) pairs of converted nodes (by name) where FC1 applies the GELU and its output is read by FC2 alone and
    is no graph output: FC1 can hand FC2 e4m3 bytes."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    pairs = []
    for g in plugin_gemms(model):
        y = g.node.output[0]
        after = readers.get(y, [])
        if (
            g.gelu
            and g.node.name in converted
            and y not in outputs
            and len(after) == 1
            and after[0].op_type == GEMM_PLUGIN
            and after[0].name in converted
            and after[0].input[0] == y
        ):
            pairs.append((g.node, after[0]))
    return pairs


def to_fp8(
    model: onnx.ModelProto, peaks: dict[str, float], headroom: float = HEADROOM, chain: bool = False
) -> tuple[onnx.ModelProto, PassReport]:
    """model with every GEMM plugin node whose input has an observed peak (peaks: tensor -> max|x|) as TrtforgeGemmFp8;
    the report names each node, its scales, and why any other stays fp16. chain: FC1 -> FC2 pairs (fp8_chains) pass
    e4m3 bytes (FC1's out_scale is FC2's x_scale; FC2's in_fp8 is 1)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = PassReport([], [])
    swapped: dict[str, onnx.NodeProto] = {}
    for g in plugin_gemms(out):
        amax = peaks.get(g.x)
        why = refusal(g, amax)
        if why:
            report.refused.append({"node": g.node.name, "reason": why})
            continue
        x_scale, w_scale = activation_scale(amax, headroom), weight_scale(g.weight)
        attrs = {
            "weight": numpy_helper.from_array(np.ascontiguousarray(g.weight, np.float16).reshape(-1), f"{g.node.name}/weight"),
            "k": int(g.weight.shape[0]),
            "n": int(g.weight.shape[1]),
            "gelu": int(g.gelu),
            "x_scale": float(x_scale),
            "w_scale": float(w_scale),
        }
        if g.bias is not None:
            attrs["bias"] = numpy_helper.from_array(g.bias.astype(np.float16), f"{g.node.name}/bias")
        swapped[g.node.name] = helper.make_node(
            PLUGIN,
            list(g.node.input),
            list(g.node.output),
            name=g.node.name,
            domain=PLUGIN_DOMAIN,
            plugin_version=PLUGIN_VERSION,
            plugin_namespace="",
            **attrs,
        )
        report.replaced.append(
            {
                "node": g.node.name,
                "from": g.node.op_type,
                "plugin": f"{PLUGIN} v{PLUGIN_VERSION}",
                "k": int(g.weight.shape[0]),
                "n": int(g.weight.shape[1]),
                "gelu": g.gelu,
                "x": g.x,
                "x_amax": float(amax),
                "x_scale": float(x_scale),
                "w_scale": float(w_scale),
            }
        )
    if chain:
        by_node = {r["node"]: r for r in report.replaced}
        for fc1, fc2 in fp8_chains(out, set(swapped)):
            out_scale = by_node[fc2.name]["x_scale"]
            swapped[fc1.name].attribute.append(helper.make_attribute("out_scale", float(out_scale)))
            swapped[fc2.name].attribute.append(helper.make_attribute("in_fp8", 1))
            by_node[fc1.name]["out_scale"], by_node[fc2.name]["in_fp8"] = out_scale, True
            # the tensor between them holds e4m3 bytes in halves, [..., N / 2]: its recorded fp16 shape would be wrong
            kept = [v for v in out.graph.value_info if v.name != fc1.output[0]]
            del out.graph.value_info[:]
            out.graph.value_info.extend(kept)
    nodes = [swapped.get(n.name, n) for n in out.graph.node]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, report


def fp8_skip(precision: str, flavour: str, version: str, compute_capability: str | None, registered: bool) -> str | None:
    """Why --gemm-precision fp8 cannot apply to this build, or None."""
    from trtforge.fusion.plugins import backend_route
    from trtforge.fusion.step import sm_of

    if precision != "fp16":
        return f"it applies to fp16 builds (the float GEMMs), not precision {precision}; build with --precision fp16"
    if backend_route(flavour, version).kind != "plugin":
        return f"{PLUGIN} is written for TensorRT 8.x; {flavour} {version} gets no GEMM plugins"
    sm = sm_of(compute_capability)
    if sm is None or sm < MIN_COMPUTE_CAPABILITY:
        return f"this GPU (compute capability {compute_capability or 'unknown'}) has no FP8 tensor cores; they start at 8.9 (Ada, Hopper)"
    if not registered:
        return (
            f"{PLUGIN} v{PLUGIN_VERSION} is not in this TensorRT's plugin registry; load libtrtforge_plugins "
            "(trtforge plugins build, or --plugin-library PATH)"
        )
    return None


def describe_fp8(record: dict[str, Any]) -> list[str]:
    replaced = (record or {}).get("replaced")
    if not replaced:
        return []
    chained = sum(bool(r.get("in_fp8")) for r in replaced)
    chaining = record.get("chain_ffn")
    lines = [
        f"FP8 GEMMs: {len(replaced)} GEMM plugin node(s) as {PLUGIN} (e4m3, per-tensor scales; activation peaks from "
        f"{record.get('magnitudes_from')}, headroom {record.get('headroom'):g}x)"
        + (f"; {chained} FC1 -> FC2 pair(s) pass e4m3 bytes" if chained else "")
    ]
    if not chained and chaining not in ("off", False, None):
        lines.append("  FC1 -> FC2 chaining: no pair (none of the GELU GEMMs' outputs is read by one FP8 GEMM alone)")
    reasons: dict[str, int] = {}
    for r in record.get("refused") or []:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    return lines + [f"  kept fp16 ({count}): {reason}" for reason, count in reasons.items()]
