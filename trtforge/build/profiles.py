"""Tiered optimization profiles, and choosing the profile for a given shape. Pure functions.

A tier list per dynamic axis, e.g. seq [128, 512, 2048] with the axis' min 1, gives the ranges
1-128, 129-512, 513-2048. Each tier is one TensorRT optimization profile, so a short input runs on
kernels tuned for short inputs instead of the ones tuned for the longest. Several tiered axes
(height and width) give the cartesian product of their tiers. Untiered axes keep their min/opt/max.

Opt of a configured tier: the axis' opt when it falls inside the tier, else the tier's max (chunked
inference fills chunks to the tier's max, so that is the shape that runs most).

`--tiers auto` rule (documented in the README): K tiers from a sample of real lengths. The upper
bound of tier i is the i/K quantile of the lengths, rounded up to a multiple of `align` (8: tensor
core friendly) and clipped to the axis range; the last tier always ends at the axis' max so that every
admissible length has a profile. Duplicate bounds are merged. Opt of a tier is the median of the
lengths that fall in it (its max when none do).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError


@dataclass(frozen=True)
class Tier:
    min: int
    opt: int
    max: int


@dataclass
class Profile:
    """One optimization profile: min/opt/max sizes per named axis, and shapes per input."""

    index: int
    axes: dict[str, Tier]
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{a} {t.min}..{t.max} (opt {t.opt})" for a, t in self.axes.items())

    def contains(self, sizes: dict[str, int]) -> bool:
        return all(self.axes[a].min <= s <= self.axes[a].max for a, s in sizes.items() if a in self.axes)

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "axes": {a: [t.min, t.opt, t.max] for a, t in self.axes.items()},
            "shapes": {n: {"min": list(s[0]), "opt": list(s[1]), "max": list(s[2])} for n, s in self.shapes.items()},
        }


def tier_ranges(bounds: list[int], axis: AxisRange, axis_name: str = "axis") -> list[Tier]:
    """[128, 512] over axis min 1 -> tiers 1..128, 129..512, each with its opt (see module doc)."""
    if not bounds:
        raise UserError(f"the tier list for axis '{axis_name}' is empty; give at least one upper bound.")
    if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
        raise UserError(f"tiers for axis '{axis_name}' must be strictly increasing, got {bounds}.")
    if bounds[0] < axis.min or bounds[-1] > axis.max:
        raise UserError(
            f"tiers for axis '{axis_name}' ({bounds}) leave its range {axis.min}..{axis.max}; "
            "keep every bound inside the axis' min and max."
        )
    tiers, low = [], axis.min
    for high in bounds:
        opt = axis.opt if low <= axis.opt <= high else high
        tiers.append(Tier(low, opt, high))
        low = high + 1
    return tiers


def auto_tier_bounds(lengths: list[int] | np.ndarray, k: int, axis: AxisRange, align: int = 8) -> list[Tier]:
    """K tiers from a length sample: quantile bounds rounded up to `align`, opt = median within the tier."""
    values = np.asarray(lengths, dtype=np.int64)
    if values.size == 0:
        raise UserError("no lengths to derive tiers from; give a lengths file or calibration data with samples.")
    if k < 1:
        raise UserError(f"the number of auto tiers must be >= 1, got {k}.")
    values = np.clip(values, axis.min, axis.max)
    bounds = []
    for i in range(1, k + 1):
        q = float(np.quantile(values, i / k, method="higher"))
        bound = min(axis.max, max(axis.min, int(math.ceil(q / align) * align)))
        bounds.append(bound)
    bounds[-1] = axis.max
    bounds = sorted(set(bounds))
    tiers, low = [], axis.min
    for high in bounds:
        inside = values[(values >= low) & (values <= high)]
        opt = int(np.median(inside)) if inside.size else high
        tiers.append(Tier(low, min(max(opt, low), high), high))
        low = high + 1
    return tiers


def plan_profiles(specs: list[InputSpec], axes: dict[str, AxisRange], tiers: dict[str, list[Tier]]) -> list[Profile]:
    """One profile per combination of tiers; shapes per input filled in from the axis tiers."""
    for name in tiers:
        if name not in axes:
            raise UserError(f"tiers are given for axis '{name}', which no input uses; tier one of: {', '.join(axes)}.")
    per_axis = {name: tiers.get(name) or [Tier(r.min, r.opt, r.max)] for name, r in axes.items()}
    names = list(per_axis)
    profiles = []
    for i, combo in enumerate(itertools.product(*(per_axis[n] for n in names))):
        chosen = dict(zip(names, combo))
        profile = Profile(i, chosen)
        for spec in specs:
            dims = [(d, d, d) if isinstance(d, int) else (chosen[d].min, chosen[d].opt, chosen[d].max) for d in spec.shape]
            profile.shapes[spec.name] = tuple(tuple(x[j] for x in dims) for j in range(3))  # type: ignore[assignment]
        profiles.append(profile)
    validate_profiles(profiles, specs, axes)
    return profiles


def validate_profiles(profiles: list[Profile], specs: list[InputSpec], axes: dict[str, AxisRange]) -> None:
    """Check before building: every input shaped, min <= opt <= max, inside the axis range, static dims fixed."""
    if not profiles:
        raise UserError("no optimization profiles to build; declare the model's axes or tiers.")
    for profile in profiles:
        for spec in specs:
            if spec.name not in profile.shapes:
                raise UserError(f"profile {profile.index} has no shapes for input '{spec.name}'.")
            lo, opt, hi = profile.shapes[spec.name]
            if not (len(lo) == len(opt) == len(hi) == len(spec.shape)):
                raise UserError(f"profile {profile.index}: input '{spec.name}' has shapes of rank {len(lo)}, expected {len(spec.shape)}.")
            for d, dim in enumerate(spec.shape):
                if not lo[d] <= opt[d] <= hi[d]:
                    raise UserError(
                        f"profile {profile.index}: input '{spec.name}' dim {d} needs min <= opt <= max, got {lo[d]}/{opt[d]}/{hi[d]}."
                    )
                if isinstance(dim, int) and not lo[d] == hi[d] == dim:
                    raise UserError(f"profile {profile.index}: input '{spec.name}' dim {d} is static ({dim}) but the profile varies it.")
                if isinstance(dim, str) and (lo[d] < axes[dim].min or hi[d] > axes[dim].max):
                    raise UserError(
                        f"profile {profile.index}: input '{spec.name}' axis '{dim}' range {lo[d]}..{hi[d]} leaves the "
                        f"declared {axes[dim].min}..{axes[dim].max}."
                    )


def select_profile(profiles: list[Profile], sizes: dict[str, int]) -> Profile:
    """The smallest profile (by max volume of its tiered axes) that holds these axis sizes."""
    fitting = [p for p in profiles if p.contains(sizes)]
    if not fitting:
        ranges = "; ".join(f"profile {p.index}: {p.describe()}" for p in profiles)
        shown = ", ".join(f"{a}={s}" for a, s in sizes.items())
        raise UserError(f"no optimization profile holds {shown} ({ranges}); rebuild with larger tiers or enable chunking.")
    return min(fitting, key=lambda p: (math.prod(t.max for t in p.axes.values()), p.index))


def profiles_from_json(data: list[dict]) -> list[Profile]:
    profiles = []
    for item in data:
        axes = {a: Tier(*v) for a, v in item["axes"].items()}
        shapes = {n: (tuple(s["min"]), tuple(s["opt"]), tuple(s["max"])) for n, s in item.get("shapes", {}).items()}
        profiles.append(Profile(int(item["index"]), axes, shapes))
    return profiles


# A build is "slow" past this many reference images' worth of profile max shapes: TensorRT tunes every
# profile separately, and large max shapes mean large workspaces and slow kernels to time.
SLOW_BUILD_REFERENCE_ELEMENTS = 3 * 512 * 512  # one 512x512 RGB image
SLOW_BUILD_BUDGET = 4.0
SLOW_BUILD_PROFILES = 8


def slow_build_warning(profiles: list[Profile]) -> str | None:
    """One line naming why a build will be slow and what to do, or None. Pure.

    Cost = sum over profiles of the largest input's max-shape element count, in units of a 512x512 RGB
    image. DeepLabV3 with height and width tiers 256,1024 (4 profiles up to 1x3x1024x1024) scores 6.25;
    MiniLM with three sequence tiers up to 32x512 scores 0.06."""
    if not profiles:
        return None
    largest = [max(((math.prod(s[2]), name, s[2]) for name, s in p.shapes.items()), default=(0, "", ())) for p in profiles]
    cost = sum(count for count, _, _ in largest) / SLOW_BUILD_REFERENCE_ELEMENTS
    if cost <= SLOW_BUILD_BUDGET and len(profiles) <= SLOW_BUILD_PROFILES:
        return None
    count, name, shape = max(largest)
    index = largest.index((count, name, shape))
    return (
        f"slow build ahead: {len(profiles)} optimization profiles, the largest max shape is input '{name}' "
        f"{'x'.join(map(str, shape))} (profile {profiles[index].index}, {count / 1e6:.1f}M elements), about "
        f"{cost:.1f}x the work of one 512x512 image; TensorRT tunes each profile separately: use fewer tiers, "
        "a smaller max, --optimization-level 2 or lower, or --timing-cache FILE to reuse timings."
    )
