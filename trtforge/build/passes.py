"""The graph passes build runs before TensorRT sees the ONNX: attention, elementwise and GEMM fusions (FP8 included), each with what it replaced and refused, and what the engine shows of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import onnx

from trtforge.backends.tensorrt import BuildOptions, TrtModule
from trtforge.build.profiles import Profile
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError
from trtforge.fusion.index import Observation
from trtforge.fusion.step import ELEMENTWISE_PASSES, ElementwisePass
from trtforge.runtime.feeds import random_feeds

PRECISIONS = ("fp32", "fp16", "int8", "best")


def gemm_fp8(
    mod: TrtModule,
    identity: dict[str, Any],
    fused: onnx.ModelProto | None,
    observe_model: onnx.ModelProto,
    source_model: onnx.ModelProto,
    precision: str,
    onnx_path: Path,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    min_cosine: float,
    chain: str = "auto",
    data: Path | None = None,
    min_top1: float | None = None,
    sampled: Any = None,
) -> tuple[onnx.ModelProto, dict[str, Any], list[dict[str, Any]]]:
    """--gemm-precision fp8: (the fused graph with its GEMM plugin nodes as TrtforgeGemmFp8, the sidecar's
    `gemm_precision`, the held-out feeds the engine is gated on). Scales come from the same samples as the fp16
    conversion's magnitudes (calibration data, else random feeds); the gate adds two random feeds no scale saw.
    chain (auto|on|off): FC1 -> FC2 pairs pass e4m3 bytes; on requires one. data: build.calib_data; sampled: the fp16
    conversion's sample_feeds answer for it, where build has one."""
    from trtforge.backends.plugin_libraries import plugin_registered
    from trtforge.build.precision import sample_feeds
    from trtforge.fusion.fp8 import HEADROOM, PLUGIN, PLUGIN_VERSION, fp8_chains, fp8_skip, observe_peaks, plugin_gemms, to_fp8

    why = fp8_skip(precision, mod.flavour, mod.version, identity.get("compute_capability"), plugin_registered(mod, PLUGIN, PLUGIN_VERSION))
    if why:
        raise UserError(f"--gemm-precision fp8 cannot apply to {onnx_path.name}: {why}.")
    gemms = plugin_gemms(fused) if fused is not None else []
    if not gemms:
        raise UserError(
            f"--gemm-precision fp8 found no GEMM plugin node in {onnx_path.name}'s fused graph (the GEMM and GELU "
            "passes replaced no MatMul; see their lines in the build output, build.fuse_gemm / build.fuse_gelu)."
        )
    no_pair = UserError(
        f"--fp8-chain-ffn on found no FC1 -> FC2 pair in {onnx_path.name} to chain (it needs a TrtforgeGemmGelu "
        "whose output one FP8 GEMM alone reads); build with --fp8-chain-ffn auto or off."
    )
    if chain == "on" and not fp8_chains(fused, {g.node.name for g in gemms}):  # before sampling: the graph alone says so
        raise no_pair
    feeds, source = sampled or sample_feeds(onnx_path, source_model, specs, axes, data)
    out, report = to_fp8(fused, observe_peaks(observe_model, feeds, [g.x for g in gemms]), chain=chain != "off")
    if not report.replaced:
        raise UserError(f"--gemm-precision fp8 cannot convert any GEMM of {onnx_path.name}: {report.refused[0]['reason']}.")
    if chain == "on" and not any(r.get("in_fp8") for r in report.replaced):  # a pair's GEMM stayed fp16
        raise no_pair
    opt = {name: rng.opt for name, rng in axes.items()}
    held_out = [random_feeds(specs, opt, seed) for seed in (100, 101)]
    check_from = "2 random feeds at the opt shapes (seeds 100, 101)"
    real = len(feeds) if source.startswith("calibration data") else 0  # the gate's first `real` batches; top-1 is judged on them
    if real:
        held_out, check_from = feeds + held_out, f"{source} and {check_from}"
    record = {
        "precision": "fp8",
        "plugin": f"{PLUGIN} v{PLUGIN_VERSION}",
        "headroom": HEADROOM,
        "magnitudes_from": source,
        "chain_ffn": chain,
        "gate": {"min_cosine": min_cosine, "min_top1_agreement": min_top1, "feeds": check_from, "real_batches": real},
        **report.to_json(),
    }
    return out, record, held_out


