"""fp16 conversion for strongly typed builds (TensorRT >= 10, TensorRT-RTX): precision lives in the ONNX.

The conversion itself is ONNX Runtime's float16 converter (onnxruntime.transformers.float16), which
keeps fp32 inputs/outputs and inserts the casts. What it does not do is decide which nodes must stay
fp32; that follows ModelOpt AutoCast: run the fp32 model on sample inputs and keep every node whose
observed output magnitude exceeds `data_max` (512, AutoCast's default: headroom for what sample inputs
did not show) or that reads an initializer above `init_max` (65504, fp16's max) in fp32, plus a block
list of ops that overflow or lose precision in fp16 (normalisations and reductions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.graph import expose_tensors, name_all_nodes

FP32_OP_BLOCK_LIST = ("LayerNormalization", "Pow", "ReduceMean", "ReduceSum", "ReduceSumSquare", "Sqrt",
                      "Reciprocal", "Exp", "Log", "Softplus",
                      # Q/DQ keep fp32 scales: TensorRT 8.6 takes only fp32 scales (precision 'best').
                      "QuantizeLinear", "DequantizeLinear")
DATA_MAX = 512.0
INIT_MAX = 65504.0


@dataclass
class Fp16Report:
    kept_fp32: dict[str, str] = field(default_factory=dict)  # node name -> reason
    converted_nodes: int = 0
    total_nodes: int = 0


def observe_magnitudes(model: onnx.ModelProto, feeds_list: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Max |value| of every float node output over the sample feeds, keyed by tensor name."""
    outputs = [o for node in model.graph.node for o in node.output if o]
    from trtforge.graph import float_tensor_types

    types = float_tensor_types(model)
    floats = [o for o in outputs if types.get(o) == onnx.TensorProto.FLOAT]
    runner = OrtRunner(expose_tensors(model, floats).SerializeToString())
    peaks: dict[str, float] = {}
    for feeds in feeds_list:
        values = runner.run(feeds, floats)
        for name, value in values.items():
            if value.size and np.issubdtype(value.dtype, np.floating):
                peaks[name] = max(peaks.get(name, 0.0), float(np.nanmax(np.abs(value))))
    return peaks


def nodes_to_keep_fp32(model: onnx.ModelProto, peaks: dict[str, float], data_max: float = DATA_MAX,
                       init_max: float = INIT_MAX, op_block_list: tuple[str, ...] = FP32_OP_BLOCK_LIST) -> dict[str, str]:
    """Pure decision: node name -> why it stays fp32."""
    big_inits = set()
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT:
            array = numpy_helper.to_array(init)
            if array.size and float(np.abs(array).max()) > init_max:
                big_inits.add(init.name)
    keep: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type in op_block_list:
            keep[node.name] = f"op {node.op_type} is on the fp32 block list"
            continue
        over = [(o, peaks[o]) for o in node.output if peaks.get(o, 0.0) > data_max]
        if over:
            keep[node.name] = f"output '{over[0][0]}' reached {over[0][1]:.4g} > {data_max:g}"
            continue
        inits = [i for i in node.input if i in big_inits]
        if inits:
            keep[node.name] = f"initializer '{inits[0]}' exceeds {init_max:g}"
    return keep


def convert_fp16(model: onnx.ModelProto, feeds_list: list[dict[str, np.ndarray]], data_max: float = DATA_MAX,
                 init_max: float = INIT_MAX) -> tuple[onnx.ModelProto, Fp16Report]:
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    work = onnx.ModelProto()
    work.CopyFrom(model)
    name_all_nodes(work)
    peaks = observe_magnitudes(work, feeds_list)
    keep = nodes_to_keep_fp32(work, peaks, data_max, init_max)
    converted = convert_float_to_float16(
        work, keep_io_types=True, disable_shape_infer=False,
        op_block_list=list(DEFAULT_OP_BLOCK_LIST) + list(FP32_OP_BLOCK_LIST), node_block_list=list(keep),
    )
    report = Fp16Report(keep, len(work.graph.node) - len(keep), len(work.graph.node))
    return converted, report
