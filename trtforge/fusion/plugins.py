"""What fused attention the installed TensorRT runs, as a pure table keyed by TensorRT version and GPU SM.

Read from TensorRT 8.6.1's plugin sources (plugin/bertQKVToContextPlugin, qkvToContext.cu):
- `CustomQKVToContextPluginDynamic` v1 (fixed length) runs its fused fp16 kernel on sm_90 only for
  seq 64/96/128/384 and needs EmbLayerNorm's packed mask format; any other length falls back to the
  plugin's own cuBLAS path (cuBLAS is what trtforge keeps off on 8.6). Not used.
- v2 with `var_seqlen=1` runs `FusedMHARunnerFP16v2` on sm 72/75/80/86/87/89/90 for every length up to
  512 (rounded up to 64/96/128/256/384/512), head sizes up to 64 (padded to 32 or 64 by the plugin,
  which then scales by 1/sqrt(padded size)); sm_90 ships only head-64 kernels. Inputs: packed QKV
  [tokens, 3E, 1, 1] with each head's q, k, v adjacent, a dummy mask, cu_seqlens [B+1] (int32) and a
  dummy whose length is the max sequence. Sequences are contiguous, so a batch row cannot carry
  padding: the engine is unmasked and `run` refuses a padded attention_mask for it.
- No plugin of TensorRT 8.6's library applies a causal mask (fMHA_V2 and fMHCA are unmasked, bidirectional):
  without TrtforgeFlashAttention, decoders keep TensorRT's own layers.
- trtforge's own `TrtforgeFlashAttention` v1 (trtforge/native/sdpa_plugin.cpp, built into libtrtforge_plugins.so by
  `trtforge plugins build`, which `build` then loads by default): cuDNN 9's flash attention (SDPA) behind the same packed-QKV input, for
  sm_80 and newer, head sizes that are multiples of 8 up to 128, any sequence length, bidirectional or causal.
  Where it is registered it is preferred: v2 has an sm_90 kernel (docs/performance.md#fusion-passes-auto-modes).
- TensorRT 10+ (and TensorRT-RTX) fuse multi-head attention themselves (Myelin MHA fusion, later
  IAttention): the pass leaves those graphs as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

PLUGIN = "CustomQKVToContextPluginDynamic"
PLUGIN_VERSION = "2"
FLASH_PLUGIN = "TrtforgeFlashAttention"
FLASH_VERSION = "1"  # packed QKV [tokens, 3E, 1, 1] (the projection fused in front)
FLASH_CORE_VERSION = "2"  # separate Q, K, V [B, H, S, D], grouped-query heads, diagonal band, optional bias
FLASH_MIN_SM = 80  # cuDNN's fused flash attention: Ampere and newer
FLASH_MAX_HEAD = 128
PLUGIN_DOMAIN = "trt.plugins"
MAX_SEQ = 512
V2_SMS = (72, 75, 80, 86, 87, 89, 90)
# SMs with fp16 kernels for a head padded to 32 (fused_multihead_attention_v2_fp16_*_32_kernel.sm*).
HEAD32_SMS = (75, 80)


@dataclass(frozen=True)
class Route:
    kind: str  # "plugin" | "native" | "none"
    reason: str
    padded_head: int | None = None  # the head size the plugin's kernel runs (and scales by)
    plugin: str = PLUGIN  # which plugin node the pass writes (PLUGIN or FLASH_PLUGIN)


def _major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except (TypeError, ValueError):
        return None


def backend_route(flavour: str | None, version: str | None) -> Route:
    """The route a TensorRT takes before looking at any one attention."""
    major = _major(version)
    if flavour == "tensorrt_rtx" or (major is not None and major >= 10):
        return Route("native", f"{flavour or 'tensorrt'} {version} fuses attention itself; the graph is left as exported")
    if major == 8:
        return Route("plugin", f"TensorRT {version}: {PLUGIN} v{PLUGIN_VERSION} (var_seqlen) from the plugin library")
    return Route("none", f"no fused-attention route is known for TensorRT {version}")


def flash_refusal(sm: int | None, head_size: int) -> str | None:
    """Why TrtforgeFlashAttention cannot take an attention on this GPU, or None when it can."""
    if sm is None:
        return "the GPU's compute capability is unknown (no GPU here); cuDNN's flash attention needs sm_80 or newer"
    if sm < FLASH_MIN_SM:
        return f"{FLASH_PLUGIN} (cuDNN flash attention) needs sm_{FLASH_MIN_SM} or newer, not sm_{sm}"
    if head_size % 8 or head_size > FLASH_MAX_HEAD:
        return f"head size {head_size}: {FLASH_PLUGIN} takes multiples of 8 up to {FLASH_MAX_HEAD}"
    return None


def attention_route(
    flavour: str | None, version: str | None, sm: int | None, head_size: int, max_seq: int | None, causal: bool, flash: bool = False
) -> Route:
    """Which route one attention takes, or why none: pure, so every refusal is testable without TensorRT.
    flash: TrtforgeFlashAttention is registered (libtrtforge_plugins loaded); it is preferred where it applies."""
    base = backend_route(flavour, version)
    if base.kind != "plugin":
        return base
    if flash and flash_refusal(sm, head_size) is None:
        return Route(
            "plugin",
            f"TensorRT {version}: {FLASH_PLUGIN} v{FLASH_VERSION} (cuDNN flash attention, libtrtforge_plugins)",
            head_size,
            FLASH_PLUGIN,
        )
    if causal:
        why = flash_refusal(sm, head_size) if flash else f"load libtrtforge_plugins for {FLASH_PLUGIN}"
        return Route("none", f"causal attention: TensorRT {version}'s plugin library has no causal fused-attention kernel ({why})")
    if sm is None:
        return Route("none", "the GPU's compute capability is unknown (no GPU here); the plugin's kernels depend on it")
    if sm not in V2_SMS:
        return Route("none", f"{PLUGIN} v{PLUGIN_VERSION} has no fused kernels for sm_{sm}")
    if head_size > 64:
        return Route("none", f"head size {head_size} > 64: {PLUGIN} has no kernel for it")
    padded = 32 if head_size <= 32 else 64
    if padded == 32 and sm not in HEAD32_SMS:
        return Route(
            "none",
            f"head size {head_size} (padded to 32): TensorRT {version} ships head-32 kernels only for "
            f"sm_{', sm_'.join(map(str, HEAD32_SMS))}, not sm_{sm}",
        )
    if max_seq is None or max_seq > MAX_SEQ:
        return Route("none", f"sequences up to {max_seq} exceed the plugin's {MAX_SEQ}; build with tiers that stop at {MAX_SEQ}")
    return Route("plugin", base.reason, padded)
