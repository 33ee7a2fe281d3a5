"""The `trtforge` command line: parse, call the API, render. No pipeline logic lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from trtforge import __version__
from trtforge.errors import TrtforgeError, UserError
from trtforge import ui

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="PyTorch to a validated TensorRT engine: export, clean, calibrate, build, run.")

JsonOpt = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


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
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Built-in name (minilm, tiny-fcn), file.py:factory, TorchScript or .pt2."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (configs/NAME.yaml)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output ONNX path (default out/NAME.onnx)."),
    opset: Optional[int] = typer.Option(None, "--opset", help="ONNX opset (default 17)."),
    exporter: Optional[str] = typer.Option(None, "--exporter", help="legacy (TorchScript-based) or dynamo."),
    external_data: Optional[bool] = typer.Option(None, "--external-data/--no-external-data", help="Force weights into NAME.onnx.data."),
    json_out: bool = JsonOpt,
) -> None:
    """Export a PyTorch model to ONNX and check it against PyTorch at >= 2 sizes of every dynamic axis."""
    from trtforge.config import ModelConfig, apply_overrides
    from trtforge.export import export_model, specs_from_examples
    from trtforge.models import load_model

    cfg = _resolve_config(model, config)
    if cfg is None:  # a user model without a config: specs from its example inputs
        loaded = load_model(model)
        specs, axes = specs_from_examples(loaded)
        cfg = ModelConfig(name=Path(model.split(":")[0]).stem, model={"source": model}, inputs=specs, axes=axes,
                          outputs=loaded.output_names)
    cfg = apply_overrides(cfg, {"export.opset": opset, "export.exporter": exporter, "export.external_data": external_data})
    output = output or Path("out") / f"{cfg.name}.onnx"
    result = export_model(cfg, output)
    if json_out:
        ui.print_json({"path": str(result.path), **result.sidecar})
        return
    con = ui.console()
    rows = [[c.axis, c.size, name, m["rel_l2"], m["max_abs"]] for c in result.checks for name, m in c.metrics.items()]
    con.print(ui.table("ONNX Runtime vs PyTorch, one dynamic axis varied at a time",
                       ["axis", "size", "output", "rel-L2", "max-abs"], rows))
    con.print(f"wrote {result.path} (opset {cfg.export.opset}, {cfg.export.exporter} exporter) in {result.seconds:.1f} s")


@app.command()
def clean(
    onnx_path: Path = typer.Argument(..., metavar="ONNX", help="The exported model."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Default: NAME.clean.onnx beside the input."),
    fold_size_limit_mb: float = typer.Option(64.0, "--fold-size-limit-mb", help="Do not fold constants larger than this."),
    tolerance: float = typer.Option(1e-5, "--tolerance", help="Max rel-L2 between the original and cleaned outputs."),
    json_out: bool = JsonOpt,
) -> None:
    """Fold constants, drop dead nodes, Identity and Dropout, infer shapes, sort; prove outputs unchanged."""
    from trtforge.graph import clean_file

    result = clean_file(onnx_path, output, fold_size_limit_mb, tolerance)
    if json_out:
        ui.print_json({"path": str(result.path), **result.sidecar, "ops_before": dict(result.before.ops),
                       "ops_after": dict(result.after.ops)})
        return
    con = ui.console()
    ops = sorted(set(result.before.ops) | set(result.after.ops), key=lambda o: -result.before.ops.get(o, 0))
    rows = [[op, result.before.ops.get(op, 0), result.after.ops.get(op, 0)] for op in ops]
    rows.append(["nodes (total)", result.before.nodes, result.after.nodes])
    rows.append(["initializer MB", result.before.initializer_bytes / 1e6, result.after.initializer_bytes / 1e6])
    con.print(ui.table(f"clean {onnx_path.name}", ["op type", "before", "after"], rows))
    worst = ", ".join(f"{k} rel-L2 {v:.1e}" for k, v in result.rel_l2.items())
    con.print(f"ONNX Runtime at two shapes: {worst} (gate {tolerance:.0e}); wrote {result.path}")


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


def main() -> None:
    """Entry point: user errors become one line on stderr and exit 2 (1 for failed gates)."""
    try:
        app(standalone_mode=False)
    except TrtforgeError as exc:
        ui.console(stderr=True).print(f"error: {exc}", markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        ui.console(stderr=True).print("interrupted: nothing was written under the final output names.", markup=False)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
