"""`trtforge export`: PyTorch -> ONNX, then prove the ONNX dynamic by running it.

An exporter can silently bake an example size into the graph (the legacy exporter does this to the
reshapes of nn.TransformerEncoderLayer). So after exporting, every dynamic axis is varied on its own
over >= 2 sizes while the others stay at the example size, and ONNX Runtime's outputs are compared
with PyTorch's. A failure names the axis and the size, which is what the user needs to fix it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtforge import __version__
from trtforge.artifacts import onnx_graph_hash, write_sidecar
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.config import AxisRange, InputSpec, ModelConfig
from trtforge.errors import UserError
from trtforge.feeds import random_feeds
from trtforge.metrics import compare
from trtforge.models import LoadedModel, load_model
from trtforge.onnxio import load_onnx, save_onnx

TORCH_DTYPES = {"float32": "float32", "float16": "float16", "int64": "int64", "int32": "int32", "bool": "bool"}


@dataclass
class AxisCheck:
    axis: str
    size: int
    sizes: dict[str, int]
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class ExportResult:
    path: Path
    sidecar: dict[str, Any]
    checks: list[AxisCheck]
    seconds: float


def specs_from_examples(loaded: LoadedModel) -> tuple[list[InputSpec], dict[str, AxisRange]]:
    """Without a config: dim 0 of every input is a dynamic 'batch' axis, the other dims are fixed."""
    specs, batch = [], None
    for name, tensor in loaded.example_inputs.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in TORCH_DTYPES:
            raise UserError(f"example input '{name}' has dtype {dtype}, which trtforge cannot feed; use float32/float16/int64/int32/bool.")
        shape: list[int | str] = list(tensor.shape)
        if shape:
            batch = int(shape[0])
            shape[0] = "batch"
        value_range = (0.0, 2.0) if dtype.startswith("int") else (0.0, 1.0)
        specs.append(InputSpec(name=name, dtype=dtype, shape=shape, value_range=value_range))
    axes = {"batch": AxisRange(min=1, opt=batch, max=max(16, 4 * batch))} if batch else {}
    return specs, axes


def example_axis_sizes(config: ModelConfig, loaded: LoadedModel) -> dict[str, int]:
    """Size of each named axis in the example inputs (falls back to the axis' opt)."""
    sizes: dict[str, int] = {}
    for spec in config.inputs:
        tensor = loaded.example_inputs.get(spec.name)
        if tensor is None:
            raise UserError(
                f"the model's example inputs have no '{spec.name}' (they have {', '.join(loaded.example_inputs)}); "
                "fix the input names in the config."
            )
        if len(tensor.shape) != len(spec.shape):
            raise UserError(f"input '{spec.name}' has rank {len(tensor.shape)} in the example but {len(spec.shape)} in the config; fix 'inputs'.")
        for dim, size in zip(spec.shape, tensor.shape):
            if isinstance(dim, str):
                sizes.setdefault(dim, int(size))
    for axis, rng in config.axes.items():
        sizes.setdefault(axis, rng.opt)
    return sizes


def _torch_forward(module: Any, config: ModelConfig, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import torch

    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in config.inputs)
    with torch.no_grad():
        out = module(*args)
    if isinstance(out, torch.Tensor):
        out = (out,)
    elif isinstance(out, dict):
        out = tuple(out.values())
    elif hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [o.detach().cpu().numpy() for o in out if isinstance(o, torch.Tensor)]


def _run_exporter(loaded: LoadedModel, config: ModelConfig, output_names: list[str], path: Path) -> None:
    import torch

    args = tuple(loaded.example_inputs[s.name] for s in config.inputs)
    dynamic_axes = {k: v for k, v in config.dynamic_axes().items() if v}
    opts = dict(input_names=[s.name for s in config.inputs], output_names=output_names,
                dynamic_axes=dynamic_axes or None, opset_version=config.export.opset)
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            if config.export.exporter == "dynamo":
                program = torch.onnx.export(loaded.module, args, dynamo=True, verbose=False, **opts)
                program.save(str(path), external_data=config.export.external_data)
            else:
                torch.onnx.export(loaded.module, args, str(path), dynamo=False, do_constant_folding=True, **opts)
    except UserError:
        raise
    except Exception as exc:
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise UserError(
            f"the {config.export.exporter} exporter failed at opset {config.export.opset}: {message}; "
            "try another --opset or --exporter."
        ) from None


def check_against_torch(onnx_path: Path, loaded: LoadedModel, config: ModelConfig, output_names: list[str],
                        seed: int = 0) -> list[AxisCheck]:
    """Vary each dynamic axis alone over its check sizes; raise UserError naming the axis on a mismatch."""
    runner = OrtRunner(onnx_path)
    base = example_axis_sizes(config, loaded)
    plan = [(axis, size) for axis in config.axes for size in config.check_sizes_for(axis)]
    if not plan:
        plan = [("(static)", 0)]
    checks = []
    for axis, size in plan:
        sizes = dict(base)
        if axis in sizes:
            sizes[axis] = size
        feeds = random_feeds(config.inputs, sizes, seed)
        expected = _torch_forward(loaded.module, config, feeds)
        try:
            got = runner.run(feeds)
        except Exception as exc:
            raise UserError(
                f"the exported graph is not dynamic in axis '{axis}': ONNX Runtime failed at {axis}={size} "
                f"(exported at {base.get(axis)}) in {_failing_node(str(exc))}; the exporter baked this size into "
                "the graph, try --exporter dynamo or make the model's reshapes size-agnostic."
            ) from None
        check = AxisCheck(axis, size, sizes)
        for name, ref in zip(output_names, expected):
            cand = got[name]
            if cand.shape != ref.shape:
                raise UserError(
                    f"the exported graph is not dynamic in axis '{axis}': at {axis}={size} output '{name}' has shape "
                    f"{list(cand.shape)} in ONNX Runtime but {list(ref.shape)} in PyTorch; try --exporter dynamo."
                )
            check.metrics[name] = compare(ref, cand)
            if check.metrics[name]["rel_l2"] > config.export.tolerance:
                raise UserError(
                    f"the exported graph is not dynamic in axis '{axis}': at {axis}={size} output '{name}' differs from "
                    f"PyTorch (rel-L2 {check.metrics[name]['rel_l2']:.2e} > {config.export.tolerance:.0e}); "
                    "a size was baked into the graph, try --exporter dynamo."
                )
        checks.append(check)
    return checks


def _failing_node(message: str) -> str:
    """'Reshape node /attn/Reshape_4' from an ORT error, else the error's first words."""
    match = re.search(r"running (\w+) node\. Name:'([^']*)'", message)
    if match:
        return f"{match.group(1)} node '{match.group(2)}'"
    return "the graph: " + " ".join(message.split())[:200]


def output_specs(model: Any) -> list[dict[str, Any]]:
    from trtforge.feeds import ONNX_DTYPES

    specs = []
    for value in model.graph.output:
        tensor = value.type.tensor_type
        dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in tensor.shape.dim]
        specs.append({"name": value.name, "dtype": ONNX_DTYPES.get(tensor.elem_type, str(tensor.elem_type)), "shape": dims})
    return specs