@dataclass(frozen=True)
class AttentionPlugins:
    """Which attention plugins this build's TensorRT has, asked only where the pass can apply at all."""

    registered: bool  # TensorRT's CustomQKVToContextPluginDynamic
    flash: bool  # TrtforgeFlashAttention v1 (packed QKV)
    flash_core: bool  # TrtforgeFlashAttention v2 (separate Q, K, V)

    @property
    def any(self) -> bool:
        return self.registered or self.flash


def attention_plugins(mod: TrtModule, precision: str, options: BuildOptions) -> AttentionPlugins:
    from trtforge.backends.plugin_libraries import plugin_registered
    from trtforge.fusion.plugins import FLASH_CORE_VERSION, FLASH_PLUGIN, FLASH_VERSION, PLUGIN, PLUGIN_VERSION, backend_route

    route = backend_route(mod.flavour, mod.version)
    if not (options.fuse_attention != "off" and route.kind == "plugin" and precision in ("fp16", "best")):
        return AttentionPlugins(False, False, False)
    return AttentionPlugins(
        plugin_registered(mod, PLUGIN, PLUGIN_VERSION),
        plugin_registered(mod, FLASH_PLUGIN, FLASH_VERSION),
        plugin_registered(mod, FLASH_PLUGIN, FLASH_CORE_VERSION),
    )


def observing_passes(mod: TrtModule, precision: str, options: BuildOptions) -> list[ElementwisePass]:
    """The elementwise passes that will observe tensors in this build (on, applicable and their plugin registered)."""
    from trtforge.backends.plugin_libraries import plugin_registered
    from trtforge.fusion.step import elementwise_skip

    return [
        spec
        for spec in ELEMENTWISE_PASSES
        if spec.observed_names is not None
        and getattr(options, f"fuse_{spec.key}") != "off"
        and elementwise_skip(spec, getattr(options, f"fuse_{spec.key}"), precision, mod.flavour, mod.version, True) is None
        and plugin_registered(mod, spec.plugin, spec.version)
    ]


def shared_observation(
    mod: TrtModule,
    model: onnx.ModelProto,
    precision: str,
    options: BuildOptions,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    profiles: list[Profile],
) -> Observation | None:
    """One observation of the graph before fusion for the attention and elementwise passes that will verify on it (one
    ONNX Runtime session and run instead of one per pass), on unpadded random feeds at observation_sizes; None where
    no pass observes."""
    from trtforge.fusion.attention import observed_names as attention_names
    from trtforge.fusion.index import Observation
    from trtforge.fusion.step import observation_sizes, unpadded

    wanted = attention_names(model) if attention_plugins(mod, precision, options).any else set()
    observing = observing_passes(mod, precision, options)
    for spec in observing:
        wanted |= spec.observed_names(model) if spec.observed_names is not None else set()
    if not wanted and not observing:
        return None
    return Observation(model, unpadded(random_feeds(specs, observation_sizes(axes, profiles))), wanted)


