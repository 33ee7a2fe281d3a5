"""What every fusion pass shares: the graph index (producers, consumers, constants), the observation of tensors on
ONNX Runtime, and the rewrite helpers that put plugin nodes in place of what they replace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from trtforge.fusion.plugins import PLUGIN_DOMAIN


class GraphIndex:
    """Producers, consumers, initializers and graph outputs of one model, for the passes' pattern walks."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        g = model.graph
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inits = {i.name: i for i in g.initializer}
        self.outputs = {o.name for o in g.output}

    def const(self, name: str) -> np.ndarray | None:
        """A constant's value, seen through Identity/Cast (the fp16 conversion casts Constant outputs)."""
        from trtforge.calibrate.placement import constant_value

        return constant_value(name, self.inits, self.producer)

    def scalar(self, name: str) -> float | None:
        value = self.const(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    def data_consumers(self, name: str) -> list[onnx.NodeProto]:
        return [c for c in self.consumers.get(name, []) if c.op_type != "Shape"]


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """A node attribute's value, or `default`."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def observe(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """Values of the named tensors on ORT (graph outputs exposed untyped: ORT types them itself)."""
    from trtforge.backends.onnxruntime import OrtRunner
    from trtforge.graph.index import expose_tensors

    return OrtRunner(expose_tensors(model, names, typed=False).SerializeToString()).run(feeds, names)


class Observation:
    """Tensors of one graph on one set of feeds, observed on ONNX Runtime once for every pass that reads them: on a
    full-size model a session and a run cost seconds each, and the attention, GELU and skip-LayerNorm passes all read
    the graph before fusion. `wanted`: what the passes will ask for, observed together by the first request; a name
    outside it is observed when asked."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], wanted: set[str] | None = None):
        self.model, self.feeds = model, feeds
        self.wanted = set(wanted or ())
        self.cached: dict[str, np.ndarray] = {}
        self.runs = 0

    def values(self, names: list[str] | set[str]) -> dict[str, np.ndarray]:
        missing = set(names) - self.cached.keys()
        if missing:
            self.cached.update(observe(self.model, self.feeds, sorted(missing | (self.wanted - self.cached.keys()))))
            self.runs += 1
        return {n: self.cached[n] for n in names}


@dataclass
class PassReport:
    """What an elementwise plugin pass (GELU, skip-LayerNorm) replaced and refused, as its sidecar record holds it."""

    replaced: list[dict[str, Any]]
    refused: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"replaced": self.replaced, "refused": self.refused}


def drop_producers(model: onnx.ModelProto, tensors: set[str]) -> onnx.ModelProto:
    """A copy of `model` without the nodes that write any of `tensors` (a pass's plugin nodes write them instead)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return remove_producers(out, tensors)


def remove_producers(model: onnx.ModelProto, tensors: set[str]) -> onnx.ModelProto:
    """drop_producers in place (deleted from the back: rebuilding the list would copy every node's attributes)."""
    for i in reversed([i for i, n in enumerate(model.graph.node) if set(n.output) & tensors]):
        del model.graph.node[i]
    return model


def plugin_with_cast(
    op: str, version: str, inputs: list[str], y: str, plugin_dtype: Any, y_dtype: Any, name: str, prefix: str, **attrs: Any
) -> list[onnx.NodeProto]:
    """The plugin node that writes `y`, through a Cast to y's type where the plugin runs in another one."""
    plugin_out = y if np.dtype(y_dtype) == np.dtype(plugin_dtype) else f"{prefix}/out"
    nodes = [
        helper.make_node(op, inputs, [plugin_out], name=name, domain=PLUGIN_DOMAIN, plugin_version=version, plugin_namespace="", **attrs)
    ]
    if plugin_out != y:
        nodes.append(
            helper.make_node("Cast", [plugin_out], [y], name=f"{prefix}/cast", to=helper.np_dtype_to_tensor_dtype(np.dtype(y_dtype)))
        )
    return nodes


def finish_plugin_graph(out: onnx.ModelProto) -> onnx.ModelProto:
    """After a pass: drop what its plugin nodes orphaned, sort the nodes, declare the plugins' domain."""
    from trtforge.graph.index import sort_nodes

    prune(out)
    sort_nodes(out)
    if not any(o.domain == PLUGIN_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    return out


def prune(model: onnx.ModelProto) -> None:
    """Drop nodes and initializers no graph output depends on."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    needed, stack, keep = set(), [o.name for o in g.output], set()
    while stack:
        t = stack.pop()
        if t in needed:
            continue
        needed.add(t)
        node = producer.get(t)
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            stack.extend(i for i in node.input if i)
    # deleted in place, from the back: rebuilding the lists would copy every weight (plugin nodes carry theirs)
    for i in reversed([i for i, n in enumerate(g.node) if id(n) not in keep]):
        del g.node[i]
    for i in reversed([i for i, t in enumerate(g.initializer) if t.name not in needed]):
        del g.initializer[i]
