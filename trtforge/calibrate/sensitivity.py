"""Per-layer INT8 error in one ORT run, to rank layers for the accuracy fallback.

The leave-one-out search built a full Q/DQ model copy and an ORT session per GEMM (75 of 116 s on
MiniLM; ~145 copies for BERT-large). Here one model holds the fp32 graph unchanged plus, for every
quantized GEMM, a shadow copy that reads the same fp32 inputs through their Q/DQ and writes an extra
output. One run gives each layer's local error (relative L2 of shadow vs fp32 output), i.e. what
quantizing that layer alone costs with exact inputs. Only the top few get an end-to-end check.
"""

from __future__ import annotations

import numpy as np
import onnx

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.calibrate.placement import QuantPlan
from trtforge.calibrate.quantize import insert_qdq
from trtforge.graph.index import helper_value_info


def shadow_model(model: onnx.ModelProto, plan: QuantPlan, amax: dict[str, float]) -> tuple[onnx.ModelProto, dict[str, tuple[str, str]]]:
    """`model` plus a quantized shadow of every target GEMM; node -> (fp32 output, shadow output)."""
    qdq = insert_qdq(model, plan, amax)
    targets = {t.node for t in plan.targets}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    existing = {n.name for n in out.graph.node}
    names = {i.name for i in out.graph.initializer}
    pairs: dict[str, tuple[str, str]] = {}
    for node in qdq.graph.node:
        if node.name in existing and node.name not in targets:
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{node.name}__shadow" if node.name in targets else node.name
        if node.name in targets:
            original = node.output[0]
            copy.output[0] = f"{original}__shadow"
            del copy.output[1:]
            pairs[node.name] = (original, copy.output[0])
        out.graph.node.append(copy)
    out.graph.initializer.extend(i for i in qdq.graph.initializer if i.name not in names)
    for original, shadow in pairs.values():
        out.graph.output.extend([helper_value_info(original, onnx.TensorProto.FLOAT), helper_value_info(shadow, onnx.TensorProto.FLOAT)])
    from trtforge.graph.index import toposorted

    return toposorted(out), pairs


def layer_errors(model: onnx.ModelProto, plan: QuantPlan, amax: dict[str, float], batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Node -> relative L2 error of its output when only it is quantized, over `batches`."""
    shadow, pairs = shadow_model(model, plan, amax)
    runner = OrtRunner(shadow.SerializeToString())
    wanted = [t for pair in pairs.values() for t in pair]
    num = dict.fromkeys(pairs, 0.0)
    den = dict.fromkeys(pairs, 0.0)
    for batch in batches:
        values = runner.run(batch, wanted)
        for node, (ref, shade) in pairs.items():
            r, q = values[ref].astype(np.float64), values[shade].astype(np.float64)
            num[node] += float(np.sum((r - q) ** 2))
            den[node] += float(np.sum(r**2))
    return {node: float(np.sqrt(num[node] / den[node])) if den[node] > 0 else 0.0 for node in pairs}
