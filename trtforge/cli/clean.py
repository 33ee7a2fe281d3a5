"""`trtforge clean`: fold and simplify an ONNX graph, with parity proven on ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.core import ui


def clean(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="The exported model."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Default: NAME.clean.onnx beside the input."),
    fold_size_limit_mb: float = typer.Option(
        64.0,
        "--fold-size-limit-mb",
        callback=opt.config_key("clean.fold_size_limit_mb", "--fold-size-limit-mb"),
        help="Do not fold constants larger than this.",
    ),
    tolerance: float = typer.Option(
        1e-5,
        "--tolerance",
        callback=opt.config_key("clean.tolerance", "--tolerance"),
        help="Max rel-L2 between the original and cleaned outputs.",
    ),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Fold constants, drop dead nodes, Identity and Dropout, infer shapes, sort; prove outputs unchanged."""
    from trtforge.graph.index import clean_file

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
