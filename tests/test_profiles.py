import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtforge.build.profiles import Tier, auto_tier_bounds, plan_profiles, select_profile, tier_ranges
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError

SEQ = AxisRange(min=1, opt=128, max=2048)
SPECS = [InputSpec(name="ids", dtype="int64", shape=["batch", "seq"]), InputSpec(name="mask", dtype="int64", shape=["batch", "seq"])]
AXES = {"batch": AxisRange(min=1, opt=8, max=32), "seq": SEQ}


def test_issue_example_tiers():
    tiers = tier_ranges([128, 512, 2048], SEQ, "seq")
    assert [(t.min, t.max) for t in tiers] == [(1, 128), (129, 512), (513, 2048)]
    assert tiers[0].opt == 128 and tiers[1].opt == 512 and tiers[2].opt == 2048


def test_tier_errors_name_the_axis():
    with pytest.raises(UserError, match="axis 'seq'.*strictly increasing"):
        tier_ranges([512, 128], SEQ, "seq")
    with pytest.raises(UserError, match="axis 'seq'.*leave its range 1..2048"):
        tier_ranges([128, 4096], SEQ, "seq")
    with pytest.raises(UserError, match="empty"):
        tier_ranges([], SEQ, "seq")


def test_plan_profiles_shapes_and_batch_kept():
    profiles = plan_profiles(SPECS, AXES, {"seq": tier_ranges([128, 512, 2048], SEQ)})
    assert len(profiles) == 3
    assert profiles[1].shapes["ids"] == ((1, 129), (8, 512), (32, 512))
    assert profiles[1].shapes["mask"] == profiles[1].shapes["ids"]


def test_two_tiered_axes_give_the_product():
    img = [InputSpec(name="image", shape=["batch", 3, "h", "w"])]
    axes = {"batch": AxisRange(min=1, opt=1, max=4), "h": AxisRange(min=16, opt=256, max=1024), "w": AxisRange(min=16, opt=256, max=1024)}
    profiles = plan_profiles(img, axes, {"h": tier_ranges([256, 1024], axes["h"]), "w": tier_ranges([256, 1024], axes["w"])})
    assert len(profiles) == 4
    assert profiles[0].shapes["image"][2] == (4, 3, 256, 256)


def test_unknown_tier_axis():
    with pytest.raises(UserError, match="axis 'tokens'"):
        plan_profiles(SPECS, AXES, {"tokens": [Tier(1, 1, 2)]})


def test_select_smallest_fitting_profile():
    profiles = plan_profiles(SPECS, AXES, {"seq": tier_ranges([128, 512, 2048], SEQ)})
    assert select_profile(profiles, {"batch": 4, "seq": 100}).index == 0
    assert select_profile(profiles, {"batch": 4, "seq": 129}).index == 1
    assert select_profile(profiles, {"batch": 4, "seq": 2048}).index == 2
    with pytest.raises(UserError, match="no optimization profile holds .*seq=4096"):
        select_profile(profiles, {"batch": 4, "seq": 4096})


def test_auto_tiers_rule():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(10, 60, 800), rng.integers(200, 300, 150), rng.integers(900, 1500, 50)])
    tiers = auto_tier_bounds(lengths, 3, SEQ)
    bounds = [t.max for t in tiers]
    assert bounds[-1] == 2048 and all(b % 8 == 0 for b in bounds)
    # 1/3 and 2/3 quantiles both fall in the short cluster here: bounds are merged, not duplicated.
    assert len(set(bounds)) == len(bounds)
    for t in tiers:
        inside = lengths[(lengths >= t.min) & (lengths <= t.max)]
        if inside.size:
            assert t.opt == int(np.median(inside))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=200), st.integers(1, 6))
def test_auto_tiers_cover_the_axis_contiguously(lengths, k):
    tiers = auto_tier_bounds(lengths, k, SEQ)
    assert tiers[0].min == SEQ.min and tiers[-1].max == SEQ.max
    for a, b in zip(tiers, tiers[1:]):
        assert b.min == a.max + 1
    assert all(t.min <= t.opt <= t.max for t in tiers)
    assert len(tiers) <= k
