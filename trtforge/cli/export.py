"""`trtforge export`: PyTorch (or a built-in model) to ONNX with its sidecar."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.core import ui


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
    opset: Optional[int] = typer.Option(
        None, "--opset", callback=opt.config_key("export.opset", "--opset"), help="ONNX opset (default 17)."
    ),
    exporter: Optional[str] = typer.Option(
        None, "--exporter", callback=opt.config_key("export.exporter", "--exporter"), help="legacy (TorchScript-based) or dynamo."
    ),
    external_data: Optional[bool] = typer.Option(None, "--external-data/--no-external-data", help="Force weights into NAME.onnx.data."),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the ONNX Runtime vs PyTorch check (the sidecar records it)."),
    kv_cache: bool = typer.Option(
        False, "--kv-cache", help="Causal decoder with explicit past/present key-value tensors per layer (config: kv_cache)."
    ),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Export a PyTorch model to ONNX and check it against PyTorch at >= 2 sizes of every dynamic axis."""
    from trtforge.export import kvcache

    if kv_cache or kvcache.config_wants_kv(config):
        return kvcache.export_command(model, config, output, opset, exporter, external_data, not no_check, json_out)
    from trtforge.core.config import ModelConfig, apply_overrides
    from trtforge.export.step import export_model, specs_from_examples
    from trtforge.models import load_model

    cfg = opt.resolve_config(model, config)
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
