"""Attention fusion: find the multi-head attentions an exporter wrote and, where the installed TensorRT
runs a fused kernel for them that it would not pick itself (8.6: the plugin library), replace each with one
plugin node the ONNX parser resolves from the plugin registry.

Matching is structural and then numeric. Structure: from each Softmax, up to the scores MatMul (through
mask Add/Where, scalar Mul/Div, Cast), down to the probabilities x V MatMul (through the NaN guard and
Cast), and from the two MatMuls up to Q, K, V projections of one tensor X by constant weights (MatMul or
Gemm, optional bias, through Reshape/Transpose/scalar scale/Cast, whatever order the exporter chose).
Numbers: one ONNX Runtime run of the original graph on unpadded inputs gives X, the heads (the scores'
shape), the softmax probabilities (zero above the diagonal: causal) and the context tensor; the pass
keeps a candidate only if softmax(Q Kᵀ s) V recomputed in numpy from X and the weights equals that
context. So a layout the matcher misreads is refused, never fused wrong.

Every candidate ends as replaced or refused with one reason. Pure onnx + numpy: the plugin itself is
never called here (ORT cannot run it); the engine is proven on the GPU (benchmarks/gpu/attention_h200.sh).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx

from trtforge.fusion.attention_match import Candidate, Projection, find_candidates
from trtforge.fusion.attention_nodes import QKV_PROJECTIONS, activation_qdq, pack_qkv, packed_plugin_nodes
from trtforge.fusion.attention_verify import reference_attention, verify, verify_names
from trtforge.fusion.index import GraphIndex, Observation, attr, finish_plugin_graph, observe, remove_producers
from trtforge.fusion.plugins import FLASH_CORE_VERSION, FLASH_PLUGIN, FLASH_VERSION, PLUGIN_DOMAIN, PLUGIN_VERSION, Route
from trtforge.fusion.sdpa import CoreAttention, core_mask_words, core_names, core_plugin_nodes, match_cores, verify_cores

__all__ = [
    "Candidate",
    "FusionReport",
    "Projection",
    "QKV_PROJECTIONS",
    "find_candidates",
    "fuse_attention",
    "pack_qkv",
    "reference_attention",
    "refuse_padding",
    "same_leading_dims",
]


@dataclass
class FusionReport:
    route: str
    replaced: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    padding_allowed: bool = True
    mask_inputs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "replaced": self.replaced,
            "refused": self.refused,
            "padding_allowed": self.padding_allowed,
            "mask_inputs": self.mask_inputs,
        }


def observed_names(model: onnx.ModelProto, candidates: list[Candidate] | None = None) -> set[str]:
    """The tensors fuse_attention reads: both forms' (packed and SDPA core), for an observation shared with other passes."""
    cands = candidates if candidates is not None else find_candidates(model)
    return verify_names(cands) | core_names(match_cores(model, [c for c in cands if c.attention and not c.quantized]))


def mask_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that look like a padding mask (what `run` must see all ones for an unmasked engine)."""
    return [i.name for i in model.graph.input if "mask" in i.name.lower()]


def fuse_attention(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    route_for: Callable[[Candidate], Route],
    route_name: str,
    apply: bool = True,
    qkv_projection: str = "conv",
    candidates: list[Candidate] | None = None,
    observation: Observation | None = None,
) -> tuple[onnx.ModelProto, FusionReport]:
    """Match, verify, and (apply) replace every attention whose route is the plugin; report each one's fate.
    qkv_projection: how the packed QKV projection is written (QKV_PROJECTIONS; see _plugin_nodes); candidates: the
    model's find_candidates where the caller has them already (they are verified and given reasons here);
    observation: the tensors of `model` observed with the other passes' (else observed here on `feeds`)."""
    cands = candidates if candidates is not None else find_candidates(model)
    # Where the packed form fails (Q, K, V no projections of one X, a bias or window on the scores), the SDPA core
    # alone, Q, K, V as the graph feeds them, for TrtforgeFlashAttention v2. Both forms' tensors come from one ORT run
    # (on a large model each session costs as much as the run).
    cores = match_cores(model, [c for c in cands if c.attention and not c.quantized])
    names = verify_names(cands) | core_names(cores)
    values = {} if not names else observation.values(names) if observation is not None else observe(model, feeds, sorted(names))
    verify(model, cands, feeds, values)
    cores = {k: core for k, core in cores.items() if next(c for c in cands if c.softmax == k).reason is not None}
    verify_cores(cores, values)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    routes = _packed_routes(cands, route_for)
    accepted_cores = _accept_cores(cands, cores, route_for)
    accepted = [c for c in cands if c.reason is None and c.softmax not in cores]
    report = FusionReport(route=route_name)
    for c in cands:
        if c.reason is not None:
            report.refused.append({"softmax": c.softmax, "reason": c.reason})
    if not (accepted or accepted_cores) or not apply:
        for c in accepted + accepted_cores:
            report.refused.append({"softmax": c.softmax, "reason": "fusion not applied (--fuse-attention off)"})
        return (out if apply else model), report
    out = remove_producers(out, {c.ctx for c in accepted} | {c.out for c in accepted_cores})
    _add_packed_nodes(out, GraphIndex(model), accepted, routes, qkv_projection, report)
    _add_core_nodes(out, accepted_cores, report)
    out = finish_plugin_graph(out)
    # verified unmasked on unpadded rows: only a mask input can pad (a bias input carries what the terms add)
    if any(c.masked for c in accepted) or any(c.masked and not c.bias for c in accepted_cores):
        report.mask_inputs = mask_inputs(model)
        report.padding_allowed = not report.mask_inputs
    return out, report


