"""`trtforge bisect`: find the layers whose INT8 costs the most accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.core import ui
from trtforge.core.errors import UserError


def bisect(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="The cleaned fp32 ONNX (NAME.clean.onnx)."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Its calibration cache (default NAME.calib.cache beside it)."),
    data: Path = typer.Option(..., "--data", "-d", help="Samples to measure on: .npy/.npz, .txt/.jsonl or images."),
    groups: str = typer.Option("auto", "--groups", help="auto (every role group) or a comma list, e.g. attention_qk,attention_av,conv_*."),
    modes: str = typer.Option("off,alone", "--modes", help="Variants besides all-on: off (each group left out), alone (each group only)."),
    max_samples: int = typer.Option(64, "--max-samples", callback=opt.at_least(1, "--max-samples"), help="Use at most this many samples."),
    precision: str = typer.Option("best", "--precision", help="Engine precision: best (float parts fp16) or int8."),
    max_gap: float = typer.Option(
        0.005, "--max-gap", callback=opt.between(0, 2, "--max-gap"), help="Engine mean cosine this far below ORT's names a group."
    ),
    no_engine: bool = typer.Option(False, "--no-engine", help="ONNX Runtime only: no engine builds."),
    no_build_check: bool = typer.Option(False, "--no-build-check", help="Where engines cannot run, do not build them either."),
    tactic_sources: Optional[str] = typer.Option(
        None, "--tactic-sources", help="As trtexec (default on TensorRT 8.6: -CUBLAS,-CUBLAS_LT,-CUDNN)."
    ),
    optimization_level: Optional[int] = typer.Option(
        None,
        "--optimization-level",
        callback=opt.config_key("build.optimization_level", "--optimization-level"),
        help="Builder optimization level 0-5 of the variant engines (lower builds faster).",
    ),
    out_dir: Optional[Path] = typer.Option(
        None, "--out-dir", callback=opt.folder("--out-dir"), help="Variant ONNX/engines and bisect.json (default NAME.bisect/)."
    ),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the JSON report here instead."),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Q/DQ groups on and off, ORT vs the TensorRT engine: which groups TensorRT executes differently."""
    from trtforge.calibrate.options import paths_for
    from trtforge.verify.bisect import BisectOptions, table_rows
    from trtforge.verify.bisect import bisect as bisect_step

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
