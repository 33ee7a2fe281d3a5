"""What a built engine shows of its attention fusion: fused-attention layers counted in its layer list. Pure.

The attention pass decides before the build (a plugin node per attention on TensorRT 8.6; nothing on TensorRT 10+
and TensorRT-RTX, which fuse attention themselves). Whether the engine holds fused attention is only known after
the build, from its layers: without this check the "native" route was a belief, not a measurement. Fused attention
shows as:
- on TensorRT 10+ / TensorRT-RTX, Myelin's fused multi-head-attention kernel layers, named `_gemm_mha_v2_...` (and
  `_gemv_mha_v1_...` in a KV-cache engine's decode profile). TensorRT-RTX 1.7 fused every attention of the zoo's BERT,
  RoBERTa, GPT-2 and ViT exports (both exporters) in fp16 builds, and none in their fp32 builds;
- FMHA and cuDNN flash kernels (`fmha...`, `..._flash_fprop...`) where an inspector lists a layer's tactic;
- on TensorRT 8.6, the plugin layers the pass wrote, which the ONNX parser names after their nodes.
Other layer names carry the model's own node names, so they are never read as kernels. TensorRT lists one layer per
attention per optimization profile, so each profile is compared with the graph's attentions."""

from __future__ import annotations

import re
from typing import Any, Iterable

# Fused attention in a layer's Name: Myelin's kernel layers, which are named after the kernel (`_gemm_mha_v2_myl1_7`);
# other layer names carry the model's own node names (a module called flash_attn is not a fused kernel), so only this.
MYELIN_FUSED_NAME = re.compile(r"^_ge[mv][mv]_mha")
# Fused attention in a layer's TacticName (the kernel an inspector lists): Myelin's, FMHA, cuDNN's flash attention.
FUSED_TACTIC = re.compile(r"^_ge[mv][mv]_mha|fmha|flash_(?:fprop|fwd)", re.IGNORECASE)
_PROFILE_SUFFIX = re.compile(r" \[profile (\d+)\]$")
_MYELIN_GRAPH = re.compile(r"_myl(\d+)_\d+$")  # '..._myl3_7': layer 7 of Myelin graph 3 (one graph per profile)


def _kernel_family(text: str) -> str:
    """'_gemm_mha_v2_myl1_7' -> '_gemm_mha_v2': the name without its per-layer numbering and hash."""
    return re.sub(r"(_myl\d+)?(_\d+)*(_0x[0-9a-f]+)?$", "", text)


def _layer_profile(name: str, base: str, profiles: int, graph_profile: dict[str, int], plugin_layer: bool) -> int | None:
    """Which optimization profile a layer belongs to, or None where that cannot be told (see fused_attention_layers)."""
    if profiles <= 1:
        return 0
    if suffix := _PROFILE_SUFFIX.search(name):
        return int(suffix.group(1))
    if graph := _MYELIN_GRAPH.search(base):
        return graph_profile.get(graph.group(1))
    return 0 if plugin_layer else None  # a plugin layer without the suffix is the first profile's


def fused_attention_layers(layers: Iterable[dict[str, Any]], plugin_nodes: Iterable[str] = (), profiles: int = 1) -> dict[str, Any]:
    """The engine's fused-attention layers: {"layers": count, "kinds": {kernel family or plugin node kind: count},
    "by_profile": [count per optimization profile] or None where a layer's profile cannot be told}.
    plugin_nodes: the node names of the plugin nodes the attention pass wrote (their layers carry those names, with
    ' [profile N]' for later profiles). A layer's profile: 0 in a one-profile engine, else its ' [profile N]' suffix,
    else its Myelin graph's place among the engine's Myelin graphs where there is one graph per profile
    (TensorRT-RTX numbers them in profile order)."""
    layers = list(layers)
    nodes = set(plugin_nodes)
    bases = [_PROFILE_SUFFIX.sub("", str(l.get("Name", ""))) for l in layers]
    graphs = list(dict.fromkeys(m.group(1) for base in bases if (m := _MYELIN_GRAPH.search(base))))
    graph_profile = {g: i for i, g in enumerate(graphs)} if len(graphs) == profiles else {}
    kinds: dict[str, int] = {}
    by_profile: list[int] | None = [0] * max(1, profiles)
    count = 0
    for layer, base in zip(layers, bases):
        name, tactic = str(layer.get("Name", "")), str(layer.get("TacticName") or "")
        if base in nodes:
            kind = "attention plugin layer"
        elif MYELIN_FUSED_NAME.search(name):
            kind = _kernel_family(base)
        elif FUSED_TACTIC.search(tactic):
            kind = _kernel_family(tactic)
        else:
            continue
        count += 1
        kinds[kind] = kinds.get(kind, 0) + 1
        profile = _layer_profile(name, base, profiles, graph_profile, base in nodes)
        if by_profile is not None and profile is not None and profile < len(by_profile):
            by_profile[profile] += 1
        else:
            by_profile = None
    return {"layers": count, "kinds": kinds, "by_profile": by_profile}


