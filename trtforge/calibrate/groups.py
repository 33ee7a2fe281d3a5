"""Q/DQ groups by role, for bisection (`trtforge bisect`). Pure: graph structure in, node names out.

Issue 10 found the cause of a BERT engine at cosine 0.74 only by switching Q/DQ groups on and off:
the attention batched MatMuls. Groups follow what TensorRT fuses differently, so each one can be blamed
on its own:
- transformers: `attention_qk` (an activation x activation MatMul feeding a Softmax), `attention_av` (one
  fed by a Softmax), `qkv_projection` (a weighted GEMM feeding an attention MatMul), `attention_output`
  (a weighted GEMM fed by an attention-AV MatMul), `ffn_up` (a weighted GEMM feeding an activation
  function), `ffn_down` (a weighted GEMM fed by one), `other_bmm`, `other_linear`;
- CNNs: `first_conv` (a convolution reading a graph input), `conv_<H>x<W>` (the others by output
  resolution, i.e. by stage, where shapes are known; `conv` otherwise), `deconv`;
- anywhere: `head` (a GEMM whose output reaches a graph output through bias, reshape and activation ops
  only, or that reads one token picked by a Gather/Slice: classifier, pooler) and `residual_add` (the Adds whose residual input the plan quantizes).
Paths are followed across non-GEMM ops only, a few hops deep: a GEMM's role is decided by its
neighbours, not by names, so it works on any exporter's naming.
"""

from __future__ import annotations

from typing import Iterable

import onnx

from trtforge.calibrate.placement import GEMM_OPS, QuantPlan

ACTIVATIONS = (
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "Erf",
    "Tanh",
    "Relu",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Softplus",
    "Elu",
    "LeakyRelu",
    "Selu",
    "Mish",
    "Swish",
    "Silu",
    "QuickGelu",
    "Clip",
)
_HEAD_PATH = (
    "Add",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Cast",
    "Tanh",
    "Sigmoid",
    "Softmax",
    "Relu",
    "Gelu",
    "Gather",
    "Slice",
)
ORDER = (
    "first_conv",
    "conv",
    "deconv",
    "qkv_projection",
    "attention_qk",
    "attention_av",
    "attention_output",
    "ffn_up",
    "ffn_down",
    "other_bmm",
    "other_linear",
    "head",
    "residual_add",
)


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        self.inits = {i.name for i in model.graph.initializer}
        self.constants = self.inits | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for t in node.input:
                self.consumers.setdefault(t, []).append(node)
        self.inputs = {i.name for i in model.graph.input} - self.inits
        self.outputs = {o.name for o in model.graph.output}

    def forward(self, node: onnx.NodeProto, depth: int) -> list[onnx.NodeProto]:
        """Nodes reachable from `node`'s outputs within `depth` hops, not expanding past GEMMs."""
        return self._walk([node], depth, lambda n: [c for o in n.output for c in self.consumers.get(o, [])])

    def backward(self, tensors: Iterable[str], depth: int) -> list[onnx.NodeProto]:
        """Producers of `tensors` and theirs within `depth` hops, not expanding past GEMMs."""
        start = [self.producer[t] for t in tensors if t in self.producer]
        return start + self._walk(start, depth - 1, lambda n: [self.producer[t] for t in n.input if t in self.producer])

    @staticmethod
    def _walk(start: list[onnx.NodeProto], depth: int, step) -> list[onnx.NodeProto]:
        starts = {id(n) for n in start}
        seen, frontier, found = set(starts), list(start), []
        for _ in range(depth):
            nxt = []
            for node in frontier:
                if node.op_type in GEMM_OPS and id(node) not in starts:
                    continue
                for other in step(node):
                    if id(other) not in seen:
                        seen.add(id(other))
                        found.append(other)
                        nxt.append(other)
            frontier = nxt
        return found


def _is_bmm(node: onnx.NodeProto, graph: _Graph) -> bool:
    return node.op_type == "MatMul" and not any(t in graph.constants or _constant_behind(t, graph) for t in node.input[:2])


def _constant_behind(tensor: str, graph: _Graph) -> bool:
    node = graph.producer.get(tensor)
    while node is not None and node.op_type in ("Identity", "Cast", "DequantizeLinear"):
        if node.input[0] in graph.constants:
            return True
        node = graph.producer.get(node.input[0])
    return False


def _reaches_output(node: onnx.NodeProto, graph: _Graph, depth: int = 4) -> bool:
    tensor = node.output[0]
    for _ in range(depth + 1):
        if tensor in graph.outputs:
            return True
        users = graph.consumers.get(tensor, [])
        if len(users) != 1 or users[0].op_type not in _HEAD_PATH:
            return False
        user = users[0]
        if user.op_type == "Add" and not all(t == tensor or t in graph.constants for t in user.input):
            return False  # a residual Add: the GEMM is inside the network, not its head
        tensor = user.output[0]
    return False


def _softmax_after(node: onnx.NodeProto, graph: _Graph) -> bool:
    return any(n.op_type == "Softmax" for n in graph.forward(node, 4))


