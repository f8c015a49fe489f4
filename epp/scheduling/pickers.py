"""Pickers: choose one endpoint from the weighted total scores.

All randomness comes from the `random.Random` given at construction, so a
seeded scheduler makes the same choices every run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from epp.scheduling.spec import BuildContext


class Picker(Protocol):
    def pick(self, scores: Sequence[float]) -> int:
        """The index of the chosen candidate; `scores` is never empty."""
        ...


class MaxScorePicker:
    """The highest total score; ties broken uniformly at random."""

    __slots__ = ("_rng",)

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scores: Sequence[float]) -> int:
        best = max(scores)
        first = scores.index(best)
        if scores.count(best) == 1:
            return first
        ties = [index for index in range(first, len(scores)) if scores[index] == best]
        return ties[self._rng.randrange(len(ties))]


class WeightedRandomPicker:
    """Chance proportional to score, by A-Res weighted reservoir sampling:
    the largest U^(1/score) wins, U uniform in [0, 1). Candidates scoring 0
    are chosen only when every candidate scores 0 (then uniformly)."""

    __slots__ = ("_rng",)

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scores: Sequence[float]) -> int:
        draw = self._rng.random
        best = -1
        best_key = -1.0
        for index, score in enumerate(scores):
            if score <= 0.0:
                continue
            key = draw() ** (1.0 / score)
            if key > best_key:
                best, best_key = index, key
        if best < 0:
            return self._rng.randrange(len(scores))
        return best


class RandomPicker:
    """Uniformly at random, ignoring scores."""

    __slots__ = ("_rng",)

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scores: Sequence[float]) -> int:
        return self._rng.randrange(len(scores))


# -- factories (the registry's picker types build through these) --


def max_score_picker(context: BuildContext) -> MaxScorePicker:
    return MaxScorePicker(context.rng)


def weighted_random_picker(context: BuildContext) -> WeightedRandomPicker:
    return WeightedRandomPicker(context.rng)


def random_picker(context: BuildContext) -> RandomPicker:
    return RandomPicker(context.rng)
