"""The `trtforge` command line: parse, call the API, render. No pipeline logic lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from trtforge import __version__, ui
from trtforge.artifacts import published
from trtforge.errors import INTERNAL_ERROR, INTERRUPTED, TrtforgeError, UserError, exception_summary
from trtforge.errors import GateFailed as GateFailedError
from trtforge.plugins_cli import plugins_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="PyTorch to a validated TensorRT engine: export, clean, calibrate, build, run.",
)
app.add_typer(plugins_app, name="plugins")

JsonOpt = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


# -- option checks: each value is checked when parsed, with the sentence its config key would get -----------------


def _key(dotted: str, flag: str):
    """A typer callback checking a flag's value against its config key's constraints (trtforge.config.check_option)."""

    def check(value):
        if value is None:
            return None
        from trtforge.config import check_option

        return check_option(dotted, value, flag)

    return check


def _at_least(low: float, flag: str):
    """A typer callback: the value must be >= low (None: not given)."""

    def check(value):
        if value is not None and value < low:
            raise UserError(f"{flag} must be at least {low:g}, got {value:g}.")
        return value

    return check


def _between(low: float, high: float, flag: str):
    def check(value):
        if value is not None and not low <= value <= high:
            raise UserError(f"{flag} must be between {low:g} and {high:g}, got {value:g}.")
        return value

    return check


def _one_of(choices: tuple[str, ...], flag: str):
    def check(value):
        if value is not None and value not in choices:
            raise UserError(f"{flag} must be one of {', '.join(choices)}, got '{value}'.")
        return value

    return check


def _folder(flag: str):
    """A typer callback: an output folder that is a folder or can be created (no file in the way)."""

    def check(value):
        if value is None:
            return None
        probe = Path(value)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise UserError(f"{flag} {value}: {probe} is a file, not a folder; choose another folder.")
        return value

    return check


def _existing_file(flag: str):
    def check(value):
        if value is not None and not Path(value).is_file():
            what = "a folder, not a file" if Path(value).is_dir() else "does not exist"
            raise UserError(f"{flag} {value} {what}; pass an existing file.")
        return value

    return check


def _providers(values):
    """--provider: each must be one ONNX Runtime offers here; an unavailable one would silently run on the CPU."""
    if not values:
        return values
    try:
        import onnxruntime as ort
    except ImportError:
        raise UserError("--provider needs onnxruntime; install it (pip install onnxruntime).") from None
    available = ort.get_available_providers()
    for name in values:
        if name not in available:
            raise UserError(
                f"--provider {name} is not offered by this onnxruntime (it offers {', '.join(available)}); "
                "pick one of those or install the onnxruntime build that has it."
            )
    return values


def _step(flag: str):
    """--from/--only: a pipeline step, checked before the config is read (Pipeline.execute says the same)."""

    def check(value):
        from trtforge.pipeline import STEPS

        if value is not None and value not in STEPS:
            raise UserError(f"{flag} '{value}' is not a step; use one of {', '.join(STEPS)}.")
        return value

    return check


BACKENDS = ("auto", "tensorrt", "tensorrt_rtx")


def _resolve_config(model: Optional[str], config: Optional[Path]):
    """The config from --config, else the built-in one for a built-in --model, else None."""
    from trtforge.config import apply_overrides, load_config
    from trtforge.models import BUILTIN_NAMES, builtin_config_path

    if config is not None:
        cfg = load_config(config)
        return apply_overrides(cfg, {"model.source": model}) if model else cfg
    if model is None:
        raise UserError("no model given; pass --model NAME|file.py:factory|file.pt2 or --config configs/NAME.yaml.")
    if model in BUILTIN_NAMES:
        return load_config(builtin_config_path(model))
    return None


@app.command()
def export(
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Built-in name (minilm, tiny-fcn), file.py:factory, "
        "TorchScript .pt/.ts (needs --config: its 'inputs' are passed positionally, in order) or .pt2.",
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (configs/NAME.yaml)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output ONNX path (default out/NAME.onnx)."),
    opset: Optional[int] = typer.Option(None, "--opset", callback=_key("export.opset", "--opset"), help="ONNX opset (default 17)."),
    exporter: Optional[str] = typer.Option(
        None, "--exporter", callback=_key("export.exporter", "--exporter"), help="legacy (TorchScript-based) or dynamo."
    ),
    external_data: Optional[bool] = typer.Option(None, "--external-data/--no-external-data", help="Force weights into NAME.onnx.data."),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the ONNX Runtime vs PyTorch check (the sidecar records it)."),
    kv_cache: bool = typer.Option(
        False, "--kv-cache", help="Causal decoder with explicit past/present key-value tensors per layer (config: kv_cache)."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Export a PyTorch model to ONNX and check it against PyTorch at >= 2 sizes of every dynamic axis."""
    from trtforge import kvcache

    if kv_cache or kvcache.config_wants_kv(config):
        return kvcache.export_command(model, config, output, opset, exporter, external_data, not no_check, json_out)
    from trtforge.config import ModelConfig, apply_overrides
    from trtforge.export import export_model, specs_from_examples
    from trtforge.models import load_model

    cfg = _resolve_config(model, config)
    if cfg is None:  # a user model without a config: specs from its example inputs
        loaded = load_model(model)
        specs, axes = specs_from_examples(loaded)
        name = model.rpartition(":")[2] if ".py:" in model else Path(model).stem  # the factory's name
        cfg = ModelConfig(name=name, model={"source": model}, inputs=specs, axes=axes, outputs=loaded.output_names)
    cfg = apply_overrides(cfg, {"export.opset": opset, "export.exporter": exporter, "export.external_data": external_data})
    output = output or Path("out") / f"{cfg.name}.onnx"
    result = export_model(cfg, output, check=not no_check)
    if json_out:
        ui.print_json({"path": str(result.path), **result.sidecar})
        return
    con = ui.console()
    rows = [[c.axis, c.size, name, m["rel_l2"], m["max_abs"]] for c in result.checks for name, m in c.metrics.items()]
    con.print(ui.table("ONNX Runtime vs PyTorch, one dynamic axis varied at a time", ["axis", "size", "output", "rel-L2", "max-abs"], rows))
    con.print(f"wrote {result.path} (opset {cfg.export.opset}, {cfg.export.exporter} exporter) in {result.seconds:.1f} s")


