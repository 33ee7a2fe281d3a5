"""`trtforge build`: ONNX to a TensorRT engine with tiered profiles, fusions and precision gates."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.cli import render
from trtforge.core import ui
from trtforge.core.errors import GateFailed as GateFailedError
from trtforge.core.errors import UserError


def build(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="A cleaned ONNX, or the .int8.onnx from calibrate."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Engine path (default NAME.PRECISION.engine)."),
    precision: Optional[str] = typer.Option(
        None,
        "--precision",
        "-p",
        callback=opt.config_key("build.precision", "--precision"),
        help="fp32|fp16|int8|best (default: int8 for a Q/DQ model, else the config's, else fp32).",
    ),
    tiers: Optional[str] = typer.Option(None, "--tiers", help="'128,256,512' (sequence axis), 'seq=128,512;batch=8,32' or 'auto'."),
    tier_count: int = typer.Option(
        3, "--tier-count", callback=opt.between(1, 16, "--tier-count"), help="How many tiers --tiers auto derives."
    ),
    lengths: Optional[Path] = typer.Option(
        None, "--lengths", callback=opt.existing_file("--lengths"), help="Real lengths for --tiers auto, one integer per line."
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config whose 'build' section gives defaults."),
    backend: str = typer.Option(
        "auto",
        "--backend",
        callback=opt.one_of(opt.BACKENDS, "--backend"),
        help="auto (tensorrt, else tensorrt_rtx), tensorrt or tensorrt_rtx.",
    ),
    workspace_mb: Optional[int] = typer.Option(
        None, "--workspace-mb", callback=opt.config_key("build.workspace_mb", "--workspace-mb"), help="Builder workspace limit in MiB."
    ),
    optimization_level: Optional[int] = typer.Option(
        None,
        "--optimization-level",
        callback=opt.config_key("build.optimization_level", "--optimization-level"),
        help="Builder optimization level 0-5.",
    ),
    timing_cache: Optional[Path] = typer.Option(None, "--timing-cache", help="Load and save this timing cache (no-op on TensorRT-RTX)."),
    tactic_sources: Optional[str] = typer.Option(None, "--tactic-sources", help="As trtexec: '-CUBLAS,-CUBLAS_LT,-CUDNN'."),
    hardware_compatibility: Optional[str] = typer.Option(
        None,
        "--hardware-compatibility",
        callback=opt.config_key("build.hardware_compatibility", "--hardware-compatibility"),
        help="none|ampere_plus|same_compute_capability.",
    ),
    version_compatible: Optional[bool] = typer.Option(None, "--version-compatible/--no-version-compatible"),
    compute_capability: Optional[list[str]] = typer.Option(
        None, "--compute-capability", help="TensorRT-RTX targets, e.g. SM89 (repeatable)."
    ),
    tf32: bool = typer.Option(False, "--tf32", help="Allow TF32 for fp32 math (faster, ~1e-3 rel-L2); off means IEEE fp32."),
    fuse_attention: Optional[str] = typer.Option(
        None,
        "--fuse-attention",
        callback=opt.config_key("build.fuse_attention", "--fuse-attention"),
        help="auto|on|off: replace attention by a fused plugin where this TensorRT has one (auto: only where it runs).",
    ),
    fuse_gelu: Optional[str] = typer.Option(
        None,
        "--fuse-gelu",
        callback=opt.config_key("build.fuse_gelu", "--fuse-gelu"),
        help="auto|on|off: replace bias+GELU by TensorRT 8.x's GELU plugin (tanh form; auto: fp16 builds, where it was measured faster).",
    ),
    fuse_skip_layernorm: Optional[str] = typer.Option(
        None,
        "--fuse-skip-layernorm",
        callback=opt.config_key("build.fuse_skip_layernorm", "--fuse-skip-layernorm"),
        help="auto|on|off: replace residual add (+ dense bias) + LayerNorm by TensorRT 8.x's skip-LayerNorm plugin (auto: fp16 and INT8 best builds, where it was measured faster).",
    ),
    fuse_gemm: Optional[str] = typer.Option(
        None,
        "--fuse-gemm",
        callback=opt.config_key("build.fuse_gemm", "--fuse-gemm"),
        help="auto|on|off: replace the fp16 MatMuls by a constant weight (+ bias) that other passes left by trtforge's TrtforgeGemm (cuBLASLt, its kernel timed per shape; needs libtrtforge_plugins; auto: fp16 builds, where it measured faster: docs/performance.md).",
    ),
    qkv_projection: Optional[str] = typer.Option(
        None,
        "--qkv-projection",
        callback=opt.config_key("build.qkv_projection", "--qkv-projection"),
        help="auto|conv|matmul: how the attention pass writes the packed QKV projection (conv: a 1x1 convolution on [tokens, E, 1, 1], no reshape copy before the plugin; matmul: a MatMul the GEMM pass can take into TrtforgeGemm; auto, the default: matmul where it will, else conv).",
    ),
    plugin_library: Optional[list[str]] = typer.Option(
        None,
        "--plugin-library",
        help="A shared library of TensorRT plugin creators to load first (repeatable); default: the libtrtforge_plugins.so that `trtforge plugins build` cached for this TensorRT and GPU, if any (cuDNN flash attention, cuBLASLt GEMMs); 'none': load none.",
    ),
    gemm_precision: Optional[str] = typer.Option(
        None,
        "--gemm-precision",
        callback=opt.config_key("build.gemm_precision", "--gemm-precision"),
        help="fp16|fp8: the GEMM plugins' arithmetic in an fp16 build (fp8: e4m3 operands with per-tensor scales, TrtforgeGemmFp8; compute capability 8.9+; gated on the engine by --fp8-min-cosine).",
    ),
    fp8_min_cosine: Optional[float] = typer.Option(
        None,
        "--fp8-min-cosine",
        callback=opt.config_key("build.fp8_min_cosine", "--fp8-min-cosine"),
        help="With --gemm-precision fp8: the engine's held-out mean cosine against ONNX Runtime fp32 must reach this (default 0.99), else exit 1.",
    ),
    fp8_min_top1_agreement: Optional[float] = typer.Option(
        None,
        "--fp8-min-top1-agreement",
        callback=opt.config_key("build.fp8_min_top1_agreement", "--fp8-min-top1-agreement"),
        help="With --gemm-precision fp8: the engine's top-1 agreement with ONNX Runtime fp32 on each logits output must reach this, else exit 1 (default: reported, not gated).",
    ),
    calib_data: Optional[str] = typer.Option(
        None,
        "--calib-data",
        help="A folder of real inputs (calibrate's formats; its first 16 samples are used) for the magnitudes the fp16 conversion guards and FP8's scales and gate (default: the data of a calibration cache beside the model, else random feeds).",
    ),
    fp8_chain_ffn: Optional[str] = typer.Option(
        None,
        "--fp8-chain-ffn",
        callback=opt.config_key("build.fp8_chain_ffn", "--fp8-chain-ffn"),
        help="auto|on|off: with --gemm-precision fp8, FC1 writes e4m3 straight into FC2 where FC2 alone reads it (no fp16 FFN activation, no conversion; auto, the default: wherever such a pair exists; on: a model without one is an error).",
    ),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Build a TensorRT engine with tiered optimization profiles; write ENGINE and ENGINE.json."""
    from trtforge.build.step import build as build_step
    from trtforge.build.step import model_traits, options_from_config
    from trtforge.core.config import BuildSection, load_config
    from trtforge.core.onnxio import load_onnx

    section = load_config(config).build if config else BuildSection()
    if precision is None:
        precision = "int8" if model_traits(load_onnx(onnx_path, load_external_data=False))[1] else (section.precision if config else "fp32")
    options = options_from_config(
        section,
        workspace_mb=workspace_mb,
        optimization_level=optimization_level,
        timing_cache=timing_cache,
        tactic_sources=tactic_sources,
        hardware_compatibility=hardware_compatibility,
        version_compatible=version_compatible,
        compute_capabilities=compute_capability or None,
        tf32=tf32,
        fuse_attention=fuse_attention,
        fuse_gelu=fuse_gelu,
        fuse_skip_layernorm=fuse_skip_layernorm,
        fuse_gemm=fuse_gemm,
        qkv_projection=qkv_projection,
        plugin_libraries=plugin_library or None,
        gemm_precision=gemm_precision,
        fp8_min_cosine=fp8_min_cosine,
        fp8_chain_ffn=fp8_chain_ffn,
        fp8_min_top1_agreement=fp8_min_top1_agreement,
        calib_data=calib_data,
    )
    if options.hardware_compatibility not in ("none", "ampere_plus", "same_compute_capability"):
        raise UserError(
            f"--hardware-compatibility '{options.hardware_compatibility}' is not one of none, ampere_plus, same_compute_capability."
        )
    with ui.build_progress(f"building {Path(onnx_path).name}") as tick:
        result = build_step(
            onnx_path,
            output,
            precision,
            tiers,
            section.tiers,
            backend,
            options,
            lengths,
            tier_count,
            on_tick=tick,
            tick_s=ui.heartbeat_interval(),
            warn=ui.warn,
        )
    if json_out:
        ui.print_json({"path": str(result.engine_path), **result.sidecar})
    else:
        render.engine(result.sidecar, result.engine_path, result.layer_summary)
        render.engine_check(result.sidecar.get("engine_check"))
    check = result.sidecar.get("engine_check") or {}
    if check.get("status") == "failed":
        raise GateFailedError("; ".join(check["failures"]) + ".")
