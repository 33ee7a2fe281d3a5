"""`trtforge clean`: graph cleanup passes on onnx-graphsurgeon, proven unchanged with ONNX Runtime.

Each pass is a small function on a gs.Graph; `clean_model` runs them in order and `verify_same`
checks the cleaned model against the original on random inputs at two shapes.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from trtforge import __version__
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.artifacts import onnx_graph_hash, read_sidecar, refuse_overwrite, write_sidecar
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import GateFailed, UserError
from trtforge.core.onnxio import PROTOBUF_LIMIT, load_onnx, save_onnx
from trtforge.export.axislimits import axis_limit_error, largest_working
from trtforge.graph.slim import needs_rewrite, resolve_parser, slim_model
from trtforge.runtime.feeds import random_feeds, specs_from_onnx, two_shapes
from trtforge.verify.compare import Comparator
from trtforge.verify.gates import check_outputs

PASSTHROUGH_OPS = ("Identity", "Dropout")


@dataclass
class GraphStats:
    ops: Counter
    initializer_bytes: int
    nodes: int


@dataclass
class CleanResult:
    path: Path
    before: GraphStats
    after: GraphStats
    rel_l2: dict[str, float] = field(default_factory=dict)
    sidecar: dict[str, Any] = field(default_factory=dict)


def graph_stats(model: onnx.ModelProto) -> GraphStats:
    ops = Counter(node.op_type for node in model.graph.node)
    init_bytes = sum(_tensor_bytes(t) for t in model.graph.initializer)
    return GraphStats(ops, init_bytes, len(model.graph.node))


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _gs():
    import onnx_graphsurgeon as gs
    from onnx_graphsurgeon.logger import G_LOGGER

    G_LOGGER.severity = G_LOGGER.ERROR
    return gs


def remove_passthrough(graph: Any, ops: tuple[str, ...] = PASSTHROUGH_OPS) -> int:
    """Bypass Identity and (inference-mode) Dropout nodes; returns how many were removed."""
    removed = 0
    graph_outputs = set(id(t) for t in graph.outputs)
    for node in list(graph.nodes):
        if node.op not in ops or not node.inputs:
            continue
        if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1].outputs:
            continue  # the mask is consumed: keep the node
        src, dst = node.inputs[0], node.outputs[0]
        if id(dst) in graph_outputs:
            # Keep the graph output's name: make the producer of `src` write `dst` directly.
            if not src.inputs or src in graph.inputs or len(src.outputs) > 1:
                continue
            producer = src.inputs[0]
            producer.outputs[producer.outputs.index(src)] = dst
        else:
            for consumer in list(dst.outputs):
                for i, tensor in enumerate(consumer.inputs):
                    if tensor is dst:
                        consumer.inputs[i] = src
        node.outputs.clear()
        node.inputs.clear()
        removed += 1
    return removed


def split_shape_slices(model: onnx.ModelProto) -> list[str]:
    """Rewrite every `Shape(start=, end=)` (opset 15+, which the dynamo exporter emits for `x.shape[i]`)
    as a plain `Shape` followed by `Slice(starts, ends, axes=[0])`: TensorRT 8.6's ONNX parser ignores
    the attributes and then fails on the Slice downstream ("ends.size() == axes.size()"). Same result
    by definition of the attributes (both clamp negative and out-of-range bounds the same way).
    Returns the names of the rewritten nodes, in graph order."""
    from onnx import helper, numpy_helper

    rewritten: list[str] = []
    nodes: list[onnx.NodeProto] = []
    taken = {n.name for n in model.graph.node} | {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Shape" or node.domain not in ("", "ai.onnx") or not ({"start", "end"} & set(attrs)):
            nodes.append(node)
            continue
        name = node.name or f"Shape_{len(nodes)}"
        full, starts, ends, axes = (_unique(f"{name}_{part}", taken) for part in ("full", "starts", "ends", "axes"))
        end = int(attrs.get("end", np.iinfo(np.int64).max))
        for tensor_name, value in ((starts, int(attrs.get("start", 0))), (ends, end), (axes, 0)):
            model.graph.initializer.append(numpy_helper.from_array(np.array([value], dtype=np.int64), tensor_name))
        nodes.append(helper.make_node("Shape", [node.input[0]], [full], name=name))
        nodes.append(helper.make_node("Slice", [full, starts, ends, axes], [node.output[0]], name=_unique(f"{name}_slice", taken)))
        rewritten.append(name)
    if rewritten:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return rewritten


def _unique(name: str, taken: set[str]) -> str:
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}_{i}", i + 1
    taken.add(candidate)
    return candidate


def fold_constants(graph: Any, size_limit_bytes: int) -> None:
    graph.fold_constants(size_threshold=size_limit_bytes, error_ok=True)


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    if model.ByteSize() > PROTOBUF_LIMIT:
        return model  # in-memory inference cannot serialise >2 GB; ORT infers at load time instead
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        return model


def clean_model(model: onnx.ModelProto, fold_size_limit_mb: float = 64.0, parser: str = "trt8") -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Run the passes; the counts say what each removed, `slim` what onnxslim did (or why it was not used),
    `rewritten` which nodes were rewritten for the target's parser (by node name, so a user can find them)."""
    gs = _gs()
    parser = resolve_parser(parser)
    source = model
    model = onnx.ModelProto()
    model.CopyFrom(source)
    graph = gs.import_onnx(model)
    counts: dict[str, Any] = {"passthrough_removed": remove_passthrough(graph)}
    graph.cleanup(remove_unused_graph_inputs=False)
    slimmed, counts["slim"] = slim_model(export_like(graph, model), int(fold_size_limit_mb * 1024 * 1024))
    folding = "onnxslim"
    if slimmed is None:
        fold_constants(graph, int(fold_size_limit_mb * 1024 * 1024))
        graph.cleanup(remove_unused_graph_inputs=False)
        slimmed, folding = export_like(graph, model), "fold_constants"
    rewrite = needs_rewrite(parser, "shape_start_end")
    rewritten = {"shape_start_end": split_shape_slices(slimmed) if rewrite else []}
    graph = gs.import_onnx(slimmed)
    counts["passthrough_removed"] += remove_passthrough(graph)  # folding can expose new ones
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    counts["rewritten"] = rewritten
    counts["parser"] = parser
    counts["passes"] = ["remove_passthrough", "cleanup", folding, *(["split_shape_slices"] if rewrite else []), "toposort", "infer_shapes"]
    return infer_shapes(export_like(graph, model)), counts


