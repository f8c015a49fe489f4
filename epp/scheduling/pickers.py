"""Pickers: choose one endpoint from the weighted total scores, and with
`count` (the reference's `maxNumOfEndpoints`) > 1 rank the candidates for
the fallbacks sent after it (`rank`: best first, as the reference's picker
orders its `count` endpoints).

All randomness comes from the `random.Random` given at construction, so a
seeded scheduler makes the same choices every run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import compress, islice, repeat
from operator import eq
from typing import Protocol

from epp.scheduling.spec import BuildContext


class Picker(Protocol):
    count: int
    """Endpoints the picker returns: the destination and `count - 1` fallbacks."""

    def pick(self, scores: Sequence[float]) -> int:
        """The index of the chosen candidate; `scores` is never empty."""
        ...

    def rank(self, scores: Sequence[float]) -> list[int]:
        """Every candidate's index, in the order the picker prefers them."""
        ...


def _shuffled(rng: random.Random, size: int) -> list[int]:
    order = list(range(size))
    rng.shuffle(order)
    return order


class _DrawingPicker:
    """What every picker here holds: the caller's rng, its only source of
    randomness, and the `count` of endpoints it returns."""

    __slots__ = ("_rng", "count")

    def __init__(self, rng: random.Random, count: int = 1) -> None:
        self._rng = rng
        self.count = count


class MaxScorePicker(_DrawingPicker):
    """The highest total score; ties broken uniformly at random."""

    __slots__ = ()

    def rank(self, scores: Sequence[float]) -> list[int]:
        """Highest score first, ties in random order."""
        return sorted(_shuffled(self._rng, len(scores)), key=lambda index: -scores[index])

    def pick(self, scores: Sequence[float]) -> int:
        best = max(scores)
        first = scores.index(best)
        count = scores.count(best)
        if count == 1:
            return first
        # The tie drawn among the `count` at the best score, in index order,
        # found without a Python loop over the candidates.
        tail = map(eq, islice(scores, first, None), repeat(best))
        ties = compress(range(first, len(scores)), tail)
        return next(islice(ties, self._rng.randrange(count), None))


class WeightedRandomPicker(_DrawingPicker):
    """Chance proportional to score, by A-Res weighted reservoir sampling:
    the largest U^(1/score) wins, U uniform in [0, 1). Candidates scoring 0
    are chosen only when every candidate scores 0 (then uniformly)."""

    __slots__ = ()

    def rank(self, scores: Sequence[float]) -> list[int]:
        """By descending key U^(1/score); zero scores last (all zero: uniformly)."""
        if not any(score > 0.0 for score in scores):
            return _shuffled(self._rng, len(scores))
        draw = self._rng.random
        keys = [draw() ** (1.0 / score) if score > 0.0 else 0.0 for score in scores]
        return sorted(range(len(scores)), key=lambda index: -keys[index])

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


class RandomPicker(_DrawingPicker):
    """Uniformly at random, ignoring scores."""

    __slots__ = ()

    def rank(self, scores: Sequence[float]) -> list[int]:
        return _shuffled(self._rng, len(scores))

    def pick(self, scores: Sequence[float]) -> int:
        return self._rng.randrange(len(scores))


# -- factories (the registry's picker types build through these) --


def max_score_picker(context: BuildContext, count: int = 1) -> MaxScorePicker:
    return MaxScorePicker(context.rng, count)


def weighted_random_picker(context: BuildContext, count: int = 1) -> WeightedRandomPicker:
    return WeightedRandomPicker(context.rng, count)


def random_picker(context: BuildContext, count: int = 1) -> RandomPicker:
    return RandomPicker(context.rng, count)
