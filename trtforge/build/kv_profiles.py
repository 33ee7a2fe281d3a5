"""Optimization profiles for KV-cache engines: the prefill and decode phases as profiles, and which one a step uses."""

from __future__ import annotations

import math
from typing import Any

from trtforge.build.profiles import Profile, Tier, plan_profiles, select_profile, tier_ranges, validate_profiles
from trtforge.core.config import InputSpec
from trtforge.core.errors import UserError


def plan_kv_profiles(
    specs: list[InputSpec], axes: dict[str, Any], tiers: dict[str, list[Tier]], kv: dict[str, Any]
) -> tuple[list[Profile], dict[str, Any]]:
    """Prefill profiles: seq (chunk) tiers x past tiers (the given ones, else the export config's);
    one decode profile: seq = 1 over past 1..max. Returns the profiles and which phase each serves."""
    seq_axis, past_axis = kv["seq_axis"], kv["past_axis"]
    prefill_tiers = dict(tiers)
    for axis in (seq_axis, past_axis):
        if axis not in prefill_tiers:
            prefill_tiers[axis] = tier_ranges(list(kv["tiers"][axis]), axes[axis], axis)
    prefill = plan_profiles(specs, axes, prefill_tiers)
    past = axes[past_axis]
    low = max(1, past.min)
    decode_tiers = {**prefill_tiers, seq_axis: [Tier(1, 1, 1)], past_axis: [Tier(low, max(low, past.opt), past.max)]}
    decode = plan_profiles(specs, axes, decode_tiers)
    profiles = prefill + decode
    for i, profile in enumerate(profiles):
        profile.index = i
    validate_profiles(profiles, specs, axes)
    phases = {"prefill": [p.index for p in prefill], "decode": [p.index for p in decode], "seq_axis": seq_axis, "past_axis": past_axis}
    return profiles, phases


def suggest_tier(length: int) -> int:
    """A past tier that holds `length`: the next multiple of 1024 (of 256 below 1024)."""
    step = 1024 if length > 1024 else 256
    return int(math.ceil(length / step) * step)


def select_phase_profile(
    profiles: list[Profile],
    phases: dict[str, Any],
    phase: str,
    seq: int,
    past: int,
    batch: dict[str, int] | None = None,
    where: str = "the engine",
    engine: bool = True,
) -> Profile:
    """The profile of this phase for a step of `seq` new tokens over a cache of `past`; one-sentence
    errors name the chunk or the cache length and what to rebuild with."""
    pool = [p for p in profiles if p.index in phases[phase]]
    seq_axis, past_axis = phases["seq_axis"], phases["past_axis"]
    seq_max = max(p.axes[seq_axis].max for p in pool)
    past_max = max(p.axes[past_axis].max for p in pool)
    if seq > seq_max:
        raise UserError(
            f"chunk {seq} is larger than the {phase} seq max of {where} ({seq_max}); pass --chunk {seq_max} or less, "
            f"or {'rebuild with a seq tier of' if engine else 're-export with a seq axis max of'} {seq}."
        )
    if past > past_max:
        tiers = sorted({p.axes[past_axis].max for p in pool})
        fix = (
            f"rebuild with --tiers '{past_axis}={','.join(map(str, tiers + [suggest_tier(past)]))}'"
            if engine
            else f"re-export with kv_cache.past.max >= {suggest_tier(past)}"
        )
        raise UserError(
            f"a {phase} step needs a cache of {past} tokens but the past max of {where} is {past_max}; add a past tier "
            f"of {suggest_tier(past)} ({fix}) or shorten the input."
        )
    return select_profile(pool, {seq_axis: seq, past_axis: past, **(batch or {})})


# -- command line ----------------------------------------------------------------------------------
