"""The build stage's use of the fusion passes: which mode, which route, what the engine's sidecar records.

Kept apart from build.py so that the decision (mode x TensorRT x GPU x precision) is testable with plain
values; the one TensorRT question (is the plugin registered?) is asked by the caller and passed in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx

from trtforge.core.errors import UserError
from trtforge.fusion.attention import QKV_PROJECTIONS, FusionReport, find_candidates, fuse_attention
from trtforge.fusion.engine_evidence import evidence_lines, fused_count
from trtforge.fusion.gelu import GEMM_PLUGIN, GEMM_VERSION, fuse_gelu
from trtforge.fusion.gelu import PLUGIN as GELU_PLUGIN
from trtforge.fusion.gelu import PLUGIN_VERSION as GELU_VERSION
from trtforge.fusion.gelu import observed_names as gelu_observed_names
from trtforge.fusion.gemm import PLUGIN as GEMM_ONLY_PLUGIN
from trtforge.fusion.gemm import PLUGIN_VERSION as GEMM_ONLY_VERSION
from trtforge.fusion.gemm import fuse_gemm
from trtforge.fusion.index import Observation
from trtforge.fusion.plugins import (
    FLASH_CORE_VERSION,
    FLASH_PLUGIN,
    FLASH_VERSION,
    PLUGIN,
    PLUGIN_VERSION,
    Route,
    attention_route,
    backend_route,
    flash_refusal,
)
from trtforge.fusion.sdpa import CoreAttention
from trtforge.fusion.skip_layernorm import PLUGIN as SKIP_LN_PLUGIN
from trtforge.fusion.skip_layernorm import PLUGIN_VERSION as SKIP_LN_VERSION
from trtforge.fusion.skip_layernorm import fuse_skip_layernorm
from trtforge.fusion.skip_layernorm import observed_names as skip_layernorm_observed_names

MODES = ("auto", "on", "off")


def sm_of(compute_capability: str | None) -> int | None:
    """'9.0' -> 90."""
    try:
        major, minor = str(compute_capability).split(".")
        return int(major) * 10 + int(minor)
    except ValueError:
        return None


def observation_sizes(axes: dict[str, Any], profiles: list[Any]) -> dict[str, int]:
    """Every non-batch axis at the largest size any profile admits (the observed sequence is then the longest
    the engine can see, which the plugin's 512 limit is checked against), batch 2 (or its max)."""
    sizes = {}
    for name, rng in axes.items():
        top = max((p.axes[name].max for p in profiles if name in p.axes), default=rng.max)
        sizes[name] = min(2, top) if name == "batch" else top
    return sizes


QKV_CHOICES = ("auto", *QKV_PROJECTIONS)


def resolve_qkv_projection(choice: str, gemm_takes_it: bool) -> str:
    """--qkv-projection auto: "matmul" where the GEMM pass will take the packed projection into TrtforgeGemm
    (gemm_takes_it: qkv_gemm_applies), else "conv": the matmul into TrtforgeGemm ran faster than the conv on BERT-base
    fp16, while without the plugin a MatMul's Reshape before attention costs a copy kernel (figures: docs/performance.md#fusion-passes-auto-modes).
    conv and matmul pass through; anything else is the attention pass's error."""
    if choice != "auto":
        return choice
    return "matmul" if gemm_takes_it else "conv"


def qkv_gemm_applies(fuse_gemm: str, precision: str, flavour: str, version: str, gemm_registered: bool) -> bool:
    """Whether the GEMM pass will take a packed QKV MatMul: fp16 builds only (in INT8 `best` builds the projections'
    weights come through DequantizeLinear, which the pass leaves, and the conv form keeps TensorRT's INT8 convolution)."""
    return (
        precision == "fp16"
        and fuse_gemm != "off"
        and gemm_registered
        and elementwise_skip(GEMM_PASS, fuse_gemm, precision, flavour, version, True) is None
    )


def attention_fusion(
    model: onnx.ModelProto,
    mode: str,
    precision: str,
    flavour: str,
    version: str,
    compute_capability: str | None,
    plugin_registered: bool,
    feeds: dict | None,
    onnx_name: str,
    qkv_projection: str = "conv",
    flash_registered: bool = False,
    flash_core_registered: bool | None = None,
    observation: Observation | None = None,
) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    """(the fused model, or None when the graph stays as it is; the sidecar's `attention_fusion`).
    plugin_registered: TensorRT's CustomQKVToContextPluginDynamic v2; flash_registered: trtforge's
    TrtforgeFlashAttention (libtrtforge_plugins loaded), preferred per attention where it applies; flash_core_registered:
    its version 2 (separate Q, K, V), which the SDPA-core form needs (None: as flash_registered). observation: the
    model's tensors observed on unpadded(feeds) together with the elementwise passes' (else observed by the pass)."""
    core_registered = flash_registered if flash_core_registered is None else flash_core_registered
    if mode not in MODES:
        raise UserError(f"--fuse-attention '{mode}' is not one of {', '.join(MODES)} (config key build.fuse_attention).")
    if qkv_projection not in QKV_PROJECTIONS:
        raise UserError(f"--qkv-projection '{qkv_projection}' is not one of {', '.join(QKV_CHOICES)} (config key build.qkv_projection).")
    base = backend_route(flavour, version)
    candidates = find_candidates(model)
    record: dict[str, Any] = {
        "mode": mode,
        "route": base.kind,
        "why": base.reason,
        "replaced": [],
        "refused": [],
        "padding_allowed": True,
        "mask_inputs": [],
        # what the engine's layers are checked against after the build (engine_evidence.py)
        "attentions": [c.softmax for c in candidates if c.attention],
        "quantized_attentions": [c.softmax for c in candidates if c.attention and c.quantized],
    }
    if mode == "off":
        record.update(route="off", why="--fuse-attention off")
        return None, record
    if base.kind != "plugin":
        if mode == "on" and base.kind == "none":
            raise UserError(f"--fuse-attention on: {base.reason}; use --fuse-attention auto or off.")
        return None, record
    why_not = _attention_plugins_missing(precision, plugin_registered, flash_registered)
    if why_not:
        if mode == "on":
            raise UserError(f"--fuse-attention on cannot fuse {onnx_name}: {why_not}.")
        record.update(route="none", why=why_not)
        return None, record
    sm = sm_of(compute_capability)
    feeds = unpadded(feeds or {})
    route_for = _attention_router(flavour, version, sm, plugin_registered, flash_registered, core_registered)
    why = (
        base.reason
        if not flash_registered
        else (
            f"TensorRT {version}: {FLASH_PLUGIN} v{FLASH_VERSION} (cuDNN flash attention) where it applies, else {PLUGIN} v{PLUGIN_VERSION}"
        )
    )
    fused, report = fuse_attention(
        model, feeds, route_for, why, qkv_projection=qkv_projection, candidates=candidates, observation=observation
    )
    record.update(
        report.to_json(), route=base.kind, why=why, qkv_projection=qkv_projection, plugins=sorted({r["plugin"] for r in report.replaced})
    )
    if mode == "on" and not report.replaced and report.refused:
        raise UserError(f"--fuse-attention on found no attention in {onnx_name} it can fuse: {report.refused[0]['reason']}.")
    return (fused if report.replaced else None), record


def _attention_plugins_missing(precision: str, plugin_registered: bool, flash_registered: bool) -> str | None:
    """Why no attention plugin can run this build at all (None: one can), before any candidate is routed."""
    if precision not in ("fp16", "best"):
        return f"precision {precision}: the plugin's kernels are fp16 (build with --precision fp16 or best)"
    if not plugin_registered and not flash_registered:
        return f"neither {PLUGIN} v{PLUGIN_VERSION} nor {FLASH_PLUGIN} v{FLASH_VERSION} is in this TensorRT's plugin registry"
    return None


def _attention_router(
    flavour: str, version: str, sm: int | None, plugin_registered: bool, flash_registered: bool, core_registered: bool
) -> Callable[[Any], Any]:
    """The route of one attention (packed candidate or SDPA core) for fuse_attention: attention_route's choice, made
    "none" where the plugin it names is not in the registry."""

    def route_for(c: Any) -> Any:
        route = attention_route(flavour, version, sm, c.head_size, c.seq, c.causal, flash_registered)
        if isinstance(c, CoreAttention) and route.plugin == FLASH_PLUGIN and not core_registered:
            return Route(
                "none",
                f"{FLASH_PLUGIN} v{FLASH_CORE_VERSION} is not in this TensorRT's plugin registry (an older libtrtforge_plugins: "
                "rebuild it with `trtforge plugins build`)",
            )
        if route.plugin == PLUGIN and route.kind == "plugin" and not plugin_registered:
            return Route(
                "none",
                f"{PLUGIN} v{PLUGIN_VERSION} is not in this TensorRT's plugin registry and "
                f"{FLASH_PLUGIN} cannot take it: {flash_refusal(sm, c.head_size)}",
            )
        return route

    return route_for


def unpadded(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds with every mask input all ones: the attention pass verifies on unpadded rows (what the fused engine
    will be allowed to see)."""
    return {k: (np.ones_like(v) if "mask" in k.lower() else v) for k, v in feeds.items()}


GELU_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class ElementwisePass:
    """A pass that swaps a kind of elementwise block for one TensorRT 8.x plugin (GELU, skip-LayerNorm): its names,
    its fuse function, and where `auto` applies it (the precisions it was measured faster in, and why)."""

    key: str  # the sidecar record: f"{key}_fusion"; the flag: --fuse-{flag}; the config key: build.fuse_{key}
    flag: str
    what: str  # "GELU", "skip-LayerNorm"
    plugin: str
    version: str
    fuse: Callable[..., Any]
    auto_precisions: tuple[str, ...]
    auto_note: str  # why auto leaves other precisions alone (the measurement)
    route_note: str  # what the replacement computes, for the record
    # Plugins the fuse function may also use where registered: (its keyword, plugin, version); the build asks the
    # registry and passes keyword=True/False (GELU: TrtforgeGemmGelu, which takes the GEMM in front too).
    optional_plugins: tuple[tuple[str, str, str], ...] = ()
    precisions: tuple[str, ...] = ("fp16", "best", "fp32")  # where `on` can apply it at all
    # Where the plugin comes from, for the refusals: TensorRT's own plugins (None) or trtforge's library (its note).
    library_note: str | None = None
    # The tensors its fuse function observes on ONNX Runtime (its `observation` keyword), for one observation shared by
    # the passes; None where it observes nothing.
    observed_names: Callable[[onnx.ModelProto], set[str]] | None = None


GELU_PASS = ElementwisePass(
    "gelu",
    "gelu",
    "GELU",
    GELU_PLUGIN,
    GELU_VERSION,
    fuse_gelu,
    ("fp16",),
    # Faster in fp16 (one kernel for Myelin's erf GELU); slower in INT8 best, where it splits each int8 GEMM's
    # dequantize/quantize epilogue into separate kernels (docs/performance.md#fusion-passes-auto-modes).
    "the plugin was measured faster only in fp16 builds (INT8 best builds ran slower with it: docs/performance.md#fusion-passes-auto-modes)",
    "tanh GELU, bias folded",
    (("gemm_plugin", GEMM_PLUGIN, GEMM_VERSION),),
    observed_names=gelu_observed_names,
)
SKIP_LN_PASS = ElementwisePass(
    "skip_layernorm",
    "skip-layernorm",
    "skip-LayerNorm",
    SKIP_LN_PLUGIN,
    SKIP_LN_VERSION,
    fuse_skip_layernorm,
    ("fp16", "best"),
    # Faster in fp16 and INT8 best builds at the same engine accuracy; fp32 and int8 not measured (docs/performance.md#fusion-passes-auto-modes).
    "the plugin was measured faster only in fp16 and INT8 best builds (docs/performance.md#fusion-passes-auto-modes)",
    "residual add + LayerNorm in one kernel, dense bias folded",
    observed_names=skip_layernorm_observed_names,
)
GEMM_PASS = ElementwisePass(
    "gemm",
    "gemm",
    "GEMM",
    GEMM_ONLY_PLUGIN,
    GEMM_ONLY_VERSION,
    fuse_gemm,
    ("fp16",),
    # Faster than TensorRT's own GEMMs in fp16 builds at the same engine accuracy; INT8 best builds not measured (their
    # GEMMs are Q/DQ'd, not constants) (docs/performance.md#fusion-passes-auto-modes).
    "TrtforgeGemm was measured faster only in fp16 builds (docs/performance.md#fusion-passes-auto-modes)",
    "cuBLASLt matmul (+ bias epilogue), its kernel timed per shape",
    precisions=("fp16", "best"),
    library_note="libtrtforge_plugins",
)
GELU_AUTO_PRECISIONS = GELU_PASS.auto_precisions
# Applied in this order, each on the previous one's graph: GELU and skip-LayerNorm take their GEMMs and biases first.
ELEMENTWISE_PASSES = (GELU_PASS, SKIP_LN_PASS, GEMM_PASS)


def elementwise_fusion(
    spec: ElementwisePass,
    model: onnx.ModelProto,
    observe_model: onnx.ModelProto,
    mode: str,
    precision: str,
    flavour: str,
    version: str,
    plugin_registered: bool,
    feeds: dict | None,
    onnx_name: str,
    fuse_options: dict[str, Any] | None = None,
    observation: Observation | None = None,
) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    """(the model with the pass applied, or None; the sidecar's `{key}_fusion`). `auto` (the default) fuses where the
    plugin was measured faster (TensorRT 8.x, spec.auto_precisions); `on` asks for it anywhere the plugin exists
    and fails loudly where it cannot; `off` never. observation: observe_model's tensors observed once for every pass."""
    if mode not in GELU_MODES:
        raise UserError(f"--fuse-{spec.flag} '{mode}' is not one of {', '.join(GELU_MODES)} (config key build.fuse_{spec.key}).")
    record: dict[str, Any] = {"mode": mode, "route": "off", "why": f"--fuse-{spec.flag} off", "replaced": [], "refused": []}
    if mode == "off":
        return None, record
    why_not = elementwise_skip(spec, mode, precision, flavour, version, plugin_registered)
    if why_not:
        if mode == "on":
            raise UserError(f"--fuse-{spec.flag} on cannot fuse {onnx_name}: {why_not}.")
        record.update(route="none", why=why_not)
        return None, record
    shared = {"observation": observation} if observation is not None and spec.observed_names is not None else {}
    fused, report = spec.fuse(model, feeds or {}, observe_model=observe_model, **(fuse_options or {}), **shared)
    if not report.replaced:
        reason = report.refused[0]["reason"] if report.refused else f"the graph has no {spec.what} this pass knows"
        if mode == "on":
            raise UserError(f"--fuse-{spec.flag} on found no {spec.what} in {onnx_name} it can fuse: {reason}.")
        record.update(report.to_json(), route="none", why=f"no {spec.what} this pass can fuse")
        return None, record
    plugins = sorted({r["plugin"] for r in report.replaced if "plugin" in r})
    record.update(
        report.to_json(),
        route="plugin",
        plugins=plugins,
        why=f"TensorRT {version}: {' and '.join(plugins) or spec.plugin} ({spec.route_note})",
    )
    return fused, record


def elementwise_skip(spec: ElementwisePass, mode: str, precision: str, flavour: str, version: str, plugin_registered: bool) -> str | None:
    """Why the pass in this mode (auto|on) leaves this build's graph alone, or None when it fuses."""
    if backend_route(flavour, version).kind != "plugin":
        if spec.library_note:
            return f"{spec.plugin} is written for TensorRT 8.x ({spec.library_note}); {flavour} {version} gets no {spec.what} pass"
        return f"{spec.plugin} is TensorRT 8.x's plugin; {flavour} {version} fuses {spec.what} itself"
    if mode == "auto" and precision not in spec.auto_precisions:
        return f"precision {precision}: {spec.auto_note}; --fuse-{spec.flag} on forces it"
    if precision not in spec.precisions:
        return f"precision {precision} has no {spec.what} plugin route; build with {' or '.join(spec.precisions)}"
    if not plugin_registered and spec.library_note:
        return (
            f"{spec.plugin} v{spec.version} is not in this TensorRT's plugin registry; build libtrtforge_plugins once "
            "with `trtforge plugins build` (build then loads it), or give --plugin-library PATH (config key "
            "build.plugin_libraries)"
        )
    if not plugin_registered:
        return f"{spec.plugin} v{spec.version} is not in this TensorRT's plugin registry"
    return None


def gelu_fusion(
    model: onnx.ModelProto,
    observe_model: onnx.ModelProto,
    mode: str,
    precision: str,
    flavour: str,
    version: str,
    plugin_registered: bool,
    feeds: dict | None,
    onnx_name: str,
) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    return elementwise_fusion(GELU_PASS, model, observe_model, mode, precision, flavour, version, plugin_registered, feeds, onnx_name)


def gelu_skip(mode: str, precision: str, flavour: str, version: str, plugin_registered: bool) -> str | None:
    return elementwise_skip(GELU_PASS, mode, precision, flavour, version, plugin_registered)


def describe_gelu(record: dict[str, Any]) -> list[str]:
    replaced = (record or {}).get("replaced")
    if not replaced:
        return []
    worst = max((r["approximation_max_abs"] or 0.0 for r in replaced), default=0.0)
    gemm = sum(bool(r.get("gemm_folded")) for r in replaced)
    lines = [
        f"GELU fusion: replaced {len(replaced)} GELU(s) by {GELU_PLUGIN} "
        f"({sum(r['bias_folded'] for r in replaced)} with their bias)"
        + (f", {gemm} of them with their GEMM by {GEMM_PLUGIN} (cuBLASLt GELU_BIAS epilogue)" if gemm else "")
        + f"; tanh form, max |difference| on a sample of the observed activations {worst:.2g}"
    ]
    for r in record.get("refused") or []:
        lines.append(f"  not fused: {r['node']}: {r['reason']}")
    return lines


def describe_skip_layernorm(record: dict[str, Any]) -> list[str]:
    replaced = (record or {}).get("replaced")
    if not replaced:
        return []
    worst = max((r["rel_l2"] or 0.0 for r in replaced), default=0.0)
    lines = [
        f"skip-LayerNorm fusion: replaced {len(replaced)} residual LayerNorm(s) by {SKIP_LN_PLUGIN} "
        f"({sum(r['bias_folded'] for r in replaced)} with the dense bias); plugin formula vs the graph on the "
        f"observed activations: rel-L2 <= {worst:.2g}"
    ]
    return lines + _refused_by_reason(record, "node")


def describe_gemm(record: dict[str, Any]) -> list[str]:
    replaced = (record or {}).get("replaced")
    if not replaced:
        return []
    ops: dict[str, int] = {}
    for r in replaced:
        ops[r.get("op", "MatMul")] = ops.get(r.get("op", "MatMul"), 0) + 1
    kinds = " and ".join(f"{n} {op}" for op, n in sorted(ops.items(), key=lambda kv: kv[0] != "MatMul"))
    lines = [
        f"GEMM fusion: replaced {len(replaced)} fp16 projection(s) ({kinds}) by {GEMM_ONLY_PLUGIN} "
        f"({sum(r['bias_folded'] for r in replaced)} with their bias; cuBLASLt, its kernel timed per shape)"
    ]
    return lines + _refused_by_reason(record, "node")


def _refused_by_reason(record: dict[str, Any], key: str) -> list[str]:
    """'  not fused (N): reason' per distinct reason among the record's refused entries (named by `key`)."""
    reasons: dict[str, list[str]] = {}
    for r in record.get("refused") or []:
        reasons.setdefault(r["reason"], []).append(r[key])
    return [f"  not fused ({len(names)}): {reason}" for reason, names in reasons.items()]


def describe(record: dict[str, Any], precision: str | None = None) -> list[str]:
    """Lines for the build output: what was replaced, what was not and why, and what the engine's layers show."""
    if not record:
        return []
    fused, attentions, source = fused_count(record)
    lines = [
        f"attention: fused {'?' if fused is None else fused} of {attentions} ({source})",
        f"attention fusion ({record.get('mode')}): {record.get('why')}",
    ]
    replaced = record.get("replaced") or []
    for plugin in sorted({r["plugin"] for r in replaced}):
        group = [r for r in replaced if r["plugin"] == plugin]
        names = [r["softmax"] for r in group]
        if "mask" in group[0]:  # the SDPA-core form: separate Q, K, V
            forms = sorted(
                {
                    f"{r['heads']}/{r['kv_heads']} heads x {r['head_size']}, mask {r['mask']}" + (", bias" if r["bias"] else "")
                    for r in group
                }
            )
            how = "; ".join(forms)
        else:
            how = f"heads {group[0]['heads']} x {group[0]['head_size']}, QKV projection as {record.get('qkv_projection', 'conv')}"
        lines.append(
            f"  replaced {len(group)} attention(s) by {plugin} ({how}): " + ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        )
    lines += _refused_by_reason(record, "softmax")
    if not record.get("padding_allowed", True):
        lines.append(f"  unmasked kernels: run refuses padded {', '.join(record.get('mask_inputs') or [])}")
    return lines + evidence_lines(record, precision)


__all__ = [
    "FusionReport",
    "GELU_PASS",
    "GEMM_PASS",
    "QKV_CHOICES",
    "qkv_gemm_applies",
    "resolve_qkv_projection",
    "SKIP_LN_PASS",
    "attention_fusion",
    "describe",
    "describe_gelu",
    "describe_gemm",
    "describe_skip_layernorm",
    "elementwise_fusion",
    "gelu_fusion",
    "observation_sizes",
    "sm_of",
]
