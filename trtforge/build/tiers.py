"""`--tiers` and `--lengths`: the tier bounds a build's profiles are planned from, as the user gives them."""

from __future__ import annotations

import json
from pathlib import Path

from trtforge.build.profiles import Tier, auto_tier_bounds, tier_ranges
from trtforge.core.config import AxisRange
from trtforge.core.errors import UserError


def parse_tiers(
    spec: str | None, config_tiers: dict[str, list[int]], axes: dict[str, AxisRange], lengths: list[int] | None = None, count: int = 3
) -> dict[str, list[Tier]]:
    """'128,256,512' (the sequence axis), 'seq=128,512;batch=8,32', 'auto', or the config's tiers."""
    if not spec:
        unknown = [axis for axis in config_tiers if axis not in axes]
        if unknown:
            raise UserError(
                f"config key build.tiers names axis '{unknown[0]}', which the model does not have; its axes are: "
                f"{', '.join(axes) or 'none'}."
            )
        return {axis: tier_ranges(bounds, axes[axis], axis) for axis, bounds in config_tiers.items()}
    if spec.strip() == "auto":
        if lengths is None:
            raise UserError("--tiers auto needs real lengths; pass --lengths FILE (one integer per line).")
        default_axis = _default_tier_axis(axes)
        return {default_axis: auto_tier_bounds(lengths, count, axes[default_axis])}
    tiers = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        axis, _, values = part.rpartition("=")
        axis = axis.strip() or _default_tier_axis(axes)
        if axis not in axes:
            raise UserError(f"--tiers names axis '{axis}', which the model does not have; its axes are: {', '.join(axes)}.")
        try:
            bounds = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise UserError(f"--tiers '{part}' must be comma-separated integers, e.g. 128,256,512.") from None
        tiers[axis] = tier_ranges(bounds, axes[axis], axis)
    return tiers


def _default_tier_axis(axes: dict[str, AxisRange]) -> str:
    for name in ("seq", "sequence", "seq_len", "tokens"):
        if name in axes:
            return name
    non_batch = [a for a in axes if a != "batch"]
    if len(non_batch) == 1:
        return non_batch[0]
    raise UserError(f"--tiers must name its axis when the model has several ({', '.join(axes)}): e.g. seq=128,512.")


def read_lengths(path: Path) -> list[int]:
    if not path.is_file():
        raise UserError(f"lengths file {path} does not exist; give one integer per line.")
    try:
        text = path.read_text(encoding="utf-8").strip()
        values = json.loads(text) if text.startswith("[") else [int(line) for line in text.split() if line]
        lengths = (
            [int(v) for v in values]
            if isinstance(values, list)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() for v in values)
            else None
        )
    except (ValueError, TypeError, UnicodeDecodeError, OverflowError, RecursionError):
        lengths = None
    if lengths is None:
        raise UserError(f"lengths file {path} must hold integers, one per line (or a JSON list).")
    if any(n < 1 for n in lengths):
        raise UserError(f"lengths file {path} holds {min(lengths)}; lengths must be at least 1.")
    return lengths
