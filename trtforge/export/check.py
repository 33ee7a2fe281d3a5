"""export's proof: the ONNX against torch on the same inputs, at each axis's sizes, with the largest size that works named when one fails."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.config import ModelConfig
from trtforge.core.errors import GateFailed, UserError, exception_summary
from trtforge.export.axislimits import axis_limit_error, failing_node, is_out_of_bounds, largest_working
from trtforge.models import LoadedModel
from trtforge.runtime.feeds import random_feeds
from trtforge.verify.compare import compare_outputs
from trtforge.verify.gates import screen


@dataclass
class AxisCheck:
    axis: str
    size: int
    sizes: dict[str, int]
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)


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
            raise UserError(
                f"input '{spec.name}' has rank {len(tensor.shape)} in the example but {len(spec.shape)} in the config; fix 'inputs'."
            )
        for dim, size in zip(spec.shape, tensor.shape):
            if isinstance(dim, str):
                sizes.setdefault(dim, int(size))
    for axis, rng in config.axes.items():
        sizes.setdefault(axis, rng.opt)
    return sizes


def torch_forward(call: Any, config: ModelConfig, feeds: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
    """PyTorch's outputs for `feeds`, by output name, through the same keyword call the exporter traced."""
    import torch

    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in config.inputs)
    with torch.no_grad():
        out = call(*args)
    return {name: tensor.detach().cpu().numpy() for name, tensor in zip(output_names, out)}


def check_against_torch(
    onnx_path: Path, call: Any, loaded: LoadedModel, config: ModelConfig, output_names: list[str], seed: int = 0
) -> list[AxisCheck]:
    """Vary each dynamic axis alone over its check sizes and then its configured max, and compare EVERY output with
    PyTorch; raise UserError naming the axis on a mismatch, the outputs on a count/name mismatch, the output whose
    reference is all-zero or constant (a check that cannot fail), and the axis, size and node where the model
    itself fails at its max (axislimits: MPNet's positions run out before a seq max of 512)."""
    runner = OrtRunner(onnx_path)
    require_same_outputs(output_names, list(runner.output_names))
    base = example_axis_sizes(config, loaded)
    plan = [(axis, size) for axis in config.axes for size in check_plan_sizes(config, axis)]
    if not plan:
        plan = [("(static)", 0)]
    checks = []
    passed: dict[str, int] = {}  # the largest size of each axis checked so far: where a bisection starts
    for axis, size in plan:
        sizes = dict(base)
        if axis in sizes:
            sizes[axis] = size
        at_max = axis in config.axes and size == config.axes[axis].max
        feeds = random_feeds(config.inputs, sizes, seed)
        try:
            expected = torch_forward(call, config, feeds, output_names)
        except Exception as exc:
            if not at_max:
                raise UserError(
                    f"PyTorch fails at {axis}={size} ({exception_summary(exc, 300)}); narrow axes.{axis} in the "
                    "config or fix the model for that size."
                ) from None
            raise _limit_error(
                "PyTorch",
                lambda n: torch_forward(call, config, random_feeds(config.inputs, {**sizes, axis: n}, seed), output_names),
                axis,
                size,
                exc,
                passed.get(axis, config.axes[axis].min),
                sizes,
            ) from None
        where = f"export check at {axis}={size}" if axis in sizes else "export check"
        try:
            got = runner.run(feeds)
        except Exception as exc:
            if at_max and is_out_of_bounds(str(exc)):
                raise _limit_error(
                    "ONNX Runtime",
                    lambda n: runner.run(random_feeds(config.inputs, {**sizes, axis: n}, seed)),
                    axis,
                    size,
                    exc,
                    passed.get(axis, config.axes[axis].min),
                    sizes,
                ) from None
            raise UserError(
                f"the exported graph is not dynamic in axis '{axis}': ONNX Runtime failed at {axis}={size} "
                f"(exported at {base.get(axis)}) in {failing_node(str(exc))}; the exporter baked this size into "
                "the graph, try --exporter dynamo or make the model's reshapes size-agnostic."
            ) from None
        checks.append(_compare_outputs(expected, got, AxisCheck(axis, size, sizes), config.export.tolerance, where))
        passed[axis] = max(passed.get(axis, 0), size)
    return checks


def check_plan_sizes(config: ModelConfig, axis: str) -> list[int]:
    """The sizes an axis is checked at: its check sizes, then its configured max (where the model's own limits show,
    e.g. a position table shorter than the range), the others kept at the example's sizes so this stays cheap."""
    sizes = list(config.check_sizes_for(axis))
    top = config.axes[axis].max
    return sizes if top in sizes else sizes + [top]


def _limit_error(what: str, run_at: Any, axis: str, size: int, exc: BaseException, good: int, sizes: dict[str, int]) -> UserError:
    """The axis-limit sentence for a failure at the axis' max, with the largest size that works (bisection)."""

    def works(n: int) -> bool:
        try:
            run_at(n)
            return True
        except Exception:
            return False

    return axis_limit_error(what, axis, size, exc, largest_working(works, min(good, size - 1), size), sizes)


def require_same_outputs(torch_names: list[str], onnx_names: list[str]) -> None:
    """PyTorch and the ONNX graph must return the same outputs under the same names: comparing a subset
    would leave the rest unchecked."""
    if torch_names == onnx_names:
        return
    only_torch = [n for n in torch_names if n not in onnx_names]
    only_onnx = [n for n in onnx_names if n not in torch_names]
    detail = "; ".join(
        part
        for part in (
            f"only PyTorch returns {', '.join(only_torch)}" if only_torch else "",
            f"only the ONNX graph returns {', '.join(only_onnx)}" if only_onnx else "",
            "the order differs" if not (only_torch or only_onnx) else "",
        )
        if part
    )
    raise UserError(
        f"PyTorch returns {len(torch_names)} output(s) ({', '.join(torch_names)}) but the exported graph "
        f"{len(onnx_names)} ({', '.join(onnx_names)}): {detail}; declare each output once under 'outputs' "
        "and make the module return distinct tensors."
    )


def _compare_outputs(
    expected: dict[str, np.ndarray], got: dict[str, np.ndarray], check: AxisCheck, tolerance: float, where: str
) -> AxisCheck:
    """Every output of ONNX Runtime against PyTorch's: NaN/Inf fails (exit 1), a reference that proves nothing is an
    error, and a rel-L2 above the tolerance means a size was baked into the graph."""
    axis, size = check.axis, check.size
    for name, ref in expected.items():
        cand = got[name]
        if cand.shape != ref.shape:
            raise UserError(
                f"the exported graph is not dynamic in axis '{axis}': at {axis}={size} output '{name}' has shape "
                f"{list(cand.shape)} in ONNX Runtime but {list(ref.shape)} in PyTorch; try --exporter dynamo."
            )
    per_output = compare_outputs({name: None for name in expected}, expected, got)
    check.metrics.update(per_output)
    nonfinite = screen(per_output, where, "the exported graph (ONNX Runtime)")
    if nonfinite:
        raise GateFailed(f"{where}: {nonfinite[0]}; the export was not kept.")
    for name, metrics in per_output.items():
        if not metrics["rel_l2"] <= tolerance:
            raise UserError(
                f"the exported graph is not dynamic in axis '{axis}': at {axis}={size} output '{name}' differs from "
                f"PyTorch (rel-L2 {metrics['rel_l2']:.2e} > {tolerance:.0e}); "
                "a size was baked into the graph, try --exporter dynamo."
            )
    return check
