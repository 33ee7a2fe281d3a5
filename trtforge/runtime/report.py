"""Latency statistics, the run report's schema and the target's precision (which picks its default gates).

The report is one JSON document, schema `trtforge.run/2` (docs): what ran, each output's kind, the two
error kinds (precision: engine vs ONNX Runtime fp32 on identical chunks; chunking: chunked-and-merged vs
one whole pass), each either measured (metrics per output, by kind) or not (with the reason), latency
percentiles per profile, throughput, memory and the gates (evaluated by verify/gates.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from trtforge.verify.gates import PRECISIONS

SCHEMA = "trtforge.run/2"


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"count": 0}
    values = np.asarray(samples_ms, dtype=np.float64)
    return {
        "count": int(values.size),
        "mean_ms": float(values.mean()),
        "p50_ms": float(np.percentile(values, 50)),
        "p90_ms": float(np.percentile(values, 90)),
        "p99_ms": float(np.percentile(values, 99)),
        "min_ms": float(values.min()),
        "max_ms": float(values.max()),
    }


def target_precision(
    engine_sidecar: dict[str, Any] | None, onnx_sidecar: dict[str, Any] | None, onnx_path: str | Path | None = None
) -> str:
    """The target's precision, which sets its default gates (verify/gates.py): an engine's build precision ('fp8'
    for an fp16 engine whose GEMMs are FP8, 'tf32' for fp32 with TF32 allowed); for an ONNX, 'int8' when
    calibrate wrote it, else what its sidecar or, failing that, its graph says (Q/DQ nodes: int8; float16
    tensors: fp16; otherwise fp32)."""
    if engine_sidecar is not None:
        if (engine_sidecar.get("gemm_precision") or {}).get("precision") == "fp8":
            return "fp8"
        precision = engine_sidecar.get("precision") or "fp32"
        return "tf32" if precision == "fp32" and engine_sidecar.get("tf32") else precision
    side = onnx_sidecar or {}
    if side.get("step") == "calibrate":
        return "int8"
    if side.get("precision") in PRECISIONS:  # build's NAME.fp16.onnx / NAME.best.onnx
        return side["precision"]
    return onnx_model_precision(onnx_path) if onnx_path is not None else "fp32"


def onnx_model_precision(path: str | Path) -> str:
    """'int8' for a graph with Q/DQ nodes, 'fp16' for one holding float16 tensors, else 'fp32' (weights not loaded)."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in graph.node):
        return "int8"
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    typed = [*graph.input, *graph.output, *graph.value_info]
    if (
        any(t.data_type in half for t in graph.initializer)
        or any(v.type.tensor_type.elem_type in half for v in typed)
        or any(n.op_type == "Cast" and any(a.name == "to" and a.i in half for a in n.attribute) for n in graph.node)
    ):
        return "fp16"
    return "fp32"