@app.command()
def clean(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="The exported model."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Default: NAME.clean.onnx beside the input."),
    fold_size_limit_mb: float = typer.Option(
        64.0,
        "--fold-size-limit-mb",
        callback=_key("clean.fold_size_limit_mb", "--fold-size-limit-mb"),
        help="Do not fold constants larger than this.",
    ),
    tolerance: float = typer.Option(
        1e-5, "--tolerance", callback=_key("clean.tolerance", "--tolerance"), help="Max rel-L2 between the original and cleaned outputs."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Fold constants, drop dead nodes, Identity and Dropout, infer shapes, sort; prove outputs unchanged."""
    from trtforge.graph import clean_file

    result = clean_file(onnx_path, output, fold_size_limit_mb, tolerance)
    if json_out:
        ui.print_json(
            {"path": str(result.path), **result.sidecar, "ops_before": dict(result.before.ops), "ops_after": dict(result.after.ops)}
        )
        return
    con = ui.console()
    ops = sorted(set(result.before.ops) | set(result.after.ops), key=lambda o: -result.before.ops.get(o, 0))
    rows = [[op, result.before.ops.get(op, 0), result.after.ops.get(op, 0)] for op in ops]
    rows.append(["nodes (total)", result.before.nodes, result.after.nodes])
    rows.append(["initializer MB", result.before.initializer_bytes / 1e6, result.after.initializer_bytes / 1e6])
    con.print(ui.table(f"clean {onnx_path.name}", ["op type", "before", "after"], rows))
    for rewrite, nodes in result.sidecar["rewritten"].items():
        if nodes:
            con.print(f"rewrote {len(nodes)} node(s) for TensorRT's parser ({rewrite}): {', '.join(nodes)}")
    worst = ", ".join(f"{k} rel-L2 {v:.1e}" for k, v in result.rel_l2.items())
    con.print(f"ONNX Runtime at two shapes: {worst} (gate {tolerance:.0e}); wrote {result.path}")


@app.command()
def calibrate(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="The cleaned ONNX (trtforge clean)."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="Calibration folder: .npy/.npz, .txt/.jsonl, images or .wav."),
    method: Optional[str] = typer.Option(
        None, "--method", callback=_key("calibrate.method", "--method"), help="entropy (TensorRT's KL search), percentile or minmax."
    ),
    percentile: Optional[float] = typer.Option(
        None, "--percentile", callback=_key("calibrate.percentile", "--percentile"), help="For --method percentile (default 99.99)."
    ),
    smooth: Optional[float] = typer.Option(
        None,
        "--smooth",
        callback=_key("calibrate.smooth", "--smooth"),
        help="SmoothQuant alpha in [0, 1] (migrates activation outliers into weights).",
    ),
    no_smooth: bool = typer.Option(False, "--no-smooth", help="Turn off SmoothQuant even if the config sets it."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", help="Held-out folder for the accuracy check (default: the config's)."),
    max_samples: Optional[int] = typer.Option(
        None, "--max-samples", callback=_key("calibrate.max_samples", "--max-samples"), help="Use at most this many calibration samples."
    ),
    max_eval_samples: Optional[int] = typer.Option(
        None, "--max-eval-samples", callback=_at_least(1, "--max-eval-samples"), help="Use at most this many held-out samples."
    ),
    min_cosine: Optional[float] = typer.Option(
        None,
        "--min-cosine",
        callback=_key("calibrate.min_cosine", "--min-cosine"),
        help="Gate: mean cosine of pooled outputs to fp32 (default 0.99).",
    ),
    min_int8_flops: Optional[float] = typer.Option(
        None,
        "--min-int8-flops",
        callback=_key("calibrate.min_int8_flops", "--min-int8-flops"),
        help="Floor on the GEMM FLOPs fraction left in INT8 (default 0.8).",
    ),
    min_top1_agreement: Optional[float] = typer.Option(
        None,
        "--min-top1-agreement",
        callback=_key("calibrate.min_top1_agreement", "--min-top1-agreement"),
        help="Gate: top-1 agreement of logits outputs on held-out data.",
    ),
    min_pixel_agreement: Optional[float] = typer.Option(
        None,
        "--min-pixel-agreement",
        callback=_key("calibrate.min_pixel_agreement", "--min-pixel-agreement"),
        help="Gate: per-pixel argmax agreement of dense outputs on held-out data.",
    ),
    no_fallback: bool = typer.Option(False, "--no-fallback", help="Quantize every layer; do not keep sensitive ones in float."),
    quantize_attention: bool = typer.Option(
        False,
        "--quantize-attention",
        help="Also quantize attention's batched MatMuls (QK^T, softmax.V); TensorRT 8.6 computes them wrongly.",
    ),
    strict_cache: bool = typer.Option(
        False, "--strict-cache", help="Fail (exit 2) instead of recalibrating when the cache does not match."
    ),
    from_cache: Optional[Path] = typer.Option(
        None, "--from-cache", callback=_existing_file("--from-cache"), help="Import a TensorRT calibration cache written elsewhere."
    ),
    compare_methods: bool = typer.Option(False, "--compare-methods", help="Run entropy, percentile and minmax side by side."),
    no_engine_check: bool = typer.Option(
        False, "--no-engine-check", help="Do not re-check the gate on a TensorRT engine (done where an engine can execute)."
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config whose 'calibrate' section gives defaults."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="The Q/DQ ONNX (default NAME.int8.onnx); the cache goes beside it."),
    ray: Optional[str] = typer.Option(
        None,
        "--ray",
        help="Collect activations on Ray actors: 'auto' (a local cluster, or the one RAY_ADDRESS names) or a cluster address; same cache as one process.",
    ),
    ray_actors: Optional[int] = typer.Option(
        None,
        "--ray-actors",
        callback=_at_least(1, "--ray-actors"),
        help="With --ray: actors to start (default: one per CPU of the cluster).",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Calibrate INT8 scales, write a TensorRT calibration cache + sidecar and a Q/DQ ONNX, check accuracy."""
    from trtforge.calibrate.step import calibrate as calibrate_step
    from trtforge.calibrate.step import gate_failures, options_from_section
    from trtforge.config import CalibrateSection, load_config
    from trtforge.errors import GateFailed

    if ray_actors is not None and not ray:
        raise UserError(f"--ray-actors {ray_actors} applies with --ray (actors on a Ray cluster); add --ray auto or drop it.")
    section = load_config(config).calibrate if config else _builtin_section(onnx_path, "calibrate") or CalibrateSection()
    options = options_from_section(
        section,
        data=data,
        method=method,
        percentile=percentile,
        max_samples=max_samples,
        eval_data=eval_data,
        max_eval_samples=max_eval_samples,
        min_cosine=min_cosine,
        min_int8_flops=min_int8_flops,
        min_top1_agreement=min_top1_agreement,
        min_pixel_agreement=min_pixel_agreement,
        fallback=False if no_fallback else None,
        strict_cache=strict_cache or None,
        from_cache=from_cache,
        output=output,
        quantize_attention=quantize_attention or None,
        ray=ray,
        ray_actors=_positive(ray_actors, "--ray-actors"),
    )
    options.engine_check = not no_engine_check
    if no_smooth:
        options.smooth = None
    elif smooth is not None:
        options.smooth = smooth
    if options.smooth is not None and not 0.0 <= options.smooth <= 1.0:
        raise UserError(f"--smooth must be between 0 and 1, got {options.smooth}.")
    log = (lambda msg: None) if json_out else (lambda msg: ui.console(stderr=True).print(msg, markup=False))
    if options.ray:
        from trtforge.scaleout.pool import connect

        connect(options.ray)  # once for both collection passes (SmoothQuant's and the histograms')
    with ui.progress("calibrating", None) as bar:
        result = calibrate_step(onnx_path, options, compare_methods, progress=log, progress_bar=bar)
    side = result.sidecar
    acc = side["accuracy"] or {}
    if json_out:
        ui.print_json({"path": str(result.int8_path), **side})
    else:
        con = ui.console()
        con.print(("reused cache: " if result.reused else "calibrated: ") + result.reason)
        rows = [
            [r.method, r.accuracy.mean_cosine, r.accuracy.min_cosine, r.int8_flops_fraction, len(r.float_nodes)]
            for r in (result.comparison or [result.result])
            if r.accuracy
        ]
        con.print(
            ui.table(
                "held-out accuracy of the INT8 model vs fp32 (mean-pooled outputs)",
                ["method", "mean cosine", "min cosine", "INT8 GEMM FLOPs", "layers kept float"],
                rows,
            )
        )
        kinds = acc.get("output_kinds", {})
        per = [
            [
                name,
                kinds.get(name) or "?",
                m["rel_l2"],
                m["cosine"],
                m["min_item_cosine"],
                m.get("top1_agreement", m.get("pixel_agreement", "-")),
            ]
            for name, m in acc.get("per_output", {}).items()
        ]
        con.print(ui.table("per output", ["output", "kind", "rel-L2", "cosine", "min item cosine", "top-1 / pixel agr."], per))
        con.print(f"wrote {result.cache_path}, {result.cache_path}.json and {result.int8_path} in {result.seconds:.1f} s")
        _render_engine_check(side.get("engine_check"))
    failures = gate_failures(side, options)
    if failures:
        raise GateFailed("; ".join(failures) + ".")


def _render_engine_check(check: Optional[dict]) -> None:
    """The engine re-check: ORT and engine figures side by side, or the line saying why it was skipped."""
    from trtforge.calibrate.engine_check import render_lines

    con = ui.console()
    if check and check.get("rows"):
        con.print(
            ui.table(
                check.get("title") or "held-out accuracy: ONNX Runtime (Q/DQ ONNX) vs the TensorRT engine",
                ["metric", "ONNX Runtime", "engine", "gate"],
                [[("-" if v is None else v) for v in r] for r in check["rows"]],
            )
        )
    for line in render_lines(check):
        con.print(line, markup=False)


def _builtin_section(onnx_path: Path, section: str):
    """The built-in config's section for a model exported from a built-in (by its sidecar), else None."""
    from trtforge.artifacts import read_sidecar
    from trtforge.config import load_config
    from trtforge.models import BUILTIN_NAMES, builtin_config_path

    try:
        side = read_sidecar(onnx_path, required=False) or {}
    except UserError:
        return None
    source = side.get("source")
    return getattr(load_config(builtin_config_path(source)), section) if source in BUILTIN_NAMES else None


@app.command()
def build(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="A cleaned ONNX, or the .int8.onnx from calibrate."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Engine path (default NAME.PRECISION.engine)."),
    precision: Optional[str] = typer.Option(
        None,
        "--precision",
        "-p",
        callback=_key("build.precision", "--precision"),
        help="fp32|fp16|int8|best (default: int8 for a Q/DQ model, else the config's, else fp32).",
    ),
    tiers: Optional[str] = typer.Option(None, "--tiers", help="'128,256,512' (sequence axis), 'seq=128,512;batch=8,32' or 'auto'."),
    tier_count: int = typer.Option(
        3, "--tier-count", callback=_between(1, 16, "--tier-count"), help="How many tiers --tiers auto derives."
    ),
    lengths: Optional[Path] = typer.Option(
        None, "--lengths", callback=_existing_file("--lengths"), help="Real lengths for --tiers auto, one integer per line."
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config whose 'build' section gives defaults."),
    backend: str = typer.Option(
        "auto", "--backend", callback=_one_of(BACKENDS, "--backend"), help="auto (tensorrt, else tensorrt_rtx), tensorrt or tensorrt_rtx."
    ),
    workspace_mb: Optional[int] = typer.Option(
        None, "--workspace-mb", callback=_key("build.workspace_mb", "--workspace-mb"), help="Builder workspace limit in MiB."
    ),
    optimization_level: Optional[int] = typer.Option(
        None,
        "--optimization-level",
        callback=_key("build.optimization_level", "--optimization-level"),
        help="Builder optimization level 0-5.",
    ),
    timing_cache: Optional[Path] = typer.Option(None, "--timing-cache", help="Load and save this timing cache (no-op on TensorRT-RTX)."),
    tactic_sources: Optional[str] = typer.Option(None, "--tactic-sources", help="As trtexec: '-CUBLAS,-CUBLAS_LT,-CUDNN'."),
    hardware_compatibility: Optional[str] = typer.Option(
        None,
        "--hardware-compatibility",
        callback=_key("build.hardware_compatibility", "--hardware-compatibility"),
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
        callback=_key("build.fuse_attention", "--fuse-attention"),
        help="auto|on|off: replace attention by a fused plugin where this TensorRT has one (auto: only where it runs).",
    ),
    fuse_gelu: Optional[str] = typer.Option(
        None,
        "--fuse-gelu",
        callback=_key("build.fuse_gelu", "--fuse-gelu"),
        help="auto|on|off: replace bias+GELU by TensorRT 8.x's GELU plugin (tanh form; auto: fp16 builds, where it was measured faster).",
    ),
    fuse_skip_layernorm: Optional[str] = typer.Option(
        None,
        "--fuse-skip-layernorm",
        callback=_key("build.fuse_skip_layernorm", "--fuse-skip-layernorm"),
        help="auto|on|off: replace residual add (+ dense bias) + LayerNorm by TensorRT 8.x's skip-LayerNorm plugin (auto: fp16 and INT8 best builds, where it was measured faster).",
    ),
    fuse_gemm: Optional[str] = typer.Option(
        None,
        "--fuse-gemm",
        callback=_key("build.fuse_gemm", "--fuse-gemm"),
        help="auto|on|off: replace the fp16 MatMuls by a constant weight (+ bias) that other passes left by trtforge's TrtforgeGemm (cuBLASLt, its kernel timed per shape; needs libtrtforge_plugins; auto: fp16 builds, where the H200 measured it faster).",
    ),
    qkv_projection: Optional[str] = typer.Option(
        None,
        "--qkv-projection",
        callback=_key("build.qkv_projection", "--qkv-projection"),
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
        callback=_key("build.gemm_precision", "--gemm-precision"),
        help="fp16|fp8: the GEMM plugins' arithmetic in an fp16 build (fp8: e4m3 operands with per-tensor scales, TrtforgeGemmFp8; compute capability 8.9+; gated on the engine by --fp8-min-cosine).",
    ),
    fp8_min_cosine: Optional[float] = typer.Option(
        None,
        "--fp8-min-cosine",
        callback=_key("build.fp8_min_cosine", "--fp8-min-cosine"),
        help="With --gemm-precision fp8: the engine's held-out mean cosine against ONNX Runtime fp32 must reach this (default 0.99), else exit 1.",
    ),
    fp8_min_top1_agreement: Optional[float] = typer.Option(
        None,
        "--fp8-min-top1-agreement",
        callback=_key("build.fp8_min_top1_agreement", "--fp8-min-top1-agreement"),
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
        callback=_key("build.fp8_chain_ffn", "--fp8-chain-ffn"),
        help="auto|on|off: with --gemm-precision fp8, FC1 writes e4m3 straight into FC2 where FC2 alone reads it (no fp16 FFN activation, no conversion; auto, the default: wherever such a pair exists; on: a model without one is an error).",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Build a TensorRT engine with tiered optimization profiles; write ENGINE and ENGINE.json."""
    from trtforge.build import build as build_step
    from trtforge.build import model_traits, options_from_config
    from trtforge.config import BuildSection, load_config
    from trtforge.onnxio import load_onnx

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
        _render_engine(result.sidecar, result.engine_path, result.layer_summary)
        _render_engine_check(result.sidecar.get("engine_check"))
    check = result.sidecar.get("engine_check") or {}
    if check.get("status") == "failed":
        raise GateFailedError("; ".join(check["failures"]) + ".")


def _render_engine(side: dict, engine_path: Path, summary: Optional[dict]) -> None:
    con = ui.console()
    rows = []
    for p in side["profiles"]:
        for name, shp in p["shapes"].items():
            rows.append([p["index"], name, "x".join(map(str, shp["min"])), "x".join(map(str, shp["opt"])), "x".join(map(str, shp["max"]))])
    con.print(ui.table(f"{engine_path.name}: optimization profiles", ["profile", "input", "min", "opt", "max"], rows))
    targets = ",".join(side.get("target_compute_capabilities") or []) or side.get("compute_capability") or "-"
    con.print(
        f"{side['backend']} {side['tensorrt_version']}, precision {side['precision']}, target {targets}, "
        f"engine {side['engine_bytes'] / 1e6:.1f} MB, built in {side['build_seconds']:.1f} s"
    )
    report = side.get("precision_report") or {}
    if report.get("fp32_nodes") is not None:
        con.print(
            f"fp16 conversion: {report['fp16_nodes']} nodes fp16, {report['fp32_nodes']} kept fp32 (block list, observed overflow or integer arithmetic; the sidecar says why for each)"
        )
    if summary:
        source = f" (from the {side['layer_source']})" if side.get("layer_source") else ""
        con.print(ui.table(f"layers by type{source}", ["type", "count"], sorted(summary["by_type"].items(), key=lambda kv: -kv[1])))
        con.print(
            ui.table("layers by output precision", ["precision", "count"], sorted(summary["by_precision"].items(), key=lambda kv: -kv[1]))
        )
        int8 = summary.get("int8_layers") or []
        con.print(f"layers running INT8: {len(int8)}" + (": " + ", ".join(int8) if int8 else ""), markup=False)
        if summary.get("int8_verdict"):
            con.print(f"INT8: {summary['int8_verdict']}", markup=False)
    elif side.get("layer_info_unavailable"):
        con.print(f"layer information: {side['layer_info_unavailable']}")
    if (side.get("inspector") or {}).get("error"):
        con.print(f"engine inspector failed: {side['inspector']['error']}", markup=False)
    from trtforge.fusion.fp8 import describe_fp8
    from trtforge.fusion.step import describe, describe_gelu, describe_gemm, describe_skip_layernorm

    for line in (
        describe(side.get("attention_fusion") or {}, side.get("precision"))
        + describe_gelu(side.get("gelu_fusion") or {})
        + describe_skip_layernorm(side.get("skip_layernorm_fusion") or {})
        + describe_gemm(side.get("gemm_fusion") or {})
        + describe_fp8(side.get("gemm_precision") or {})
    ):
        con.print(line, markup=False)
    for lib in side.get("plugin_libraries") or []:
        con.print(f"plugin library: {lib['path']} (sha256 {lib.get('sha256', '?')[:12]}); run loads it first", markup=False)
    for note in side.get("notes", []):
        con.print(f"note: {note}")


@app.command()
def inspect(
    engine: Path = typer.Argument(..., metavar="ENGINE", help="An engine built by trtforge build."),
    json_out: bool = JsonOpt,
) -> None:
    """Print an engine's sidecar and its layers by type and precision."""
    import json as _json

    from trtforge.build import read_engine_sidecar

    side = read_engine_sidecar(engine, verify=True)
    summary = side.get("layer_summary")
    layers_file = engine.with_name(engine.name + ".layers.json")
    fusion = side.get("attention_fusion")
    stale = summary is None or "int8_verdict" not in summary
    if layers_file.is_file() and (stale or (fusion and "engine" not in fusion)):  # sidecars of older trtforge
        unreadable = UserError(
            f"{layers_file} is not a layer list written by trtforge build; delete it, or rebuild {engine} to write it again."
        )
        try:
            data = _json.loads(layers_file.read_text())
        except (OSError, ValueError, RecursionError):
            raise unreadable from None
        layers = data.get("layers") if isinstance(data, dict) else data  # a list: older trtforge
        if not isinstance(layers, list):
            raise unreadable
        try:
            if stale:
                from trtforge.backends.tensorrt import summarize_layers

                summary = summarize_layers(layers)
            if fusion and "engine" not in fusion:
                from trtforge.fusion.engine_evidence import attention_evidence

                fusion["engine"] = attention_evidence(fusion, layers, len(side["profiles"]))
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            raise unreadable from None
    if json_out:
        ui.print_json({"path": str(engine), **side, "layer_summary": summary})
        return
    _render_engine(side, engine, summary)
    _render_engine_check(side.get("engine_check"))


@app.command()
def bisect(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="The cleaned fp32 ONNX (NAME.clean.onnx)."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Its calibration cache (default NAME.calib.cache beside it)."),
    data: Path = typer.Option(..., "--data", "-d", help="Samples to measure on: .npy/.npz, .txt/.jsonl or images."),
    groups: str = typer.Option("auto", "--groups", help="auto (every role group) or a comma list, e.g. attention_qk,attention_av,conv_*."),
    modes: str = typer.Option("off,alone", "--modes", help="Variants besides all-on: off (each group left out), alone (each group only)."),
    max_samples: int = typer.Option(64, "--max-samples", callback=_at_least(1, "--max-samples"), help="Use at most this many samples."),
    precision: str = typer.Option("best", "--precision", help="Engine precision: best (float parts fp16) or int8."),
    max_gap: float = typer.Option(
        0.005, "--max-gap", callback=_between(0, 2, "--max-gap"), help="Engine mean cosine this far below ORT's names a group."
    ),
    no_engine: bool = typer.Option(False, "--no-engine", help="ONNX Runtime only: no engine builds."),
    no_build_check: bool = typer.Option(False, "--no-build-check", help="Where engines cannot run, do not build them either."),
    tactic_sources: Optional[str] = typer.Option(
        None, "--tactic-sources", help="As trtexec (default on TensorRT 8.6: -CUBLAS,-CUBLAS_LT,-CUDNN)."
    ),
    optimization_level: Optional[int] = typer.Option(
        None,
        "--optimization-level",
        callback=_key("build.optimization_level", "--optimization-level"),
        help="Builder optimization level 0-5 of the variant engines (lower builds faster).",
    ),
    out_dir: Optional[Path] = typer.Option(
        None, "--out-dir", callback=_folder("--out-dir"), help="Variant ONNX/engines and bisect.json (default NAME.bisect/)."
    ),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the JSON report here instead."),
    json_out: bool = JsonOpt,
) -> None:
    """Q/DQ groups on and off, ORT vs the TensorRT engine: which groups TensorRT executes differently."""
    from trtforge.bisection import BisectOptions, table_rows
    from trtforge.bisection import bisect as bisect_step
    from trtforge.calibrate.step import paths_for

    if precision not in ("best", "int8"):
        raise UserError(f"--precision must be best or int8 for a bisection, got '{precision}'.")
    wanted = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not set(wanted) <= {"off", "alone"}:
        raise UserError(f"--modes takes off and/or alone, got '{modes}'.")
    options = BisectOptions(
        cache=cache or paths_for(onnx_path, None)[1],
        data=data,
        groups=groups,
        modes=wanted,
        max_samples=max_samples,
        precision=precision,
        max_gap=max_gap,
        engine=not no_engine,
        build_check=not no_build_check,
        tactic_sources=tactic_sources,
        out_dir=out_dir,
        report=report,
        optimization_level=optimization_level,
    )
    log = (lambda msg: None) if json_out else (lambda msg: ui.console(stderr=True).print(msg, markup=False))
    result = bisect_step(onnx_path, options, progress=log)
    if json_out:
        ui.print_json(result.report)
        return
    con = ui.console()
    con.print(ui.table("Q/DQ groups", ["group", "ops"], [[g, len(n)] for g, n in result.groups.items()]))
    con.print(
        ui.table(
            f"bisection of {onnx_path.name} (mean cosine vs fp32 on {result.report['samples']} samples)",
            ["variant", "quantized ops", "ORT cosine", "engine cosine", "ORT - engine", "GPU ms"],
            table_rows(result),
        )
    )
    con.print(f"engine: {result.engine_status}", markup=False)
    if result.suspects:
        con.print("groups TensorRT executes differently from the ONNX: " + ", ".join(result.suspects), markup=False)
    elif result.engine_status == "measured":
        con.print(f"no group's engine cosine falls more than {max_gap:g} below ONNX Runtime's", markup=False)
    con.print(f"report: {result.report['report']}")


@app.command(name="run")
def run_cmd(
    target: Path = typer.Argument(..., metavar="ENGINE|ONNX", help="An engine from trtforge build, or an ONNX (ONNX Runtime)."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", "-i", help="Folder or .jsonl of texts, .npy/.npz arrays, images or .wav."),
    chunk: Optional[int] = typer.Option(
        None,
        "--chunk",
        callback=_key("run.chunk", "--chunk"),
        help="Chunk size along the sequence, special tokens included (tile size for images).",
    ),
    overlap: Optional[int] = typer.Option(
        None, "--overlap", callback=_key("run.overlap", "--overlap"), help="Positions shared by consecutive chunks."
    ),
    no_chunking: bool = typer.Option(False, "--no-chunking", help="Run whole inputs; longer ones are an error."),
    merge: Optional[str] = typer.Option(
        None,
        "--merge",
        callback=_key("run.merge", "--merge"),
        help="center (keep each position from its most central chunk), or a linear, cosine or gaussian blend.",
    ),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", callback=_key("run.batch_size", "--batch-size"), help="Chunks per batch (capped by the profile's batch max)."
    ),
    reference: Optional[Path] = typer.Option(None, "--reference", help="fp32 ONNX to check against (default: the engine's source)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the JSON report here."),
    backend: str = typer.Option(
        "auto", "--backend", callback=_one_of(BACKENDS, "--backend"), help="For engines: auto, tensorrt or tensorrt_rtx."
    ),
    provider: Optional[list[str]] = typer.Option(
        None, "--provider", callback=_providers, help="ONNX Runtime providers for an ONNX target (repeatable)."
    ),
    warmup: Optional[int] = typer.Option(
        None, "--warmup", callback=_key("run.warmup", "--warmup"), help="Untimed warm-up runs per batch shape."
    ),
    tokenizer: Optional[Path] = typer.Option(
        None, "--tokenizer", help="A local Hugging Face tokenizer directory (default: the one export saved)."
    ),
    output_kind: Optional[list[str]] = typer.Option(
        None, "--output-kind", help="NAME=token|pooled|logits|dense[:SCALE], for outputs the sidecar does not declare (repeatable)."
    ),
    max_rel_l2: Optional[float] = typer.Option(
        None,
        "--max-rel-l2",
        callback=_key("run.max_rel_l2", "--max-rel-l2"),
        help="Precision gate on rel-L2 (default by the target's precision: fp32 1e-4, fp16 1e-2, INT8/FP8 none).",
    ),
    min_cosine: Optional[float] = typer.Option(
        None,
        "--min-cosine",
        callback=_key("run.min_cosine", "--min-cosine"),
        help="Precision gate on cosine (default 0.99 for fp16, INT8 and FP8 targets).",
    ),
    min_chunk_cosine: Optional[float] = typer.Option(
        None,
        "--min-chunk-cosine",
        callback=_key("run.min_chunk_cosine", "--min-chunk-cosine"),
        help="Chunking gate on the worst per-input cosine (default: not gated).",
    ),
    min_top1_agreement: Optional[float] = typer.Option(
        None,
        "--min-top1-agreement",
        callback=_key("run.min_top1_agreement", "--min-top1-agreement"),
        help="Precision gate on logits outputs' top-1 agreement.",
    ),
    min_pixel_agreement: Optional[float] = typer.Option(
        None,
        "--min-pixel-agreement",
        callback=_key("run.min_pixel_agreement", "--min-pixel-agreement"),
        help="Precision gate on dense outputs' per-pixel argmax agreement.",
    ),
    atol: Optional[list[str]] = typer.Option(
        None,
        "--atol",
        help="Absolute tolerance NAME:VALUE or VALUE (every output), on --error-stat; replaces the default gates for the outputs it names (repeatable).",
    ),
    rtol: Optional[list[str]] = typer.Option(
        None, "--rtol", help="Relative tolerance NAME:VALUE or VALUE (every output), on --error-stat (repeatable)."
    ),
    error_stat: str = typer.Option(
        "elemwise",
        "--error-stat",
        help="What --atol/--rtol bound: elemwise (every element within atol + rtol x |reference|), or the max, mean, median or a quantile qNN (e.g. q99) of the absolute error (<= atol) or relative error (<= rtol).",
    ),
    save_reference: Optional[Path] = typer.Option(
        None, "--save-reference", help="Keep the precision check's reference outputs (.npz), so a later run can --load-reference them."
    ),
    load_reference: Optional[Path] = typer.Option(
        None,
        "--load-reference",
        help="Judge the target against reference outputs a run stored with --save-reference (same inputs and chunking) instead of running the reference.",
    ),
    naive: bool = typer.Option(False, "--naive", help="One chunk per execute, no batching (the baseline of benchmarks/run.py)."),
    cuda_graphs: bool = typer.Option(
        True, "--cuda-graphs/--no-cuda-graphs", help="TensorRT: capture each batch shape as a CUDA graph and replay it."
    ),
    shared_memory: bool = typer.Option(
        True, "--shared-memory/--no-shared-memory", help="TensorRT: one device-memory block for all profile contexts."
    ),
    gpu_wait: str = typer.Option(
        "spin",
        "--gpu-wait",
        callback=_one_of(("spin", "block"), "--gpu-wait"),
        help="TensorRT: how the collecting thread waits for each batch: spin (CUDA's default: a core polls) or block (it sleeps until the GPU signals).",
    ),
    pad_batches: bool = typer.Option(
        True,
        "--pad-batches/--no-pad-batches",
        help="TensorRT: run a partial batch padded (copies of its last row, dropped after) to a batch size that already ran, instead of as a new shape.",
    ),
    slots: int = typer.Option(3, "--slots", min=1, help="TensorRT: staging slots, i.e. batches in flight."),
    plan_workers: Optional[int] = typer.Option(
        None,
        "--plan-workers",
        min=0,
        help="Threads tokenizing and chunking inputs while batches run (default: min(8, CPUs) where inputs are text to tokenize, else 0 on an engine and 2 on ONNX Runtime; 0: each input planned on the thread feeding the GPU, when its batches are needed).",
    ),
    plan_ahead: int = typer.Option(
        8,
        "--plan-ahead",
        min=0,
        help="Batches planned ahead of the GPU loop, queued (0: no bound); besides them at most 2 x plan-workers documents are planned ahead (with --plan-processes, at least 2 per process).",
    ),
    overlap_merges: bool = typer.Option(
        True,
        "--overlap-merges/--no-overlap-merges",
        help="With --no-precision-check on an engine: merge each batch on one merge thread while the next is collected (off: split a batch's rows over the merge threads and wait).",
    ),
    copy_engine_merge: bool = typer.Option(
        True,
        "--copy-engine-merge/--no-copy-engine-merge",
        help="With overlapped merges: the GPU's copy engine writes token outputs' kept windows straight into each input's merged output (page-locked, pooled, reserved before the clock), so the host copies none of those bytes (off: the merge threads copy them).",
    ),
    pinned_reserve_mb: Optional[float] = typer.Option(
        None,
        "--pinned-reserve-mb",
        min=0,
        help="With the copy-engine merge: MB of page-locked memory reserved before the clock for the merged outputs (default: sized by the batches in flight; 0: page-lock each pooled buffer when first needed).",
    ),
    plan_processes: int = typer.Option(
        0,
        "--plan-processes",
        "--tokenize-processes",
        min=0,
        help="Worker processes tokenizing text inputs and cutting them into windows, started before the clock, so the loop's process only unpickles each input's windows (0: the planning threads do it; --tokenize-processes: its former name).",
    ),
    last_window: Optional[str] = typer.Option(
        None,
        "--last-window",
        callback=_key("run.last_window", "--last-window"),
        help="A sequence's last window: full (ends at the input's end, as long as the others, so it batches with them; the default) or short (the remainder). Config: run.last_window.",
    ),
    switch_interval_us: int = typer.Option(
        500,
        "--switch-interval-us",
        min=1,
        help="Python's GIL switch interval while the loop runs, in microseconds: how long a thread coming back from a copy or a CUDA wait may wait for the GIL.",
    ),
    gc_pause: bool = typer.Option(
        True,
        "--gc-pause/--no-gc-pause",
        help="Python's cyclic garbage collector off while the loop runs (one collection before the clock): a full collection stops every thread of the loop for tens of ms.",
    ),
    merge_workers: Optional[int] = typer.Option(
        None,
        "--merge-workers",
        min=0,
        help="Threads merging outputs while batches run (default: min(2, CPUs); 2: fastest on BERT-base and MiniLM on the H200; 0: each batch merged on the thread collecting it, with --overlap-merges on an engine without the precision check).",
    ),
    save_outputs: Optional[Path] = typer.Option(None, "--save-outputs", help="Write every merged output as .npz, keys INPUT/OUTPUT."),
    precision_check: bool = typer.Option(
        True,
        "--precision-check/--no-precision-check",
        help="Check every chunk against ONNX Runtime fp32 after the run (off: speed runs; precision gates you set then fail).",
    ),
    plugin_library: Optional[list[str]] = typer.Option(
        None,
        "--plugin-library",
        help="Where the plugin libraries the engine was built with are on this machine (repeatable; default: the paths its sidecar records, and for a libtrtforge_plugins.so that is not here, the one `trtforge plugins build` cached for this TensorRT and GPU).",
    ),
    chunking_check: bool = typer.Option(
        True,
        "--chunking-check/--no-chunking-check",
        help="Measure chunked+merged vs one whole pass on ONNX Runtime fp32 for every chunked input after the run (off: speed runs; a min_chunk_cosine gate you set then fails).",
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config whose 'run' section gives defaults."),
    ray: Optional[str] = typer.Option(
        None, "--ray", help="Shard the inputs over Ray actors: 'auto' (a local cluster, or the one RAY_ADDRESS names) or a cluster address."
    ),
    ray_actors: Optional[int] = typer.Option(
        None,
        "--ray-actors",
        callback=_at_least(1, "--ray-actors"),
        help="With --ray: actors to start (default: one per GPU for an engine, one per CPU for an ONNX).",
    ),
    stateful: bool = typer.Option(
        False, "--stateful", help="KV-cache model: exact chunked prefill, the cache kept on the device between chunks."
    ),
    generate: int = typer.Option(
        0,
        "--generate",
        callback=_at_least(0, "--generate"),
        help="With --stateful: greedy-decode N tokens with the cache, checked against a full recompute.",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Chunked inference checked against ONNX Runtime: precision and chunking errors, latency, throughput, memory."""
    if ray_actors is not None and not ray:
        raise UserError(f"--ray-actors {ray_actors} applies with --ray (actors on a Ray cluster); add --ray auto or drop it.")
    if stateful or generate:
        if ray:
            raise UserError("--ray does not combine with --stateful/--generate (a KV cache lives on one device); drop one.")
        if plugin_library:
            raise UserError(
                "--plugin-library does not combine with --stateful/--generate yet: the stateful runner loads "
                "the libraries its engine's sidecar records; rebuild the engine where the library now is."
            )
        from trtforge.stateful import run_command

        return run_command(target, inputs, chunk, generate, reference, report, backend, provider, max_rel_l2, json_out)
    from trtforge.config import RunSection, load_config
    from trtforge.errors import GateFailed
    from trtforge.outputs import parse_override
    from trtforge.run import RunOptions
    from trtforge.run import run as run_step

    section = load_config(config).run if config else _section_for_target(target) or RunSection()

    def gate(flag: Optional[float], key: str) -> Optional[float]:
        """A flag, else the config key if the YAML sets it: only those are 'set' gates (see report.py)."""
        return flag if flag is not None else (getattr(section, key) if key in section.model_fields_set else None)

    chosen_inputs = inputs or (Path(section.inputs) if section.inputs else None)
    if chosen_inputs is None:
        raise UserError("no inputs given; pass --inputs FOLDER or set run.inputs in the config.")
    options = RunOptions(
        inputs=chosen_inputs,
        chunk=None if no_chunking else (chunk or section.chunk),
        overlap=0 if no_chunking else (overlap if overlap is not None else section.overlap),
        batch_size=batch_size or section.batch_size,
        merge=merge or section.merge,
        warmup=warmup if warmup is not None else section.warmup,
        reference=reference or (Path(section.reference) if section.reference else None),
        backend=backend,
        max_rel_l2=gate(max_rel_l2, "max_rel_l2"),
        min_cosine=gate(min_cosine, "min_cosine"),
        min_chunk_cosine=gate(min_chunk_cosine, "min_chunk_cosine"),
        min_top1_agreement=gate(min_top1_agreement, "min_top1_agreement"),
        min_pixel_agreement=gate(min_pixel_agreement, "min_pixel_agreement"),
        providers=list(provider or []),
        report=report or (Path(section.report) if section.report else None),
        naive=naive,
        tokenizer=tokenizer,
        output_kinds=dict(parse_override(o) for o in output_kind or []),
        save_outputs=save_outputs,
        cuda_graphs=cuda_graphs,
        shared_device_memory=shared_memory,
        pad_batches=pad_batches,
        gpu_wait=gpu_wait,
        slots=slots,
        precision_check=precision_check,
        chunking_check=chunking_check,
        plugin_libraries=list(plugin_library or []),
        plan_workers=plan_workers,
        plan_ahead=plan_ahead,
        overlap_merges=overlap_merges,
        copy_engine_merge=copy_engine_merge,
        pinned_reserve_mb=pinned_reserve_mb,
        merge_workers=merge_workers,
        plan_processes=plan_processes,
        last_window=last_window or section.last_window,
        switch_interval_us=switch_interval_us,
        gc_pause=gc_pause,
        atol=list(atol or []),
        rtol=list(rtol or []),
        error_stat=error_stat,
        save_reference=save_reference,
        load_reference=load_reference,
    )
    if options.merge not in ("center", "linear", "cosine", "gaussian"):
        raise UserError(f"unknown --merge '{options.merge}'; use center, linear, cosine or gaussian.")
    log = (lambda msg: None) if json_out else (lambda msg: ui.console(stderr=True).print(msg, markup=False))
    if ray:
        for flag, value in (
            ("--plan-processes", options.plan_processes or None),
            ("--plan-workers", plan_workers),
            ("--merge-workers", merge_workers),
        ):
            if value is not None:
                raise UserError(
                    f"{flag} applies to one process's loop; with --ray the driver plans every input before the "
                    "clock and each actor merges its units on one thread, drop it."
                )
        from trtforge.scaleout.ray_run import RayOptions, run_ray

        result = run_ray(target, options, RayOptions(ray, _positive(ray_actors, "--ray-actors")), progress=log)
    else:
        result = run_step(target, options, progress=log)
    if json_out:
        ui.print_json(result)
    else:
        _render_run(result)
    if not result["gates"]["passed"]:
        raise GateFailed("; ".join(result["gates"]["failures"]) + (f"; see {options.report}" if options.report else ""))


def _positive(value: Optional[int], flag: str) -> Optional[int]:
    if value is not None and value < 1:
        raise UserError(f"{flag} must be at least 1, got {value}.")
    return value


def _section_for_target(target: Path):
    """The built-in config's run section for an engine/ONNX made from a built-in model."""
    from trtforge.artifacts import read_sidecar

    try:
        side = read_sidecar(target, required=False) or {}
    except UserError:
        return None
    source_onnx = side.get("reference_onnx") or side.get("source_onnx")
    if side.get("source") is None and source_onnx:
        return _builtin_section(Path(source_onnx), "run")
    return _builtin_section(target, "run")


def _kind_label(output: dict) -> str:
    scale = output.get("scale")
    return output["kind"] + ("" if scale in (None, 1.0) else f" x{scale:g}")


def _render_run(r: dict) -> None:
    con = ui.console()
    ch = r["chunking"]
    con.print(
        f"{len(r['inputs'])} inputs, {sum(i['chunks'] for i in r['inputs'])} chunks (chunk {ch['chunk']}, overlap {ch['overlap']}, "
        f"merge {ch['merge']}), {r['batches']} batches on {r['backend']}"
    )
    con.print("outputs: " + ", ".join(f"{n} ({_kind_label(o)}, {o['source']})" for n, o in r["outputs"].items()))
    rows = []
    for label, section in (("precision", r["precision_error"]), ("chunking", r["chunking_error"])):
        if not section.get("measured"):
            rows.append([f"{label}: {section.get('reason', 'not measured')}", "-", "-", "-", "-", "-"])
            continue
        for name, m in section["per_output"].items():
            task = m.get("top1_agreement", m.get("pixel_agreement", "-"))
            rows.append(
                [
                    f"{label}: {name} ({r['outputs'][name]['kind']})",
                    m["rel_l2"],
                    m["cosine"],
                    m["min_row_cosine"],
                    m["min_item_cosine"],
                    task,
                ]
            )
    con.print(ui.table("errors", ["check", "rel-L2", "cosine", "min row cosine", "min item cosine", "top-1 / pixel agr."], rows))
    lat = [
        [
            label,
            v["wall"]["count"],
            v["wall"].get("p50_ms", 0.0),
            v["wall"].get("p90_ms", 0.0),
            v["wall"].get("p99_ms", 0.0),
            v.get("gpu_compute", {}).get("p50_ms", "-"),
            v.get("wall_over_gpu", "-"),
        ]
        for label, v in r["latency"].items()
    ]
    con.print(
        ui.table(
            "latency per batch (warm-up excluded)", ["group", "batches", "p50 ms", "p90 ms", "p99 ms", "GPU p50 ms", "wall / GPU"], lat
        )
    )
    if r.get("workers"):
        con.print(
            ui.table(
                f"Ray workers ({r['ray']['actors']} actors, {r['ray']['units']} units, {r['ray']['retried_units']} retried)",
                [
                    "worker",
                    "host",
                    "documents",
                    "chunks",
                    "batches",
                    f"{r['throughput'].get('unit', 'tokens')}/s",
                    "p50 ms",
                    "retried",
                    "alive",
                ],
                [
                    [
                        w["worker"],
                        w["host"] or "-",
                        w["documents"],
                        w["chunks"],
                        w["batches"],
                        w["tokens_per_s"],
                        w["latency"]["all"]["wall"].get("p50_ms", 0.0),
                        w["retried_units"],
                        w["alive"],
                    ]
                    for w in r["workers"]
                ],
            )
        )
    t, m = r["throughput"], r["memory"]
    mem = f"peak GPU {m['peak_gpu_mb']:.0f} MiB" if "peak_gpu_mb" in m else f"peak RSS {m['peak_rss_mb']:.0f} MiB"
    con.print(f"throughput {t['inputs_per_s']:.2f} inputs/s, {t['tokens_per_s']:.0f} {t.get('unit', 'tokens')}/s; {mem}")
    g = (r.get("runtime") or {}).get("cuda_graphs")
    if g:
        shared = r["runtime"].get("shared_device_memory", {})
        con.print(
            f"CUDA graphs: {'on' if g['enabled'] else 'off'}, {g['captured']} captured, {g['replayed']} replays, "
            f"{g['plain_enqueues']} plain enqueues, {len(g['fallbacks'])} fallbacks; shared device memory: "
            + (f"{shared['mb']:.0f} MiB" if shared.get("enabled") else "off")
        )
    host = r.get("runtime", {}).get("host")
    if host and host.get("stages"):
        con.print(
            f"host seconds (loop wall {host['loop_wall_s']:.3f} s; threads overlap): "
            + ", ".join(f"{k} {v['seconds']:.3f}" for k, v in host["stages"].items()),
            markup=False,
        )
    skipped = [c for c in r["gates"]["checked"] if c["status"] == "not evaluated"]
    note = "; not evaluated (defaults): " + ", ".join(f"{c['gate']} ({c['reason']})" for c in skipped) if skipped else ""
    con.print("gates: " + ("passed" if r["gates"]["passed"] else "FAILED: " + "; ".join(r["gates"]["failures"])) + note)
    used = ", ".join(f"{c['gate']} {c['threshold']:g} ({c['source']})" for c in r["gates"]["checked"])
    con.print(f"  target precision {r['gates'].get('precision', '?')}; gates: {used or 'none'}", markup=False)
    for line in r["gates"].get("notes") or []:
        con.print(f"  note: {line}", markup=False)


@app.command()
def compare(
    target: Path = typer.Argument(..., metavar="TARGET", help="The ONNX (ONNX Runtime) or engine to check."),
    reference: Path = typer.Argument(..., metavar="REFERENCE", help="The ONNX to check it against (ONNX Runtime), e.g. the fp32 one."),
    inputs: Path = typer.Option(
        ..., "--inputs", "-i", help="Folder of .npy/.npz arrays, .txt/.jsonl texts (the tokenizer), images or .wav; each fed whole."
    ),
    atol: Optional[list[str]] = typer.Option(
        None, "--atol", help="Absolute tolerance, NAME:VALUE for one output or VALUE for all (repeatable)."
    ),
    rtol: Optional[list[str]] = typer.Option(None, "--rtol", help="Relative tolerance, NAME:VALUE or VALUE (repeatable)."),
    error_stat: Optional[str] = typer.Option(
        None, "--error-stat", help="What the tolerances bound: elemwise (every value; the default), max, mean, median or a quantile qNN."
    ),
    max_rel_l2: Optional[float] = typer.Option(
        None, "--max-rel-l2", help="Gate on every output's rel-L2 (default: by the target's precision, for outputs without a tolerance)."
    ),
    min_cosine: Optional[float] = typer.Option(
        None, "--min-cosine", help="Gate on every output's cosine (default: by the target's precision)."
    ),
    layerwise: bool = typer.Option(
        False,
        "--layerwise",
        help="Also compare every intermediate tensor both graphs name alike, and name the first over the gates (an engine target is built again from its ONNX with those tensors marked as outputs).",
    ),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", help="Use at most this many inputs."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the JSON report here."),
    json_out: bool = JsonOpt,
) -> None:
    """A target's outputs against a reference's on the same inputs, per output by kind; --layerwise finds where they part."""
    from trtforge.compare_step import CompareOptions
    from trtforge.compare_step import compare as compare_step

    options = CompareOptions(
        inputs=inputs,
        atol=list(atol or []),
        rtol=list(rtol or []),
        error_stat=error_stat,
        max_rel_l2=max_rel_l2,
        min_cosine=min_cosine,
        layerwise=layerwise,
        max_samples=max_samples,
        report=report,
    )
    log = (lambda msg: None) if json_out else (lambda msg: ui.console(stderr=True).print(msg, markup=False))
    result = compare_step(target, reference, options, progress=log)
    if json_out:
        ui.print_json(result)
    else:
        _render_compare(result)
    if not result["passed"]:
        raise GateFailedError("compare: " + "; ".join(result["gates"]["failures"]))


def _render_compare(r: dict) -> None:
    con = ui.console()
    rows = [
        [
            name,
            r["outputs"][name]["kind"] or "-",
            m["rel_l2"],
            m["cosine"],
            m["max_abs"],
            (
                f"{m['tolerance']['violations']} outside"
                if m["tolerance"]["statistic"] == "elemwise"
                else f"{m['tolerance']['statistic']} {m['tolerance']['abs_error']:.3g}"
            )
            if "tolerance" in m
            else "-",
        ]
        for name, m in r["per_output"].items()
    ]
    con.print(
        ui.table(
            f"{Path(r['target']).name} against {Path(r['reference']).name} ({r['inputs']['samples']} inputs, "
            f"target precision {r['precision']})",
            ["output", "kind", "rel-L2", "cosine", "max-abs", "tolerance"],
            rows,
        )
    )
    lw = r.get("layerwise")
    if lw:
        rows = [
            [
                row["tensor"],
                row["op"] + ("" if row["target_op"] == row["op"] else f" (target: {row['target_op']})"),
                row["rel_l2"],
                row["cosine"],
                row["max_abs"],
                "-" if row["growth"] is None else f"{row['growth']:.3g}x",
                row["status"],
            ]
            for row in lw["rows"]
        ]
        con.print(
            ui.table(
                "layer-wise, in the reference's topological order",
                ["tensor", "op", "rel-L2", "cosine", "max-abs", "growth", "status"],
                rows,
            )
        )
        con.print(
            f"layer-wise: {lw['matched']} tensors matched by name ({lw['reference_tensors']} in the reference, "
            f"{lw['target_tensors']} in the target), {lw['compared']} compared, {len(lw['skipped'])} skipped"
            + "".join(f"; {n} {why}" for why, n in lw["skipped_counts"].items()),
            markup=False,
        )
        jump = lw["first_jump"]
        gates = ", ".join(f"{g['gate']} {g['threshold']:g}" for g in lw["gates"]) or "none"
        con.print(
            f"first tensor over the layer gates ({gates}): "
            + (
                f"'{jump['tensor']}' ({jump['op']} node {jump['node']}"
                + ("" if jump["target_op"] == jump["op"] else f", {jump['target_op']} in the target")
                + f"): {'; '.join(jump['reasons'])}"
                + ("" if jump["growth"] is None else f", {jump['growth']:.3g}x its inputs' worst")
                if jump
                else "none"
            ),
            markup=False,
        )
    checked = ", ".join(f"{c['gate']} {c['threshold']:g} ({c['source']})" for c in r["gates"]["checked"]) or "none"
    con.print(f"gates ({checked}): " + ("passed" if r["gates"]["passed"] else "FAILED: " + "; ".join(r["gates"]["failures"])), markup=False)
    for line in r["gates"].get("notes") or []:
        con.print(f"  note: {line}", markup=False)


@app.command()
def pipeline(
    config: Path = typer.Argument(..., metavar="CONFIG", help="configs/NAME.yaml"),
    from_step: Optional[str] = typer.Option(
        None, "--from", callback=_step("--from"), help="Start at this step (export, clean, calibrate, build, run); it always runs."
    ),
    only: Optional[str] = typer.Option(None, "--only", callback=_step("--only"), help="Run just this step (it always runs)."),
    out_dir: Path = typer.Option(Path("out"), "--out-dir", callback=_folder("--out-dir"), help="Where every artifact goes."),
    backend: str = typer.Option(
        "auto", "--backend", callback=_one_of(BACKENDS, "--backend"), help="Build backend: auto, tensorrt or tensorrt_rtx."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """export -> clean -> calibrate -> build -> run from one config; unchanged steps are skipped."""
    from trtforge.config import load_config
    from trtforge.pipeline import Pipeline

    cfg = load_config(config)
    log = (lambda msg: None) if json_out else (lambda msg: ui.console(stderr=True).print(msg, markup=False))
    report = Pipeline(cfg, out_dir, backend, log).execute(from_step, only)
    if json_out:
        ui.print_json(report)
    else:
        rows = [[s["step"], s["status"], s["seconds"], s["detail"]] for s in report["steps"]]
        ui.console().print(ui.table(f"pipeline {cfg.name} ({report['seconds']:.1f} s)", ["step", "status", "seconds", "detail"], rows))
        ui.console().print(f"report: {out_dir / (cfg.name + '.pipeline.json')}")
    if report["exit_code"]:
        failed = next(s for s in report["steps"] if s["exit_code"] == report["exit_code"])
        raise (UserError if report["exit_code"] == 2 else GateFailedError)(f"pipeline step '{failed['step']}': {failed['detail']}")


@app.command()
def doctor(json_out: bool = JsonOpt) -> None:
    """Report Python, torch, ONNX, ONNX Runtime, TensorRT, CUDA and the GPU, and what this machine can run."""
    from trtforge.doctor import report

    data = report()
    if json_out:
        ui.print_json(data)
        return
    con = ui.console()
    con.print(f"trtforge {__version__} on {data['platform']}")
    con.print(ui.table("versions", ["component", "version"], [[k, v or "not installed"] for k, v in data["versions"].items()]))
    con.print(f"ONNX Runtime providers: {', '.join(data['onnxruntime_providers']) or 'none'}")
    gpu = data["gpu"]
    con.print(f"GPU: {gpu['name']} (compute capability {gpu['compute_capability']}, {gpu['memory_gib']} GiB)" if gpu else "GPU: none found")
    con.print(ui.table("features", ["feature", "available"], [[k, "yes" if v else "no"] for k, v in data["features"].items()]))
    for flavour, why in data["engines"].items():
        con.print(f"run {flavour} engines here: {why}")
    plugin = data["plugin_library"]
    con.print(f"plugin library (libtrtforge_plugins): {plugin['state']}: {plugin['detail']}", markup=False)


def main() -> None:
    """Entry point. A user error is one line on stderr and exit 2 (a failed gate 1), an unexpected exception one line
    naming the step and the exception, its traceback in a log file, exit 3 (trtforge.errors); with --json, stdout
    carries one JSON object either way, the error under "error"."""
    argv = sys.argv[1:]
    step = next((a for a in argv if not a.startswith("-")), "trtforge")
    json_mode = "--json" in argv
    with ui.held_json() as held:
        code, error = _run_app(step)
        try:
            ui.flush_json(held, error if json_mode else None)
        except Exception as exc:  # noqa: BLE001 - a result that cannot be written as JSON is a bug, reported as one
            code, error = _internal_error(step, exc)
            if json_mode:
                ui.flush_json([], error)
    if code:
        sys.exit(code)


def _run_app(step: str) -> tuple[int, Optional[dict]]:
    """Run the command: (exit code, the JSON error object or None). Every message has been printed on stderr."""
    err = ui.console(stderr=True)
    try:
        code = app(standalone_mode=False)
        if code == 130:  # typer turns Ctrl-C into a returned 130 outside standalone mode
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            return code, _json_error("error", f"exit code {code}", code)
        return 0, None
    except TrtforgeError as exc:
        message = str(exc)
        log = _write_log(step, exc.detail) if exc.detail else None
        if log:
            message = message.rstrip(".") + f"; details in {log}."
        err.print(f"error: {message}", markup=False)
        kind = "gate_failed" if isinstance(exc, GateFailedError) else "user_error"
        return exc.exit_code, _json_error(kind, message, exc.exit_code, log)
    except KeyboardInterrupt:
        message = interrupted_message(published())
        err.print(message, markup=False)
        return INTERRUPTED, _json_error("interrupted", message, INTERRUPTED)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return code, _json_error("error", f"exit code {code}", code) if code else None
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected exception becomes a message
        usage_errors, aborts = _click_error_types()
        if isinstance(exc, usage_errors):
            message = _usage_sentence(exc)
            err.print(f"error: {message}", markup=False)
            return 2, _json_error("usage_error", message, 2)
        if isinstance(exc, aborts):
            return INTERRUPTED, _json_error("interrupted", "aborted", INTERRUPTED)
        return _internal_error(step, exc)


def _internal_error(step: str, exc: BaseException) -> tuple[int, dict]:
    """An unexpected exception: one line naming the step and the exception, the traceback in a log file, exit 3."""
    import traceback

    log = _write_log(step, "".join(traceback.format_exception(exc)))
    where = f"the full traceback is in {log}" if log else "no log file could be written"
    message = f"internal error in '{step}': {exception_summary(exc, 300)}; {where}; please report it."
    ui.console(stderr=True).print(f"error: {message}", markup=False)
    return INTERNAL_ERROR, _json_error("internal_error", message, INTERNAL_ERROR, log)


def _usage_sentence(exc: Exception) -> str:
    """A command-line usage error (click's) as one sentence that points at the command's help."""
    text = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    if ". Did you mean " in text:
        head, _, hint = text.partition(". Did you mean ")
        text = f"{head} (did you mean {hint})"
    param = getattr(exc, "param", None)
    argv = sys.argv[1:]
    for opt in getattr(param, "opts", ()) if type(exc).__name__ == "BadParameter" else ():
        given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == opt] + [a.split("=", 1)[1] for a in argv if a.startswith(opt + "=")]
        if given:
            text += f", got '{given[-1]}'"
            break
    ctx = getattr(exc, "ctx", None)
    command = ctx.command.name if ctx is not None and ctx.parent is not None else None
    where = f"trtforge {command} --help" if command else "trtforge --help"
    return f"{text}; see '{where}'."


def _json_error(kind: str, message: str, exit_code: int, log: Optional[Path] = None) -> dict:
    return {"kind": kind, "message": message, "exit_code": exit_code, "log": str(log) if log else None}


def log_dirs() -> list[Path]:
    """Where log files go, first writable wins: $TRTFORGE_LOG_DIR, the per-user cache ($XDG_CACHE_HOME or
    ~/.cache)/trtforge/logs, the temp dir."""
    import os
    import tempfile

    dirs = [Path(os.environ["TRTFORGE_LOG_DIR"])] if os.environ.get("TRTFORGE_LOG_DIR") else []
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return dirs + [Path(cache) / "trtforge" / "logs", Path(tempfile.gettempdir())]


def _write_log(step: str, text: str) -> Optional[Path]:
    """Write `text` to a new log file named after the step and the time, atomically (a temp file renamed); its path,
    or None when no folder takes it."""
    import os
    import tempfile
    import time

    header = f"trtforge {__version__} {step}: {' '.join(sys.argv)}\n\n"
    name = f"trtforge-{''.join(c if c.isalnum() or c in '-_' else '_' for c in step)}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for folder in log_dirs():
        tmp = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
                fh.write(header + text)
            os.replace(tmp, folder / name)
            return folder / name
        except OSError:
            if tmp:
                Path(tmp).unlink(missing_ok=True)
    return None


def _click_error_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage-error types, abort types) of click and of the copy of click that typer 0.2x carries inside itself
    (typer._click): an unknown option or a missing argument raised by either is one message and exit 2, not a
    traceback (with typer 0.29 only click's own were caught, and every usage error ended in a traceback, exit 1)."""
    import typer

    errors = {c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"}
    aborts = {typer.Abort}
    try:
        import click

        errors.add(click.exceptions.ClickException)
        aborts.add(click.exceptions.Abort)
    except ImportError:  # typer 0.2x no longer needs click itself
        pass
    return tuple(errors), tuple(aborts)


def entry() -> None:
    """The `trtforge` executable: main(), then a Ctrl-C during interpreter teardown is ignored (not in main()
    itself, which tests call in-process)."""
    try:
        main()
    finally:
        _ignore_late_ctrl_c()


def interrupted_message(written: list[Path]) -> str:
    """What Ctrl-C left behind: every file is written whole or not at all, so either nothing or a list of complete files."""
    if not written:
        return "interrupted: nothing was written under the final output names."
    names = ", ".join(str(p) for p in written[:8]) + (f" and {len(written) - 8} more" if len(written) > 8 else "")
    return f"interrupted: {names} had already been written (complete); nothing else was written under final output names."


def _ignore_late_ctrl_c() -> None:
    """The command has finished and said so: a Ctrl-C during interpreter teardown would otherwise kill the
    process by signal and hide the exit code it already decided."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    entry()
