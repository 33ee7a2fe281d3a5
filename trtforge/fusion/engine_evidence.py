"""What a built engine shows of its attention fusion: fused-attention layers counted in its layer list. Pure.

The attention pass decides before the build (a plugin node per attention on TensorRT 8.6; nothing on TensorRT 10+
and TensorRT-RTX, which fuse attention themselves). Whether the engine holds fused attention is only known after
the build, from its layers: without this check the "native" route was a belief, not a measurement. Fused attention
shows as:
- on TensorRT 10+ / TensorRT-RTX, Myelin's fused multi-head-attention kernels, named `_gemm_mha_v2...` (TensorRT-RTX
  1.7 fused every attention of the zoo's BERT, RoBERTa, GPT-2 and ViT exports, both exporters, in fp16 builds, and
  none in fp32 builds of MiniLM); FMHA and flash kernels by name (`fmha...`, `..._flash_fprop...`) where an inspector lists tactics;
- on TensorRT 8.6, the plugin layers the pass wrote, which the ONNX parser names after their nodes.
TensorRT lists one layer per attention per optimization profile (a KV-cache engine's decode profile runs
`_gemv_mha_v1`), so the fewest fused in any one profile is what compares with the graph's attentions."""

from __future__ import annotations

import re
from typing import Any, Iterable

# Kernel and layer names of fused attention (case-insensitive), in a layer's Name or TacticName.
FUSED_KERNELS = re.compile(r"_ge[mv][mv]_mha|fmha|fused_?mha|flash_(?:fprop|fwd|attn)", re.IGNORECASE)
_PROFILE_SUFFIX = re.compile(r" \[profile (\d+)\]$")
_MYELIN_GRAPH = re.compile(r"_myl(\d+)_\d+$")  # '..._myl3_7': layer 7 of Myelin graph 3 (one graph per profile)


def _kernel_family(text: str) -> str:
    """'_gemm_mha_v2_myl1_7' -> '_gemm_mha_v2': the name without its per-layer numbering and hash."""
    return re.sub(r"(_myl\d+)?(_\d+)*(_0x[0-9a-f]+)?$", "", text)


def fused_attention_layers(layers: Iterable[dict[str, Any]], plugin_nodes: Iterable[str] = (),
                           profiles: int = 1) -> dict[str, Any]:
    """The engine's fused-attention layers: {"layers": count, "kinds": {kernel family or plugin node kind: count},
    "by_profile": [count per optimization profile] or None where a layer's profile cannot be told}.
    plugin_nodes: the node names of the plugin nodes the attention pass wrote (their layers carry those names, with
    ' [profile N]' for later profiles). A layer's profile: its ' [profile N]' suffix, else its Myelin graph's place
    among the engine's Myelin graphs where there is one graph per profile (TensorRT-RTX names them in profile order)."""
    layers = list(layers)
    nodes = set(plugin_nodes)
    graphs = list(dict.fromkeys(m.group(1) for l in layers if (m := _MYELIN_GRAPH.search(str(l.get("Name", ""))))))
    graph_profile = {g: i for i, g in enumerate(graphs)} if len(graphs) == profiles else {}
    kinds: dict[str, int] = {}
    by_profile: list[int] | None = [0] * max(1, profiles)
    count = 0
    for layer in layers:
        name = str(layer.get("Name", ""))
        base = _PROFILE_SUFFIX.sub("", name)
        if base in nodes:
            kind = "attention plugin layer"
        else:
            tactic = str(layer.get("TacticName") or "")
            hit = FUSED_KERNELS.search(name) or FUSED_KERNELS.search(tactic)
            if not hit:
                continue
            kind = _kernel_family(name if FUSED_KERNELS.search(name) else tactic)
        count += 1
        kinds[kind] = kinds.get(kind, 0) + 1
        suffix, graph = _PROFILE_SUFFIX.search(name), _MYELIN_GRAPH.search(name)
        profile = (int(suffix.group(1)) if suffix else graph_profile.get(graph.group(1)) if graph
                   else 0 if profiles == 1 or base in nodes else None)
        if by_profile is not None and profile is not None and profile < len(by_profile):
            by_profile[profile] += 1
        else:
            by_profile = None
    return {"layers": count, "kinds": kinds, "by_profile": by_profile}


def attention_evidence(record: dict[str, Any], layers: list[dict[str, Any]] | None, profiles: int,
                       why_no_layers: str | None = None) -> dict[str, Any]:
    """The sidecar's attention_fusion["engine"]: fused-attention layers found in the engine, per profile, against
    what the graph held (route "native": its attentions; route "plugin": the attentions the pass replaced)."""
    if record.get("route") == "plugin":
        expected = len(record.get("replaced") or [])
    else:
        expected = len(record.get("attentions") or [])
    if layers is None:
        return {"known": False, "why": why_no_layers or "no layer information", "expected_per_profile": expected}
    found = fused_attention_layers(layers, [r["node"] for r in record.get("replaced") or [] if r.get("node")], profiles)
    # The fewest fused in any one profile where each layer's profile is known, else the mean over profiles.
    per_profile = min(found["by_profile"]) if found["by_profile"] else found["layers"] / max(1, profiles)
    return {"known": True, "layers": found["layers"], "kinds": found["kinds"], "profiles": profiles,
            "by_profile": found["by_profile"], "per_profile": per_profile, "expected_per_profile": expected}


def evidence_lines(record: dict[str, Any], precision: str | None) -> list[str]:
    """What `build` and `inspect` print of the evidence, and the shortfall in words ([] when there is nothing to say)."""
    ev = record.get("engine")
    if not ev:
        return []
    expected = ev.get("expected_per_profile") or 0
    if not ev.get("known"):
        return [f"  in the engine: not known ({ev.get('why')})"] if expected else []
    got = ev["per_profile"]
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(ev["kinds"].items())) or "none"
    per = " in every profile" if ev.get("profiles", 1) > 1 else ""
    if expected == 0:
        return [f"  in the engine: {got:g} fused attention layer(s){per} ({kinds})"] if got else []
    if got >= expected:
        return [f"  in the engine: {expected} of {expected} attention(s) fused{per} ({kinds})"]
    if ev["layers"] == 0:
        line = f"  in the engine: none of the {expected} attention(s) fused; they run as separate matrix multiplies and softmax"
    else:
        counts = f"; by profile: {', '.join(map(str, ev['by_profile']))}" if per and ev.get("by_profile") else ""
        line = (f"  in the engine: only {got:g} of {expected} attention(s) fused{' in some profile' if per else ''} "
                f"({kinds}{counts}); the others run as separate matrix multiplies and softmax")
    if precision == "fp32" and record.get("route") == "native":
        line += " (an fp32 build: TensorRT's fused attention kernels are reduced-precision; build --precision fp16 for them)"
    return [line]


def shortfall_warning(record: dict[str, Any], precision: str, engine: str) -> str | None:
    """A warning for an fp16 engine in which TensorRT left attentions unfused that the graph holds (they are slower)."""
    ev = record.get("engine") or {}
    if precision != "fp16" or not ev.get("known") or not ev.get("expected_per_profile"):
        return None
    if ev["per_profile"] >= ev["expected_per_profile"]:
        return None
    where = " in some optimization profile" if ev.get("profiles", 1) > 1 else ""
    return (f"{engine}: only {ev['per_profile']:g} of {ev['expected_per_profile']} attention(s) are fused in the engine"
            f"{where}; the others run unfused and slower: `trtforge inspect` lists the layers.")
