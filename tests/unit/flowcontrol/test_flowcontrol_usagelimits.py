"""Usage-limit policies: the reference's ceilings per band."""

import pytest

from epp.flowcontrol.usagelimits import (
    Domain,
    PriorityHoldback,
    SoftReflectiveCeiling,
    StaticUsageLimit,
)

PRIORITIES = (10, 0, -5)


def ceilings(policy, saturation=0.0, priorities=PRIORITIES):
    count = len(priorities)
    return [policy.ceiling(rank, count, priorities, saturation) for rank in range(count)]


def test_static_gives_every_band_its_threshold():
    assert ceilings(StaticUsageLimit(0.8)) == [0.8, 0.8, 0.8]


def test_holdback_by_rank_steps_evenly_from_max_to_min():
    assert ceilings(PriorityHoldback(0.4, 0.9)) == pytest.approx([0.9, 0.65, 0.4])


def test_holdback_by_value_follows_the_priority_values():
    policy = PriorityHoldback(0.4, 0.9, Domain.VALUE)
    assert ceilings(policy) == pytest.approx([0.9, 0.4 + 5 / 15 * 0.5, 0.4])


def test_holdback_of_one_band_or_equal_values_holds_nothing_back():
    assert ceilings(PriorityHoldback(0.4, 0.9), priorities=(3,)) == [0.9]
    assert ceilings(PriorityHoldback(0.4, 0.9, Domain.VALUE), priorities=(3, 3)) == [0.9, 0.9]


def test_holdback_refuses_a_min_ceiling_not_below_the_max():
    with pytest.raises(ValueError, match="minCeiling < maxCeiling"):
        PriorityHoldback(0.9, 0.9)


def test_reflective_leaves_bands_below_their_reflected_ceiling_open():
    assert ceilings(SoftReflectiveCeiling(), saturation=0.3) == [1.0, 1.0, 1.0]


def test_reflective_closes_every_band_but_the_top_at_saturation():
    assert ceilings(SoftReflectiveCeiling(), saturation=1.0) == [1.0, 0.0, 0.0]


def test_reflective_opens_a_gated_band_once_per_period():
    policy = SoftReflectiveCeiling()
    # saturation 0.75: the lowest band (ceiling 0.25) is past it, period 3
    opened = [policy.ceiling(2, 3, PRIORITIES, 0.75) for _ in range(9)]
    assert opened == [0.0, 0.0, 1.0] * 3