def _softmax_before(node: onnx.NodeProto, graph: _Graph) -> bool:
    return any(n.op_type == "Softmax" for n in graph.backward(node.input[:1], 3))


def _stage(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]] | None) -> str:
    shape = (shapes or {}).get(node.output[0])
    return f"conv_{shape[-2]}x{shape[-1]}" if shape is not None and len(shape) == 4 else "conv"


def node_role(node: onnx.NodeProto, graph: _Graph, shapes: dict[str, tuple[int, ...]] | None = None) -> str:
    """The role group of one GEMM-like node (see the module doc)."""
    if node.op_type in ("Conv", "ConvTranspose"):
        data = node.input[0]
        behind = graph.backward([data], 2)
        if data in graph.inputs or any(
            t in graph.inputs for n in behind if n.op_type in ("Cast", "Identity", "Pad", "Transpose") for t in n.input
        ):
            return "first_conv"
        if _reaches_output(node, graph):
            return "head"
        return "deconv" if node.op_type == "ConvTranspose" else _stage(node, shapes)
    if _is_bmm(node, graph):
        if _softmax_after(node, graph):
            return "attention_qk"
        if _softmax_before(node, graph):
            return "attention_av"
        return "other_bmm"
    if _reaches_output(node, graph):
        return "head"
    data = [t for t in node.input[:2] if t and t not in graph.constants and not _constant_behind(t, graph)]
    ahead = graph.forward(node, 6)
    if any(n.op_type == "MatMul" and _is_bmm(n, graph) and (_softmax_after(n, graph) or _softmax_before(n, graph)) for n in ahead):
        return "qkv_projection"
    # 6 hops: an erf GELU is 4 ops deep, a tanh GELU 6, and SmoothQuant may put a Mul in front of the GEMM.
    behind = graph.backward(data, 6)
    if any(n.op_type == "MatMul" and _is_bmm(n, graph) and _softmax_before(n, graph) for n in behind):
        return "attention_output"
    if any(n.op_type in ("Gather", "Slice") for n in graph.backward(data, 2)):
        return "head"  # a pooler reading one token (BERT's [CLS]) before a classifier
    if any(n.op_type in ACTIVATIONS for n in graph.forward(node, 6)):
        return "ffn_up"
    if any(n.op_type in ACTIVATIONS for n in behind):
        return "ffn_down"
    return "other_linear"


def role_groups(model: onnx.ModelProto, plan: QuantPlan, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, list[str]]:
    """{group: node names} over the plan's quantized GEMMs and residual Adds, in ORDER (conv stages by
    decreasing resolution); empty groups are left out."""
    graph = _Graph(model)
    nodes = {n.name: n for n in model.graph.node}
    groups: dict[str, list[str]] = {}
    for target in plan.targets:
        groups.setdefault(node_role(nodes[target.node], graph, shapes), []).append(target.node)
    if plan.residual_adds:
        groups["residual_add"] = list(plan.residual_adds)

    def rank(name: str) -> tuple[int, int]:
        if name.startswith("conv_"):
            h, w = (int(x) for x in name[5:].split("x"))
            return ORDER.index("conv"), -h * w
        return ORDER.index(name) if name in ORDER else len(ORDER), 0

    return {name: groups[name] for name in sorted(groups, key=rank)}


def select_groups(groups: dict[str, list[str]], spec: str | None) -> dict[str, list[str]]:
    """`auto`/None: all; else a comma list of group names (a name ending in '*' is a prefix, e.g. conv_*).
    Raises ValueError naming the unknown ones."""
    if not spec or spec.strip() == "auto":
        return groups
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    chosen: dict[str, list[str]] = {}
    unknown = []
    for w in wanted:
        hits = [g for g in groups if (g.startswith(w[:-1]) if w.endswith("*") else g == w)]
        if not hits:
            unknown.append(w)
        for g in hits:
            chosen[g] = groups[g]
    if unknown:
        raise ValueError(f"unknown group(s) {', '.join(unknown)}; this model has {', '.join(groups) or 'none'}")
    return chosen


def variants(groups: dict[str, list[str]], modes: Iterable[str] = ("off", "alone")) -> list[tuple[str, set[str]]]:
    """(variant name, groups quantized): all on, then each group off and/or each group alone."""
    names = list(groups)
    out = [("all", set(names))]
    modes = list(modes)
    for g in names:
        if "off" in modes and len(names) > 1:
            out.append((f"without {g}", set(names) - {g}))
        if "alone" in modes and len(names) > 1:
            out.append((f"only {g}", {g}))
    return out


def float_nodes_for(plan: QuantPlan, groups: dict[str, list[str]], on: set[str]) -> set[str]:
    """Nodes to keep float so that exactly the groups in `on` carry Q/DQ (targets and residual Adds outside
    every selected group stay float too: a bisection on a subset of groups quantizes only that subset)."""
    quantized = {n for g in on for n in groups.get(g, [])}
    every = {t.node for t in plan.targets} | set(plan.residual_adds)
    return every - quantized