def _packed_routes(cands: list[Candidate], route_for: Callable[[Candidate], Route]) -> dict[str, Route]:
    """The route of each verified candidate in its packed form; one that no plugin takes gets the route's reason."""
    routes = {}
    for c in cands:
        if c.reason is None:
            r = route_for(c)
            routes[c.softmax] = r
            if r.kind != "plugin":
                c.reason = r.reason
    return routes


def _accept_cores(cands: list[Candidate], cores: dict[str, CoreAttention], route_for: Callable[[Any], Route]) -> list[CoreAttention]:
    """The SDPA cores the flash plugin takes where the packed form was refused (their candidates then count as fused);
    a core refused too adds its reason to its candidate's."""
    accepted_cores = []
    for c in cands:
        core = cores.get(c.softmax)
        if core is None:
            continue
        if core.reason is None:
            r = route_for(core)
            if r.kind == "plugin" and r.plugin == FLASH_PLUGIN:
                accepted_cores.append(core)
                c.reason = None
                continue
            core.reason = (
                r.reason
                if r.kind == "none" and FLASH_PLUGIN in r.reason
                else f"it needs {FLASH_PLUGIN} v{FLASH_CORE_VERSION} (libtrtforge_plugins)"
                + (f"; {r.reason}" if r.kind != "plugin" else "")
            )
        c.reason = f"{c.reason}; as separate Q, K, V: {core.reason}"
    return accepted_cores


def _add_packed_nodes(
    out: onnx.ModelProto,
    graph: GraphIndex,
    accepted: list[Candidate],
    routes: dict[str, Route],
    qkv_projection: str,
    report: FusionReport,
) -> None:
    """Each accepted packed attention's plugin nodes into `out` (graph indexes the original model), each recorded as
    replaced."""
    # Flash nodes whose inputs provably share [B, S] read one [S] tensor: the first one's (same_leading_dims; each
    # rewritten context keeps its attention input's [B, S], so it joins the group too).
    seq_source, same_s = None, set()
    for i, c in enumerate(accepted):
        x_qdq = activation_qdq(graph, c.q.x) if qkv_projection == "conv" and c.q.wscale is not None else None
        route = routes[c.softmax]
        shared = None
        if route.plugin == FLASH_PLUGIN:
            if seq_source is not None and same_leading_dims(graph, c.q.x, same_s):
                shared = seq_source
            else:
                seq_source, same_s = f"fused_attention_{i}/max_seqlen", set()
            same_s |= leading_dims_group(graph, c.q.x) | ({c.ctx} if c.ctx_rank == 3 else set())
        nodes, inits = packed_plugin_nodes(c, route, f"fused_attention_{i}", qkv_projection, x_qdq, seq_tensor=shared)
        out.graph.node.extend(nodes)
        out.graph.initializer.extend(inits)
        version = FLASH_VERSION if route.plugin == FLASH_PLUGIN else PLUGIN_VERSION
        report.replaced.append(
            {
                "softmax": c.softmax,
                "plugin": f"{route.plugin} v{version}",
                "heads": c.heads,
                "head_size": c.head_size,
                "scale": c.scale * c.q.scale * c.k.scale,
                "masked": c.masked,
                "causal": c.causal,
                "node": f"fused_attention_{i}/qkv_to_context",
                "seq_input": (shared or f"fused_attention_{i}/max_seqlen") if route.plugin == FLASH_PLUGIN else None,
                "qkv_projection": qkv_projection,
            }
        )