def attention_evidence(
    record: dict[str, Any], layers: list[dict[str, Any]] | None, profiles: int, why_no_layers: str | None = None
) -> dict[str, Any]:
    """The sidecar's attention_fusion["engine"]: fused-attention layers found in the engine, per profile, against the
    attentions the graph held (the attentions the pass replaced, in records of trtforge before `attentions`)."""
    expected = len(record["attentions"] if "attentions" in record else record.get("replaced") or [])
    if layers is None:
        return {"known": False, "why": why_no_layers or "no layer information", "expected_per_profile": expected}
    found = fused_attention_layers(layers, [r["node"] for r in record.get("replaced") or [] if r.get("node")], profiles)
    complete = _every_profile_holds(found["by_profile"], found["layers"], profiles, expected)
    per_profile = min(found["by_profile"]) if found["by_profile"] else found["layers"] // max(1, profiles)
    return {
        "known": True,
        "layers": found["layers"],
        "kinds": found["kinds"],
        "profiles": profiles,
        "by_profile": found["by_profile"],
        "expected_per_profile": expected,
        "complete": complete,
        "fused": min(per_profile, expected) if expected else per_profile,  # in the profile that fused the fewest
    }


def fused_count(record: dict[str, Any]) -> tuple[int | None, int, str]:
    """(attentions fused, attentions the graph holds, where the count comes from) for the build's one-line summary: the
    engine's layers where they were read, else what the pass replaced (None where TensorRT fuses them itself and its
    layers could not be read)."""
    attentions = len(record["attentions"]) if "attentions" in record else len(record.get("replaced") or [])
    ev = record.get("engine") or {}
    if ev.get("known"):
        return ev.get("fused", ev.get("layers", 0)), attentions, "counted in the engine's layers"
    if record.get("route") == "native":
        return None, attentions, f"TensorRT fuses them itself; its layers were not read ({ev.get('why') or 'no layer information'})"
    return len(record.get("replaced") or []), attentions, "replaced by the pass; the engine's layers were not read"


def _every_profile_holds(by_profile: list[int] | None, layers: int, profiles: int, fused: int) -> bool:
    """Whether every profile holds `fused` fused attentions: per profile where each layer's profile is known, else only
    the total against profiles x fused can be compared."""
    return min(by_profile) >= fused if by_profile else layers >= fused * max(1, profiles)


def evidence_lines(record: dict[str, Any], precision: str | None) -> list[str]:
    """What `build` and `inspect` print of the evidence, and the shortfall in words ([] when there is nothing to say)."""
    ev = record.get("engine")
    if not ev:
        return []
    expected = ev.get("expected_per_profile") or 0
    if not ev.get("known"):
        return [f"  in the engine: not known ({ev.get('why')})"] if expected else []
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(ev["kinds"].items()))
    profiles, by_profile = ev.get("profiles", 1), ev.get("by_profile")
    if expected == 0:
        return [f"  in the engine: {ev['layers']} fused attention layer(s) ({kinds})"] if ev["layers"] else []
    where = " in every profile" if profiles > 1 else ""
    if ev["complete"]:
        return [f"  in the engine: {expected} of {expected} attention(s) fused{where} ({kinds})"]
    if ev["layers"] == 0:
        line = f"  in the engine: none of the {expected} attention(s) fused; they run as separate matrix multiplies and softmax"
    elif profiles <= 1:
        line = (
            f"  in the engine: only {ev['layers']} of {expected} attention(s) fused ({kinds}); the others run as "
            "separate matrix multiplies and softmax"
        )
    else:
        counts = (
            f"by profile: {', '.join(map(str, by_profile))}"
            if by_profile
            else f"{ev['layers']} fused layers for {profiles} profiles x {expected} attentions"
        )
        line = (
            f"  in the engine: not every attention is fused in every profile ({kinds}; {counts}); the others run as "
            "separate matrix multiplies and softmax"
        )
    if record.get("quantized_attentions"):
        line += f" ({len(record['quantized_attentions'])} of them quantized by calibrate --quantize-attention, left unfused on purpose)"
    if precision in ("fp32", "int8") and record.get("route") == "native":
        line += (
            " (TensorRT fuses attention in reduced precision and this build keeps it fp32: build --precision "
            + ("fp16" if precision == "fp32" else "best")
            + " for it)"
        )
    return [line]


def shortfall_warning(record: dict[str, Any], precision: str, engine: str) -> str | None:
    """A warning for an fp16 or best engine in which attentions the graph holds are left unfused where they were to be
    fused (by TensorRT itself or by the pass's plugins): they run slower. Best allows fp16, where attention fuses."""
    ev = record.get("engine") or {}
    if precision not in ("fp16", "best") or record.get("route") not in ("native", "plugin") or not ev.get("known"):
        return None  # fp32/int8: TensorRT does not fuse it; route none/off: the record already says why nothing fuses
    # Attentions quantized by calibrate --quantize-attention are left unfused on purpose: only the others are owed.
    owed = (ev.get("expected_per_profile") or 0) - len(record.get("quantized_attentions") or [])
    if owed <= 0 or _every_profile_holds(ev.get("by_profile"), ev["layers"], ev.get("profiles", 1), owed):
        return None
    where = " in some optimization profile" if ev.get("profiles", 1) > 1 else ""
    return (
        f"{engine}: not all of the graph's {ev['expected_per_profile']} attention(s) are fused in the engine{where}; "
        "the others run unfused and slower: `trtforge inspect` lists the layers."
    )