def export_like(graph: Any, model: onnx.ModelProto) -> onnx.ModelProto:
    """gs.Graph -> ModelProto keeping the source model's IR version and opsets (gs would pick its own)."""
    exported = _gs().export_onnx(graph)
    exported.ir_version = model.ir_version
    del exported.opset_import[:]
    exported.opset_import.extend(model.opset_import)
    return exported


def toposorted(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = _gs().import_onnx(model)
    graph.toposort()
    return export_like(graph, model)


def _read_names(node: onnx.NodeProto) -> set[str]:
    """Every tensor a node reads, those its subgraphs (If, Loop, Scan bodies) read from the outer scope included."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        for body in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            inner = {o for n in body.node for o in n.output} | {i.name for i in body.input} | {i.name for i in body.initializer}
            names |= {t for n in body.node for t in _read_names(n)} - inner
    return names


def sort_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's nodes put in topological order in place (Kahn's, the original order among nodes ready together), and
    the model returned. Unlike toposorted it moves no tensor: a gs round trip copies every weight, which costs seconds
    per pass once plugin nodes carry their weights as attributes. Nodes in a cycle or reading a missing tensor keep
    their place at the end."""
    import heapq

    nodes = list(model.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [0] * len(nodes)
    readers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for p in {producer[t] for t in _read_names(n) if t in producer and producer[t] != i}:
            waiting[i] += 1
            readers.setdefault(p, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    rank: dict[int, int] = {}
    while ready:
        i = heapq.heappop(ready)
        rank[i] = len(rank)
        for r in readers.get(i, []):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    order = [rank.get(i, len(nodes) + i) for i in range(len(nodes))]
    if order != sorted(order):
        position = iter(order)  # the container's sort calls the key once per element, in order
        model.graph.node.sort(key=lambda _: next(position))
    return model


def io_specs(path: Path, model: onnx.ModelProto) -> tuple[list[InputSpec], dict[str, AxisRange], dict[str, Any] | None]:
    """Input specs from the ONNX's sidecar (written by export), else read off the graph."""
    sidecar = read_sidecar(path, required=False)
    if sidecar and "inputs" in sidecar:
        try:
            specs = [InputSpec(**s) for s in sidecar["inputs"]]
            axes = {k: AxisRange(**v) for k, v in sidecar.get("axes", {}).items()}
            return specs, axes, sidecar
        except Exception:
            raise UserError(f"sidecar {path}.json has malformed 'inputs' or 'axes'; re-run trtforge export.") from None
    specs, axes = specs_from_onnx(model)
    return specs, axes, sidecar


def axis_max_shapes(path: Path, specs: list[InputSpec], axes: dict[str, AxisRange], seed: int = 0) -> list[dict[str, int]]:
    """Each dynamic axis alone at its max (the others at their small check size), run on ONNX Runtime: the shapes,
    for the parity check to compare at too. A failure is a UserError naming the axis, the size, the node and, by
    bisection, the largest size that works (a position table shorter than the axis range)."""
    runner = OrtRunner(path)
    small = two_shapes(axes)[0]
    shapes = []
    for axis, rng in axes.items():
        sizes = {**small, axis: rng.max}
        if sizes == small:
            continue
        try:
            runner.run(random_feeds(specs, sizes, seed))
        except Exception as exc:

            def works(n: int) -> bool:
                try:
                    runner.run(random_feeds(specs, {**sizes, axis: n}, seed))
                    return True
                except Exception:
                    return False

            largest = largest_working(works, small[axis], rng.max)
            raise axis_limit_error(f"ONNX Runtime on {Path(path).name}", axis, rng.max, exc, largest, sizes) from None
        shapes.append(sizes)
    return shapes


def verify_same(
    original: Path | bytes,
    cleaned: Path | bytes,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    seed: int = 0,
    extra_shapes: Sequence[dict[str, int]] = (),
) -> dict[str, dict[str, Any]]:
    """The comparator's metrics per output of the cleaned model against the original, over two random input shapes
    (and `extra_shapes`)."""
    ref, new = OrtRunner(original), OrtRunner(cleaned)
    comparator = Comparator({name: None for name in ref.output_names})
    for i, sizes in enumerate([*two_shapes(axes), *extra_shapes]):
        feeds = random_feeds(specs, sizes, seed + i)
        comparator.add(ref.run(feeds), new.run(feeds))
    return comparator.result()


def clean_file(
    path: Path, output: Path | None = None, fold_size_limit_mb: float = 64.0, tolerance: float = 1e-5, parser: str = "auto"
) -> CleanResult:
    """Clean `path` into `output` for the parser target (`auto`: the TensorRT installed here; see graph.slim)."""
    start = time.perf_counter()
    path = Path(path)
    output = Path(output) if output else path.with_name(path.name.removesuffix(".onnx") + ".clean.onnx")
    refuse_overwrite("clean", [path], [output])
    model = load_onnx(path)
    specs, axes, source_sidecar = io_specs(path, model)
    before = graph_stats(model)
    maxima = axis_max_shapes(path, specs, axes)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.load(str(path), load_external_data=False).graph.initializer)
    cleaned, counts = clean_model(model, fold_size_limit_mb, parser)
    after = graph_stats(cleaned)
    graph_hash = onnx_graph_hash(cleaned)
    save_onnx(cleaned, output, external_data=True if external else None)
    try:
        per_output = verify_same(path, output, specs, axes, extra_shapes=maxima)
        failures = check_outputs(
            per_output, [("rel_l2", "max", tolerance, "rel-L2", "clean.tolerance")], "clean's parity check", "the cleaned model"
        )
    except BaseException:
        output.unlink(missing_ok=True)
        raise
    worst = {name: m["rel_l2"] for name, m in per_output.items()}
    sidecar = {
        "kind": "onnx",
        "step": "clean",
        "trtforge_version": __version__,
        "parent": os.path.abspath(path),  # absolute: later steps follow it from any folder
        "parent_graph_hash": (source_sidecar or {}).get("graph_hash") or onnx_graph_hash(model),
        "graph_hash": graph_hash,
        "inputs": [s.model_dump() for s in specs],
        "axes": {k: v.model_dump() for k, v in axes.items()},
        "outputs": (source_sidecar or {}).get("outputs"),
        "tokenizer": carried_tokenizer(path, source_sidecar, output),
        "passes": counts["passes"],
        "fold_size_limit_mb": fold_size_limit_mb,
        "removed": {"passthrough_removed": counts["passthrough_removed"]},
        "slim": counts["slim"],
        "parser": counts["parser"],
        "rewritten": counts["rewritten"],
        "nodes_before": before.nodes,
        "nodes_after": after.nodes,
        "initializer_bytes_before": before.initializer_bytes,
        "initializer_bytes_after": after.initializer_bytes,
        "verify_rel_l2": worst,
        "verify_tolerance": tolerance,
        "seconds": round(time.perf_counter() - start, 3),
    }
    for key in ("source", "config_name", "opset", "exporter"):
        if source_sidecar and key in source_sidecar:
            sidecar[key] = source_sidecar[key]
    if failures:
        output.unlink(missing_ok=True)
        raise GateFailed(f"clean's parity check failed: {failures[0]}; the cleaned model was not kept.")
    write_sidecar(output, sidecar)
    return CleanResult(output, before, after, worst, sidecar)


def carried_tokenizer(source: Path, source_sidecar: dict[str, Any] | None, output: Path) -> str | None:
    """The source sidecar's `tokenizer` re-expressed relative to the cleaned ONNX's folder, so the
    pointer stays valid when clean writes elsewhere (-o other/dir/x.onnx)."""
    relative = (source_sidecar or {}).get("tokenizer")
    if not relative:
        return None
    return os.path.relpath(source.parent / relative, output.parent)


def float_tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor that shape inference can type (inputs, outputs, intermediates)."""
    inferred = infer_shapes(model)
    types = {}
    for value in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        types[value.name] = value.type.tensor_type.elem_type
    return types


def expose_tensors(model: onnx.ModelProto, names: list[str], typed: bool = True) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs also include these intermediate tensors. Typed from ONNX shape
    inference, or (typed=False) declared without a type so that ONNX Runtime types them itself: no shape
    inference involved, for graphs it cannot type."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    existing = {o.name for o in exposed.graph.output}
    types = float_tensor_types(model) if typed else {}
    for name in names:
        if name not in existing:
            exposed.graph.output.append(
                helper_value_info(name, types.get(name, onnx.TensorProto.FLOAT)) if typed else onnx.ValueInfoProto(name=name)
            )
    return exposed


def helper_value_info(name: str, elem_type: int) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem_type, None)


def name_all_nodes(model: onnx.ModelProto) -> None:
    """Give unnamed nodes stable names (op type + index): fallbacks and reports refer to nodes by name."""
    seen = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