def fuse_attention(
    mod: TrtModule,
    identity: dict[str, Any],
    model: onnx.ModelProto,
    precision: str,
    options: BuildOptions,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    profiles: list[Profile],
    onnx_path: Path,
    observation: Observation | None = None,
) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    """Run trtforge.fusion's attention pass for this TensorRT and GPU: (fused model or None, sidecar record).
    observation: shared_observation's for `model`, else the pass observes on feeds of its own."""
    from trtforge.backends.plugin_libraries import plugin_registered
    from trtforge.fusion.step import attention_fusion, observation_sizes

    plugins = attention_plugins(mod, precision, options)
    registered, flash, flash_core = plugins.registered, plugins.flash, plugins.flash_core
    feeds = None
    if plugins.any:
        feeds = observation.feeds if observation is not None else random_feeds(specs, observation_sizes(axes, profiles))
    projection = options.qkv_projection
    if projection == "auto":  # matmul where TrtforgeGemm will take the packed projection, else conv
        from trtforge.fusion.step import GEMM_PASS, qkv_gemm_applies, resolve_qkv_projection

        registered_gemm = precision == "fp16" and plugin_registered(mod, GEMM_PASS.plugin, GEMM_PASS.version)
        projection = resolve_qkv_projection(
            projection, qkv_gemm_applies(options.fuse_gemm, precision, mod.flavour, mod.version, registered_gemm)
        )
    fused, record = attention_fusion(
        model,
        options.fuse_attention,
        precision,
        mod.flavour,
        mod.version,
        identity.get("compute_capability"),
        registered,
        feeds,
        onnx_path.name,
        projection,
        flash_registered=flash,
        flash_core_registered=flash_core,
        observation=observation if plugins.any else None,
    )
    record["qkv_projection_choice"] = options.qkv_projection
    return fused, record


def fuse_elementwise(
    mod: TrtModule,
    model: onnx.ModelProto,
    observe_model: onnx.ModelProto,
    precision: str,
    options: BuildOptions,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    profiles: list[Profile],
    onnx_path: Path,
    refused: dict[str, str] | None = None,
    observation: Observation | None = None,
) -> tuple[onnx.ModelProto | None, dict[str, dict[str, Any]]]:
    """trtforge.fusion's elementwise plugin passes in order (bias+GELU, then skip-LayerNorm; --fuse-gelu,
    --fuse-skip-layernorm auto|on|off), each on the previous one's graph: (fused model or None, sidecar record per
    pass). `refused`: passes that auto must leave out this time, with the reason (a fused graph that failed to build).
    observation: shared_observation's for observe_model, else the passes observe on feeds of their own."""
    from trtforge.backends.plugin_libraries import plugin_registered
    from trtforge.fusion.step import elementwise_fusion, elementwise_skip, observation_sizes

    current, records, feeds = None, {}, None
    for spec in ELEMENTWISE_PASSES:
        mode = getattr(options, f"fuse_{spec.key}")
        if (refused or {}).get(spec.key) and mode == "auto":
            records[spec.key] = {"mode": mode, "route": "none", "why": refused[spec.key], "replaced": [], "refused": []}
            continue
        wants = mode != "off" and elementwise_skip(spec, mode, precision, mod.flavour, mod.version, True) is None
        registered = plugin_registered(mod, spec.plugin, spec.version) if wants else False
        if wants and registered and feeds is None:
            feeds = observation.feeds if observation is not None else random_feeds(specs, observation_sizes(axes, profiles))
        fuse_options = (
            {kw: plugin_registered(mod, name, version) for kw, name, version in spec.optional_plugins} if wants and registered else {}
        )
        fused, records[spec.key] = elementwise_fusion(
            spec,
            current if current is not None else model,
            observe_model,
            mode,
            precision,
            mod.flavour,
            mod.version,
            registered,
            feeds if wants and registered else None,
            onnx_path.name,
            fuse_options,
            observation if observation is not None and observation.model is observe_model else None,
        )
        current = fused if fused is not None else current
    return current, records


def attention_evidence(
    sidecar: dict[str, Any], layers: list[dict[str, Any]] | None, profiles: int, output: Path, warn: Callable[[str], None]
) -> None:
    """The engine's fused-attention layers against the graph's attentions (fusion/engine_evidence.py), into the
    sidecar's attention_fusion["engine"]; a warning where an fp16 or best engine left some unfused."""
    from trtforge.fusion.engine_evidence import attention_evidence, shortfall_warning

    record = sidecar.get("attention_fusion")
    if not record:
        return
    record["engine"] = attention_evidence(record, layers, profiles, sidecar.get("layer_info_unavailable"))
    message = shortfall_warning(record, sidecar["precision"], output.name)
    if message:
        warn(message)
