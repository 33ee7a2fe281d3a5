"""`trtforge calibrate`: INT8 scales into a TensorRT-format cache, checked on held-out data."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.cli import render
from trtforge.core import ui
from trtforge.core.errors import UserError


def calibrate(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="The cleaned ONNX (trtforge clean)."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="Calibration folder: .npy/.npz, .txt/.jsonl, images or .wav."),
    method: Optional[str] = typer.Option(
        None,
        "--method",
        callback=opt.config_key("calibrate.method", "--method"),
        help="entropy (TensorRT's KL search), percentile or minmax.",
    ),
    percentile: Optional[float] = typer.Option(
        None,
        "--percentile",
        callback=opt.config_key("calibrate.percentile", "--percentile"),
        help="For --method percentile (default 99.99).",
    ),
    smooth: Optional[float] = typer.Option(
        None,
        "--smooth",
        callback=opt.config_key("calibrate.smooth", "--smooth"),
        help="SmoothQuant alpha in [0, 1] (migrates activation outliers into weights).",
    ),
    no_smooth: bool = typer.Option(False, "--no-smooth", help="Turn off SmoothQuant even if the config sets it."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", help="Held-out folder for the accuracy check (default: the config's)."),
    max_samples: Optional[int] = typer.Option(
        None,
        "--max-samples",
        callback=opt.config_key("calibrate.max_samples", "--max-samples"),
        help="Use at most this many calibration samples.",
    ),
    max_eval_samples: Optional[int] = typer.Option(
        None, "--max-eval-samples", callback=opt.at_least(1, "--max-eval-samples"), help="Use at most this many held-out samples."
    ),
    min_cosine: Optional[float] = typer.Option(
        None,
        "--min-cosine",
        callback=opt.config_key("calibrate.min_cosine", "--min-cosine"),
        help="Gate: mean cosine of pooled outputs to fp32 (default 0.99).",
    ),
    min_int8_flops: Optional[float] = typer.Option(
        None,
        "--min-int8-flops",
        callback=opt.config_key("calibrate.min_int8_flops", "--min-int8-flops"),
        help="Floor on the GEMM FLOPs fraction left in INT8 (default 0.8).",
    ),
    min_top1_agreement: Optional[float] = typer.Option(
        None,
        "--min-top1-agreement",
        callback=opt.config_key("calibrate.min_top1_agreement", "--min-top1-agreement"),
        help="Gate: top-1 agreement of logits outputs on held-out data.",
    ),
    min_pixel_agreement: Optional[float] = typer.Option(
        None,
        "--min-pixel-agreement",
        callback=opt.config_key("calibrate.min_pixel_agreement", "--min-pixel-agreement"),
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
        None, "--from-cache", callback=opt.existing_file("--from-cache"), help="Import a TensorRT calibration cache written elsewhere."
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
        callback=opt.at_least(1, "--ray-actors"),
        help="With --ray: actors to start (default: one per CPU of the cluster).",
    ),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Calibrate INT8 scales, write a TensorRT calibration cache + sidecar and a Q/DQ ONNX, check accuracy."""
    from trtforge.calibrate.options import gate_failures, options_from_section
    from trtforge.calibrate.step import calibrate as calibrate_step
    from trtforge.core.config import CalibrateSection, load_config
    from trtforge.core.errors import GateFailed

    if ray_actors is not None and not ray:
        raise UserError(f"--ray-actors {ray_actors} applies with --ray (actors on a Ray cluster); add --ray auto or drop it.")
    section = load_config(config).calibrate if config else opt.builtin_section(onnx_path, "calibrate") or CalibrateSection()
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
        ray_actors=opt.positive(ray_actors, "--ray-actors"),
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
        render.engine_check(side.get("engine_check"))
    failures = gate_failures(side, options)
    if failures:
        raise GateFailed("; ".join(failures) + ".")