def _add_core_nodes(out: onnx.ModelProto, accepted_cores: list[CoreAttention], report: FusionReport) -> None:
    """Each accepted SDPA core's flash plugin node into `out`, each recorded as replaced."""
    for i, core in enumerate(accepted_cores):
        nodes, inits = core_plugin_nodes(core, f"fused_sdpa_{i}", FLASH_PLUGIN, FLASH_CORE_VERSION, PLUGIN_DOMAIN)
        out.graph.node.extend(nodes)
        out.graph.initializer.extend(inits)
        report.replaced.append(
            {
                "softmax": core.softmax,
                "plugin": f"{FLASH_PLUGIN} v{FLASH_CORE_VERSION}",
                "heads": core.heads,
                "kv_heads": core.kv_heads,
                "head_size": core.head_size,
                "scale": core.scale,
                "masked": core.masked,
                "causal": core.causal,
                "mask": core_mask_words(core),
                "bias": core.bias,
                "node": f"fused_sdpa_{i}/sdpa",
            }
        )


# Ops whose output keeps every axis but the last of its data inputs (with constants of at most one axis beside them).
_KEEPS_LEADING = {
    "Cast",
    "Identity",
    "Erf",
    "Tanh",
    "Relu",
    "Sigmoid",
    "Sqrt",
    "Neg",
    "Gelu",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "LayerNormalization",
    "MatMul",
}


def _keeping_step(g: GraphIndex, node: onnx.NodeProto) -> list[str] | None:
    """The data inputs of `node` whose axes but the last its output keeps (see same_leading_dims), or None."""
    if node.op_type not in _KEEPS_LEADING or node.domain not in ("", "ai.onnx"):  # a custom op of that name: unknown
        return None
    inputs = [i for i in node.input if i]
    if node.op_type == "MatMul":
        w = g.const(inputs[1]) if len(inputs) == 2 else None
        return [inputs[0]] if w is not None and w.ndim == 2 and g.const(inputs[0]) is None else None
    if node.op_type == "LayerNormalization":
        if attr(node, "axis", -1) != -1:
            return None
        inputs = inputs[:1]  # scale and bias are [E]
    data = [i for i in inputs if g.const(i) is None]
    if not data or any(g.const(i).ndim > 1 for i in inputs if i not in data):
        return None
    return data


def leading_dims_group(g: GraphIndex, t: str) -> set[str]:
    """t and the tensors it was computed from through single-input ops that keep every axis but the last (a pre-LN
    block's LayerNorm input, the residual stream): all share t's leading axes."""
    group, u = {t}, t
    while (node := g.producer.get(u)) is not None and (data := _keeping_step(g, node)) is not None and len(data) == 1:
        u = data[0]
        group.add(u)
    return group


def same_leading_dims(g: GraphIndex, t: str, known: set[str]) -> bool:
    """Whether t's axes before its last are those of the tensors in `known` (which share theirs): every path back
    from t reaches `known` through ops that keep them, i.e. elementwise ops whose constant operands have at most one
    axis, MatMul by a constant [K, N], LayerNormalization over the last axis. A Reshape, Transpose, Gather or
    anything else on the way is a no: then t's sequence length is not proven equal."""
    stack, seen = [t], set()
    while stack:
        u = stack.pop()
        if u in known or u in seen:
            continue
        seen.add(u)
        node = g.producer.get(u)
        data = _keeping_step(g, node) if node is not None else None
        if data is None:
            return False
        stack.extend(data)
    return True


def refuse_padding(sidecar: dict[str, Any] | None, name: str, arrays: dict[str, np.ndarray], engine: str) -> None:
    """`run`'s guard: an engine whose attention lost its mask must never see a padded row."""
    from trtforge.core.errors import UserError

    fusion = (sidecar or {}).get("attention_fusion") or {}
    if fusion.get("padding_allowed", True):
        return
    for mask in fusion.get("mask_inputs") or []:
        value = arrays.get(mask)
        if value is not None and not np.all(value != 0):
            raise UserError(
                f"input '{name}' has zeros in '{mask}' (padding), but {engine} was built with unmasked fused "
                "attention; give unpadded inputs or rebuild with --fuse-attention off."
            )
