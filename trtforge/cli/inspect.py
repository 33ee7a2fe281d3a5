"""`trtforge inspect`: what an engine or ONNX file is, read from it and its sidecar."""

from __future__ import annotations

from pathlib import Path

import typer

from trtforge.cli import options as opt
from trtforge.cli import render
from trtforge.core import ui
from trtforge.core.errors import UserError


def inspect(
    engine: Path = typer.Argument(..., metavar="ENGINE", help="An engine built by trtforge build."),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Print an engine's sidecar and its layers by type and precision."""
    import json as _json

    from trtforge.build.engine_record import read_engine_sidecar

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
                from trtforge.backends.engine_layers import summarize_layers

                summary = summarize_layers(layers)
            if fusion and "engine" not in fusion:
                from trtforge.fusion.engine_evidence import attention_evidence

                fusion["engine"] = attention_evidence(fusion, layers, len(side["profiles"]))
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            raise unreadable from None
    if json_out:
        ui.print_json({"path": str(engine), **side, "layer_summary": summary})
        return
    render.engine(side, engine, summary)
    render.engine_check(side.get("engine_check"))
