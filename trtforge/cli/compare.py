"""`trtforge compare`: one target against one reference over the same inputs (optionally layer by layer)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.cli import render
from trtforge.core import ui
from trtforge.core.errors import GateFailed as GateFailedError


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
    json_out: bool = opt.JsonOpt,
) -> None:
    """A target's outputs against a reference's on the same inputs, per output by kind; --layerwise finds where they part."""
    from trtforge.verify.step import CompareOptions
    from trtforge.verify.step import compare as compare_step

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
        render.compare_report(result)
    if not result["passed"]:
        raise GateFailedError("compare: " + "; ".join(result["gates"]["failures"]))