def export_model(config: ModelConfig, output: Path, seed: int = 0, check: bool = True) -> ExportResult:
    import tempfile

    import torch

    start = time.perf_counter()
    loaded = load_model(config.model.source, config.model.kwargs, [s.name for s in config.inputs])
    output_names = config.output_names() or loaded.output_names
    if not output_names:
        output_names = ["output_0"]
    output = Path(output)
    with tempfile.TemporaryDirectory(prefix="trtforge-export-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        _run_exporter(loaded, config, output_names, raw)
        model = load_onnx(raw)
        # ORT must see the final file layout; check the raw export, then save it atomically.
        actual_outputs = [o.name for o in model.graph.output]
        checks = check_against_torch(raw, loaded, config, actual_outputs, seed) if check else []
        sidecar = {
            "kind": "onnx",
            "step": "export",
            "trtforge_version": __version__,
            "source": config.model.source,
            "config_name": config.name,
            "torch_version": torch.__version__,
            "exporter": config.export.exporter,
            "opset": config.export.opset,
            "inputs": [s.model_dump() for s in config.inputs],
            "axes": {k: v.model_dump() for k, v in config.axes.items()},
            "outputs": output_specs(model),
            "graph_hash": onnx_graph_hash(model),
            "check": [
                {"axis": c.axis, "size": c.size, "sizes": c.sizes, "metrics": c.metrics} for c in checks
            ],
            "check_tolerance": config.export.tolerance,
            "checked": check,
        }
        save_onnx(model, output, external_data=True if config.export.external_data else None)
    seconds = time.perf_counter() - start
    sidecar["seconds"] = round(seconds, 3)
    write_sidecar(output, sidecar)
    return ExportResult(output, sidecar, checks, seconds)
