import random
from collections import Counter

from epp.scheduling.pickers import (
    MaxScorePicker,
    RandomPicker,
    WeightedRandomPicker,
)


def test_max_score_picks_the_highest_score():
    assert MaxScorePicker(random.Random(1)).pick([0.1, 0.9, 0.5]) == 1


def test_max_score_breaks_ties_at_random():
    picker = MaxScorePicker(random.Random(1))
    picks = Counter(picker.pick([0.2, 1.0, 1.0, 1.0]) for _ in range(300))
    assert set(picks) == {1, 2, 3}


def test_max_score_ties_follow_the_seed():
    scores = [1.0] * 8
    first = [MaxScorePicker(random.Random(7)).pick(scores) for _ in range(5)]
    again = [MaxScorePicker(random.Random(7)).pick(scores) for _ in range(5)]
    assert first == again


def test_weighted_random_picks_in_proportion_to_score():
    picker = WeightedRandomPicker(random.Random(3))
    picks = Counter(picker.pick([1.0, 3.0]) for _ in range(4000))
    assert 0.70 < picks[1] / 4000 < 0.80


def test_weighted_random_never_picks_a_zero_score_beside_a_positive_one():
    picker = WeightedRandomPicker(random.Random(3))
    assert {picker.pick([0.0, 0.5, 0.0]) for _ in range(100)} == {1}


def test_weighted_random_picks_uniformly_when_every_score_is_zero():
    picker = WeightedRandomPicker(random.Random(3))
    assert {picker.pick([0.0, 0.0, 0.0]) for _ in range(200)} == {0, 1, 2}


def test_random_picker_ignores_scores():
    picker = RandomPicker(random.Random(5))
    assert {picker.pick([0.0, 9.0, 0.0]) for _ in range(200)} == {0, 1, 2}
