"""`trtforge pipeline`: the steps a config names, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.core import ui
from trtforge.core.errors import GateFailed as GateFailedError
from trtforge.core.errors import UserError


def pipeline(
    config: Path = typer.Argument(..., metavar="CONFIG", help="configs/NAME.yaml"),
    from_step: Optional[str] = typer.Option(
        None,
        "--from",
        callback=opt.pipeline_step("--from"),
        help="Start at this step (export, clean, calibrate, build, run); it always runs.",
    ),
    only: Optional[str] = typer.Option(None, "--only", callback=opt.pipeline_step("--only"), help="Run just this step (it always runs)."),
    out_dir: Path = typer.Option(Path("out"), "--out-dir", callback=opt.folder("--out-dir"), help="Where every artifact goes."),
    backend: str = typer.Option(
        "auto", "--backend", callback=opt.one_of(opt.BACKENDS, "--backend"), help="Build backend: auto, tensorrt or tensorrt_rtx."
    ),
    json_out: bool = opt.JsonOpt,
) -> None:
    """export -> clean -> calibrate -> build -> run from one config; unchanged steps are skipped."""
    from trtforge.core.config import load_config
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
