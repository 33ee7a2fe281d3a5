"""Input specs and the random feeds that checks run on.

The specs travel with the ONNX in its sidecar; an ONNX without one gets specs read from its graph,
with integer inputs drawn from {0, 1} (safe for embedding lookups and masks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError

ONNX_DTYPES = {1: "float32", 10: "float16", 7: "int64", 6: "int32", 9: "bool"}


def concrete_shape(spec: InputSpec, sizes: dict[str, int]) -> tuple[int, ...]:
    shape = []
    for dim in spec.shape:
        if isinstance(dim, str):
            if dim not in sizes:
                raise UserError(f"no size given for axis '{dim}' of input '{spec.name}'.")
            shape.append(int(sizes[dim]))
        else:
            shape.append(int(dim))
    return tuple(shape)


def random_feeds(specs: list[InputSpec], sizes: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = concrete_shape(spec, sizes)
        low, high = spec.value_range
        if spec.dtype in ("int64", "int32"):
            feeds[spec.name] = rng.integers(int(low), max(int(high), int(low) + 1), size=shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[spec.name] = rng.uniform(low, high, size=shape).astype(spec.dtype)
    return feeds


def specs_from_onnx(model: Any) -> tuple[list[InputSpec], dict[str, AxisRange]]:
    """Specs for a foreign ONNX: symbolic or unknown dims become axes sized 1..64."""
    initializers = {init.name for init in model.graph.initializer}
    specs: list[InputSpec] = []
    axes: dict[str, AxisRange] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = ONNX_DTYPES.get(tensor.elem_type)
        if dtype is None:
            raise UserError(f"input '{value.name}' has ONNX element type {tensor.elem_type}, which trtforge does not feed.")
        shape: list[int | str] = []
        for i, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(int(dim.dim_value))
            else:
                name = dim.dim_param or f"{value.name}_dim{i}"
                axes.setdefault(name, AxisRange(min=1, opt=8, max=64))
                shape.append(name)
        value_range = (0.0, 2.0) if dtype in ("int64", "int32") else (-1.0, 1.0)
        specs.append(InputSpec(name=value.name, dtype=dtype, shape=shape, value_range=value_range))
    return specs, axes


def two_shapes(axes: dict[str, AxisRange]) -> list[dict[str, int]]:
    """Two distinct size assignments inside every axis range: small (near min) and opt-plus."""
    small = {name: max(r.min, min(r.max, 2 if r.max > 2 else r.min)) for name, r in axes.items()}
    large = {name: min(r.max, max(r.opt + 3, small[name] + 1)) for name, r in axes.items()}
    return [small, large] if small != large else [small]
