"""fp16 conversion for strongly typed builds (TensorRT >= 10, TensorRT-RTX) and for INT8 builds' float parts.

Which nodes stay fp32 follows ModelOpt AutoCast: run the fp32 model on sample inputs and keep every node
whose observed output magnitude exceeds `data_max` (512, AutoCast's default: headroom for what the samples
did not show) or that reads an initializer above `init_max` (65504, fp16's max) in fp32, plus a block list
of ops that overflow or lose precision in fp16 (normalisations and reductions). The samples are the
calibration data when there is any (BERT's outlier dimensions only show on real text), else random feeds,
and the report says which. Tensor types come from that same ORT run, not from ONNX shape inference, and a
float tensor the run cannot observe is a UserError: a guard that silently observes nothing lets fp16
overflow into inf/NaN engines, which is worse than stopping.

The conversion itself is written here (a small pass on onnx) instead of taken from onnxruntime's
float16 converter, whose output depends on the installed onnxruntime: 1.30's produced a graph that
TensorRT 8.6 rejected ("Failed to sort the model topologically"), 1.23's parsed. The pass: every float
tensor has an fp32 and/or fp16 version; each node reads the version its precision wants (initializers are
converted, other tensors get one shared Cast); converted nodes write fp16; graph inputs and outputs stay
fp32; the result is topologically sorted by construction (each Cast is emitted before its first reader).

Q/DQ models (`best`): DequantizeLinear must feed its Conv/MatMul directly, since a Cast between them
blocks TensorRT's Q/DQ fusion. From opset 19 Q/DQ take fp16 scales, so DQ writes fp16 straight into an
fp16 GEMM. Before opset 19 (TensorRT 8.6 parses up to 17) DQ outputs fp32 by definition, so the Q/DQ and
the GEMMs they feed stay fp32 in the ONNX (Casts sit before Q and after the GEMM); TensorRT 8.6 is weakly
typed and picks the fused int8 kernel's output precision from its flags. A convolution's epilogue (ReLU,
residual Add, ...) stays fp32 with it, so that no Cast splits the Conv -> ReLU -> Q chain TensorRT fuses
into one int8 kernel. A scale outside fp16's normal range keeps its Q/DQ fp32 the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.errors import UserError
from trtforge.graph.index import expose_tensors, name_all_nodes, toposorted

FP32_OP_BLOCK_LIST = (
    "LayerNormalization",
    "Pow",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Softplus",
)
# Ops whose output type is set by an attribute, or that hold subgraphs: left fp32 rather than rewritten.
_OPAQUE_OPS = ("EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "If", "Loop", "Scan")
# Inputs that stay fp32 even on an fp16 node (their own type parameter in the ONNX schema).
_FP32_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
GEMM_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
CONV_OPS = ("Conv", "ConvTranspose")
# Elementwise ops TensorRT fuses after an int8 convolution (activation, residual Add, BatchNorm, scaling).
CONV_EPILOGUE_OPS = (
    "Relu",
    "LeakyRelu",
    "Clip",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Tanh",
    "Add",
    "Sub",
    "Mul",
    "BatchNormalization",
    "PRelu",
    "Max",
    "Min",
)
DATA_MAX = 512.0
RANDOM_ROWS = 2  # rows per random sample feed (no calibration data)
INIT_MAX = 65504.0
FP16_MIN_NORMAL = 6.104e-05
FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


@dataclass
class Fp16Report:
    kept_fp32: dict[str, str] = field(default_factory=dict)  # node name -> reason
    converted_nodes: int = 0
    total_nodes: int = 0
    magnitudes_from: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "fp16_nodes": self.converted_nodes,
            "fp32_nodes": len(self.kept_fp32),
            "kept_fp32": self.kept_fp32,
            "magnitudes_from": self.magnitudes_from,
        }


def observe(model: onnx.ModelProto, feeds_list: list[dict[str, np.ndarray]]) -> tuple[dict[str, float], dict[str, np.dtype]]:
    """(max |value| of every float node output, dtype of every node output) over the sample feeds, from ORT.

    Outputs are exposed without declared types so ORT types them itself: no ONNX shape inference involved."""
    names = list(dict.fromkeys(o for node in model.graph.node for o in node.output if o))
    runner = OrtRunner(expose_tensors(model, names, typed=False).SerializeToString())
    peaks: dict[str, float] = {}
    types: dict[str, np.dtype] = {}
    for feeds in feeds_list:
        for name, value in runner.run(feeds, names).items():
            types[name] = value.dtype
            if np.issubdtype(value.dtype, np.floating):
                peaks[name] = max(peaks.get(name, 0.0), finite_peak(value))
    return peaks, types


def finite_peak(value: np.ndarray) -> float:
    """max |x| over the finite values (0 for none). Two reductions and no copy where every value is finite, the usual
    case; the masked copy only where one is not."""
    if not value.size:
        return 0.0
    peak = max(float(value.max()), -float(value.min()))
    if np.isfinite(peak):
        return peak
    finite = value[np.isfinite(value)]
    return float(np.abs(finite).max()) if finite.size else 0.0


def nodes_to_keep_fp32(
    model: onnx.ModelProto,
    peaks: dict[str, float],
    data_max: float = DATA_MAX,
    init_max: float = INIT_MAX,
    op_block_list: tuple[str, ...] = FP32_OP_BLOCK_LIST,
) -> dict[str, str]:
    """Pure decision: node name -> why it stays fp32."""
    inits = {i.name: i for i in model.graph.initializer}
    big_inits = _large_initializers(inits.values(), init_max)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    keep: dict[str, str] = {}
    for node in model.graph.node:
        why = _own_fp32_reason(node, peaks, inits, big_inits, opset, data_max, init_max, op_block_list)
        if why is not None:
            keep[node.name] = why
    for name in integer_math_nodes(model):
        keep.setdefault(
            name,
            "computes an integer (its result only reaches a cast to an integer type, e.g. a relative-"
            "position bucket): fp16 rounding would change the integer",
        )
    # A GEMM reading a DequantizeLinear that stays fp32 stays fp32 too: a Cast between them blocks the fusion.
    kept_dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.name in keep}
    for node in model.graph.node:
        if node.name not in keep and node.op_type in GEMM_OPS and any(i in kept_dq for i in node.input):
            keep[node.name] = "reads an fp32 DequantizeLinear (no Cast between DQ and its GEMM)"
    _keep_conv_epilogues(model, keep, set(inits), kept_dq)
    return keep


def _large_initializers(inits: Iterable[onnx.TensorProto], init_max: float) -> set[str]:
    """The float initializers holding a value beyond init_max, which fp16 cannot hold: their readers stay fp32."""
    big_inits = set()
    for init in inits:
        if init.data_type == FLOAT:
            array = numpy_helper.to_array(init)
            if array.size and float(np.abs(array).max()) > init_max:
                big_inits.add(init.name)
    return big_inits


def _own_fp32_reason(
    node: onnx.NodeProto,
    peaks: dict[str, float],
    inits: dict[str, onnx.TensorProto],
    big_inits: set[str],
    opset: int,
    data_max: float,
    init_max: float,
    op_block_list: tuple[str, ...],
) -> str | None:
    """Why a node stays fp32 for what it is or reads itself (None: nothing of its own keeps it), before its neighbours
    are considered; the first reason that applies is the one reported."""
    if node.op_type in op_block_list:
        return f"op {node.op_type} is on the fp32 block list"
    if node.domain not in ("", "ai.onnx") or node.op_type in _OPAQUE_OPS:
        return f"op {node.op_type} sets its own types or holds subgraphs"
    if node.op_type in QDQ_OPS and opset < 19:
        return f"opset {opset} < 19: {node.op_type} takes fp32 scales only"
    if node.op_type in QDQ_OPS and _scale_outside_fp16(inits.get(node.input[1])):
        return f"scale '{node.input[1]}' is outside fp16's normal range"
    if any(peaks.get(o, 0.0) > data_max for o in node.output):
        o = next(o for o in node.output if peaks.get(o, 0.0) > data_max)
        return f"output '{o}' reached {peaks[o]:.4g} > {data_max:g}"
    if any(i in big_inits for i in node.input):
        return f"initializer '{next(i for i in node.input if i in big_inits)}' exceeds {init_max:g}"
    return None


def _keep_conv_epilogues(model: onnx.ModelProto, keep: dict[str, str], init_names: set[str], kept_dq: set[str]) -> None:
    """An fp32 INT8 convolution's epilogue (ReLU, residual Add, ...) stays fp32 with it: TensorRT fuses
    Conv -> ReLU -> Q and Conv -> Add(DQ residual) -> ReLU -> Q into one int8 kernel only with no Cast in
    between (with Casts, every ReLU and residual Add stays a layer of its own: docs/performance.md#int8-qdq-placement)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    constants = init_names | {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    kept_conv = {n.name for n in model.graph.node if n.op_type in CONV_OPS and n.name in keep and any(i in kept_dq for i in n.input)}
    epilogue: set[str] = set()
    for node in model.graph.node:  # topological order: a chain grows from its convolution forward
        if node.op_type not in CONV_EPILOGUE_OPS:
            continue
        sources = [producer.get(i) for i in node.input if i and i not in constants]
        from_conv = [n for n in sources if n is not None and (n.name in kept_conv or n.name in epilogue)]
        others_fp32 = all(n is not None and n.name in keep for n in sources)  # kept DQs, convs, epilogues included
        if from_conv and others_fp32:
            epilogue.add(node.name)  # a node kept fp32 for another reason keeps that reason and the chain goes on
            keep.setdefault(node.name, "epilogue of an fp32 INT8 convolution (a Cast there blocks TensorRT's conv fusion)")


INTEGER_TYPES = {
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL,
}


def integer_math_nodes(model: onnx.ModelProto) -> set[str]:
    """Nodes whose every output reaches only casts to an integer type (through other such nodes), and those casts:
    float arithmetic that computes an index, e.g. MPNet's and T5's relative-position buckets (log of a distance, scaled, cast to int).
    In fp16, a value near a bucket edge rounds across it and the model reads another bias row."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}

    def casts_to_integer(node: onnx.NodeProto) -> bool:
        return node.op_type == "Cast" and any(a.name == "to" and a.i in INTEGER_TYPES for a in node.attribute)

    found: set[str] = set()
    changed = True
    while changed:  # reverse topological order gets it in one pass; the loop makes any order work
        changed = False
        for node in reversed(model.graph.node):
            if node.name in found or casts_to_integer(node) or not node.output:
                continue
            if all(
                o not in graph_outputs and consumers.get(o) and all(casts_to_integer(c) or c.name in found for c in consumers[o])
                for o in node.output
            ):
                found.add(node.name)
                changed = True
    producers = {o: n.name for n in model.graph.node for o in n.output}
    # the casts that end such arithmetic read its fp32 result, not an fp16 copy of it
    found |= {n.name for n in model.graph.node if casts_to_integer(n) and producers.get(n.input[0]) in found}
    return found


def _scale_outside_fp16(init: onnx.TensorProto | None) -> bool:
    if init is None:
        return True
    scale = np.abs(numpy_helper.to_array(init).astype(np.float64))
    return bool(scale.size and (scale.min() < FP16_MIN_NORMAL or scale.max() > INIT_MAX))


def convert_fp16(
    model: onnx.ModelProto,
    feeds_list: list[dict[str, np.ndarray]],
    data_max: float = DATA_MAX,
    init_max: float = INIT_MAX,
    magnitudes_from: str = "random feeds",
) -> tuple[onnx.ModelProto, Fp16Report]:
    """fp16 copy of `model` with fp32 I/O; nodes that must stay fp32 (and why) in the report."""
    work = toposorted(model)
    name_all_nodes(work)
    peaks, types = observe(work, feeds_list)
    keep = nodes_to_keep_fp32(work, peaks, data_max, init_max)
    for node in work.graph.node:
        missing = [o for o in node.output if o and o not in types]
        if missing:
            raise UserError(
                f"cannot observe tensor '{missing[0]}' of node '{node.name}' ({node.op_type}) on the sample inputs, "
                "so the fp16 overflow guard cannot check it; build with --precision fp32 or fix the model."
            )
    converted = _rewrite(work, keep, types)
    return converted, Fp16Report(keep, len(work.graph.node) - len(keep), len(work.graph.node), magnitudes_from)


def _rewrite(model: onnx.ModelProto, keep: dict[str, str], types: dict[str, np.dtype]) -> onnx.ModelProto:
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    float_tensors = {n for n, t in types.items() if t == np.float32}
    float_tensors |= {i.name for i in graph.input if i.type.tensor_type.elem_type == FLOAT}
    float_tensors |= {n for n, i in inits.items() if i.data_type == FLOAT}
    versions: dict[str, dict[int, str]] = {t: {FLOAT: t} for t in float_tensors}
    graph_outputs = {o.name for o in graph.output}
    new_inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def version(tensor: str, dtype: int) -> str:
        have = versions[tensor]
        if dtype not in have:
            name = f"{tensor}__fp16" if dtype == FLOAT16 else f"{tensor}__fp32"
            if tensor in inits:
                array = numpy_helper.to_array(inits[tensor])
                new_inits.append(numpy_helper.from_array(np.clip(array, -INIT_MAX, INIT_MAX).astype(np.float16), name))
            else:
                source = next(iter(have.values()))
                nodes.append(helper.make_node("Cast", [source], [name], name=f"{name}_Cast", to=dtype))
            have[dtype] = name
        return have[dtype]

    for node in graph.node:
        fp16 = node.name not in keep
        exempt = _FP32_INPUTS.get(node.op_type, ()) if fp16 else ()
        for i, tensor in enumerate(node.input):
            if tensor in versions:
                node.input[i] = version(tensor, FLOAT if i in exempt or not fp16 else FLOAT16)
        if fp16:
            _retype_attributes(node)
        tails = []
        for j, out in enumerate(node.output):
            if out not in float_tensors or not fp16:
                continue
            if out in graph_outputs:  # graph outputs stay fp32: the node writes an fp16 twin, a Cast the output
                node.output[j] = f"{out}__fp16"
                versions[out] = {FLOAT16: node.output[j]}
                tails.append(helper.make_node("Cast", [node.output[j]], [out], name=f"{out}_Cast", to=FLOAT))
                versions[out][FLOAT] = out
            else:
                versions[out] = {FLOAT16: out}
        nodes.append(node)
        nodes.extend(tails)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    used = {t for n in nodes for t in n.input} | {i.name for i in graph.input}
    kept_inits = [i for i in graph.initializer if i.name in used] + new_inits
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_inits)
    del out.graph.value_info[:]  # types changed; TensorRT and ORT infer them
    return out


def _retype_attributes(node: onnx.NodeProto) -> None:
    """On an fp16 node, attributes that make fp32 values make fp16 ones."""
    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i == FLOAT:
            attr.i = FLOAT16
        elif node.op_type in ("Constant", "ConstantOfShape") and attr.name == "value" and attr.t.data_type == FLOAT:
            value = numpy_helper.to_array(attr.t)
            attr.t.CopyFrom(numpy_helper.from_array(np.clip(value, -INIT_MAX, INIT_MAX).astype(np.float16), attr.t.name))
        elif node.op_type == "Constant" and attr.name in ("value_float", "value_floats"):
            raise UserError(f"Constant node '{node.name}' uses {attr.name}; run trtforge clean first (it folds constants).")


def sample_feeds(
    onnx_path: Path, model: onnx.ModelProto, specs: list, axes: dict, data: Path | None = None, max_samples: int = 16
) -> tuple[list[dict[str, np.ndarray]], str]:
    """Feeds for the magnitude guard and where they come from: `data`, else the calibration data this model
    (or the model it was calibrated from) was calibrated on, else two random feeds at the opt shapes, of RANDOM_ROWS rows."""
    from trtforge.runtime.feeds import random_feeds

    folder = Path(data) if data else calibration_data_of(onnx_path, model)
    if folder is not None:
        from trtforge.calibrate import data as data_mod
        from trtforge.calibrate.data import max_sample_length, tokenizer_factory

        # The tokenizer through this ONNX's sidecar chain: its directory is relative to the export's ONNX.
        _, samples = data_mod.load_samples(folder, specs, tokenizer_factory(onnx_path), max_sample_length(specs, axes), max_samples)
        size = _batch_size(specs, axes, 4, samples[0] if samples else {})
        return list(data_mod.batches(samples, size)), f"calibration data {folder} ({len(samples)} samples)"
    # Random rows are exchangeable: two of them show the weights' magnitudes as sixteen would (the guard keeps fp32 from
    # DATA_MAX, far below fp16's range), at an eighth of the observation's cost on a large model.
    batch_axes = {s.shape[0] for s in specs if s.shape and isinstance(s.shape[0], str)}
    sizes = {name: min(rng.opt, RANDOM_ROWS) if name in batch_axes else rng.opt for name, rng in axes.items()}
    return [
        random_feeds(specs, sizes, seed) for seed in range(2)
    ], f"random feeds (no calibration data found; outliers of real data may not show; {RANDOM_ROWS} rows each)"


def _batch_size(specs: list, axes: dict, wanted: int, sample: dict[str, np.ndarray]) -> int:
    """How many samples (each as `sample` is: its rows already stacked on the leading axis) one batch may stack: wanted,
    or fewer where an input's leading axis cannot take them. A fixed leading size is already whole in each sample (one
    per batch); a named axis takes max // the sample's rows."""
    size = wanted
    for spec in specs:
        lead = spec.shape[0] if spec.shape else None
        if isinstance(lead, int):
            size = 1
        elif lead in axes:
            rows = np.shape(sample[spec.name])[0] if spec.name in sample and np.ndim(sample[spec.name]) else 1
            size = min(size, axes[lead].max // max(rows, 1))
    return max(size, 1)


def calibration_data_of(onnx_path: Path, model: onnx.ModelProto) -> Path | None:
    """The data folder recorded by a calibration cache made for this model (a Q/DQ model names its cache; a
    cleaned model has one beside it whose graph hash matches)."""
    from trtforge.calibrate.options import paths_for
    from trtforge.core.artifacts import onnx_graph_hash, read_sidecar

    sidecar = read_sidecar(onnx_path, required=False) or {}
    cache = Path(sidecar["cache"]) if sidecar.get("cache") else paths_for(onnx_path, None)[1]
    cache_side = read_sidecar(cache, required=False) if cache.exists() else None
    if not cache_side or not cache_side.get("data"):
        return None
    if not sidecar.get("cache") and cache_side.get("graph_hash") not in (sidecar.get("graph_hash"), onnx_graph_hash(model)):
        return None
    folder = Path(cache_side["data"])
    return folder if folder.exists() else None


def prepare_for_build(
    model: onnx.ModelProto,
    onnx_path: Path,
    specs: list,
    axes: dict,
    data: Path | None = None,
    sampled: tuple[list[dict[str, np.ndarray]], str] | None = None,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """What `trtforge build --precision fp16|best` does: sample feeds (data > calibration data > random; or `sampled`,
    sample_feeds' answer already in hand), then the conversion; the report (with where the magnitudes came from) goes
    into the engine sidecar."""
    feeds, source = sampled or sample_feeds(Path(onnx_path), model, specs, axes, data)
    converted, report = convert_fp16(model, feeds, magnitudes_from=source)
    return converted, report.to_json()
