"""The scheduler: filter, score, pick, per profile. It is the flow-control
core's `Placer`.

For each request it takes the current pool snapshot and narrows it:
1. Envoy's subset hint, if any (no match: the request ends with
   `rejected-no-endpoints`);
2. endpoints with fresh metrics below the saturation thresholds
   (`epp.scheduling.saturation`), failing
   open only when no endpoint qualifies: first to the endpoints whose latest
   metrics read succeeded (alive, if saturated), then to all of step 1.
   When some qualify but have no credit, the request waits: an endpoint
   whose reads fail is likely dead, and a dead endpoint frees its credits
   fastest of all;
3. endpoints with an in-flight credit left in the concurrency gate, if one
   is given (none: the request waits at the head of its queue until a
   completion frees a credit).
Data producers first publish what they read from the request (a session
id). The profile handler (`profiles`) then runs one or more profiles. A profile
(`ProfileRunner`) applies its filters to those candidates (to the
fresh-and-unsaturated ones first, then the reachable ones, then all: a
label filter must not fall back to endpoints it excludes; when it excludes
every endpoint the request ends with `REJECTED_FILTERED`, which the
reference answers 429 `rejected-saturated`); every
scorer rates the candidates in [0, 1], the weighted scores are summed, the
picker chooses, and the scorers are told where the request went (the
prefix scorer records the prompt's blocks there). Once the request is
placed, plugins with a `placed` hook (session affinity) learn every
profile's endpoint. Each configured plugin is built once and shared by the
profiles that name it.

Step 3 is applied lazily: the candidates of step 2 are scored first, and
only if the chosen endpoint has no credit left are all full endpoints
removed and the rest scored again. The result is the same as filtering
first; the common case (the choice has room) costs one credit check
instead of one per endpoint.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType

from epp.flowcontrol.gate import Credits, Placement
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.config import ProfileConfig, SchedulingConfig
from epp.scheduling.endpoint import Endpoint, PoolSnapshot
from epp.scheduling.filters import in_subset, reachable, with_room
from epp.scheduling.inflight import InFlightLoad
from epp.scheduling.kvblocks import KVBlockIndex
from epp.scheduling.profiles import DisaggProfileHandler, ProfileHandler, SingleProfileHandler
from epp.scheduling.request import InferenceRequest
from epp.scheduling.saturation import unsaturated
from epp.scheduling.scorers import Scorer, SparseScorer, StatelessScorer
from epp.scheduling.spec import BuildContext, PluginTimer
from epp.scheduling.stages import DECODE, PREFILL, PrefillCredits

NO_MAP: Mapping[str, float] = MappingProxyType({})
"""What no sparse scorer returns: the maps kept before any sum."""

DENSE_SHARE = 4
"""A sparse scorer naming at least 1 in `DENSE_SHARE` candidates is added as a
whole column rather than name by name."""


class Scheduler:
    """Chooses the endpoint for each request; see the module docstring.

    `pool` returns the latest snapshot, `clock` the current time (seconds,
    same clock as the snapshot's `updated_at`), `rng` drives every random
    choice, and `concurrency`, when given, is the gate whose per-endpoint
    credits bound where a request may go. `plugin_timer`, when given, times
    each data producer, filter, scorer and picker call (see `spec`).
    """

    __slots__ = (
        "_clock",
        "_config",
        "_handler",
        "_healthy",
        "_healthy_until",
        "_healthy_version",
        "_known",
        "_membership",
        "_named",
        "_placed",
        "_plugins",
        "_pool",
        "_producers",
        "_reachable",
        "_reachable_of",
        "_runners",
        "_single",
        "endpoints_now",
        "healthy_now",
        "kv_index",
        "load",
        "picks",
        "priority_now",
        "scorers",
        "waiting_for",
    )

    def __init__(
        self,
        config: SchedulingConfig,
        pool: Callable[[], PoolSnapshot],
        clock: Callable[[], float],
        rng: random.Random,
        concurrency: Credits | None = None,
        prefill_credits: PrefillCredits | None = None,
        load: InFlightLoad | None = None,
        plugin_timer: PluginTimer | None = None,
        kv_index: KVBlockIndex | None = None,
    ) -> None:
        self._config = config
        self._pool = pool
        self._clock = clock
        context = BuildContext(
            config,
            rng,
            concurrency,
            clock=clock,
            load=load,
            timer=plugin_timer,
            pool=pool,
            kv_index=kv_index,
        )
        self._producers = tuple(
            context.timed("DataProducer", producer, context.build(producer).produce)
            for producer in config.producers
        )
        self._runners = {
            profile.name: ProfileRunner(self, profile, context, concurrency)
            for profile in config.profiles
        }
        # After the profiles: a decider finds the plugins they built.
        self._handler: ProfileHandler = context.build(config.handler)
        handler = self._handler
        if prefill_credits is not None and isinstance(handler, DisaggProfileHandler):
            prefill = self._runners.get(handler.prefill)
            if prefill is not None:
                prefill.credits = prefill_credits
                prefill.stage = PREFILL
        self._single = (
            next(iter(self._runners.values()))
            if isinstance(self._handler, SingleProfileHandler)
            else None
        )
        self._plugins = tuple(context.built.values())
        self._named = MappingProxyType(dict(context.built))
        self._placed = tuple(
            plugin.placed for plugin in self._plugins if callable(getattr(plugin, "placed", None))
        )
        self.kv_index: KVBlockIndex | None = context.kv_index
        """The precise prefix index the scorers read (given, or made for them)."""
        self.load = context.load
        """The in-flight load a plugin reads (given, or made for it), else None;
        the core must tell it of every dispatch and completion."""
        self.scorers = next(iter(self._runners.values())).scorers if self._runners else ()
        self._membership = -1
        self._known: frozenset[str] = frozenset()
        self._healthy: list[Endpoint] = []
        self._healthy_version = -1
        self._healthy_until = float("-inf")
        self.healthy_now: Sequence[Endpoint] = ()
        self.endpoints_now: Sequence[Endpoint] = ()
        self._reachable: list[Endpoint] = []
        self._reachable_of: Sequence[Endpoint] | None = None
        self.picks: list[tuple[ProfileRunner, Endpoint]] = []
        self.priority_now = 0
        """The band of the request being placed (the credits depend on it)."""
        """The profiles' choices for the request being placed."""
        self.waiting_for: str | None = None
        """The stage (`decode`, `prefill`) whose lack of room made the latest
        choice wait; None when it did not wait."""

    @property
    def plugins(self) -> Mapping[str, object]:
        """The live plugins this scheduler built, by configured name."""
        return self._named

    def has_endpoints(self) -> bool:
        return bool(self._pool().endpoints)

    def place(self, request: FlowRequest) -> Placement:
        payload = request.payload
        chosen = self.choose(
            payload if payload is not None else InferenceRequest("", ""), request.priority
        )
        if isinstance(chosen, Endpoint):
            return chosen.address
        return chosen

    def choose(self, request: InferenceRequest, priority: int = 0) -> Endpoint | Outcome | None:
        """The endpoint for `request` of band `priority`, an Outcome that
        ends it, or None to wait."""
        self.priority_now = priority
        self.waiting_for = None
        if request.fallbacks:
            request.fallbacks = ()  # the first profile to choose sets them again
        pool = self._pool()
        if pool.membership != self._membership:
            self._forget_departed(pool)
        endpoints: Sequence[Endpoint] = pool.endpoints
        healthy: Sequence[Endpoint] = self._healthy
        if pool.version != self._healthy_version or self._clock() > self._healthy_until:
            healthy = self._fresh_unsaturated(pool)
        if request.subset is not None:
            endpoints = in_subset(endpoints, request.subset)
            if not endpoints:
                return Outcome.REJECTED_NO_ENDPOINTS
            healthy = in_subset(healthy, request.subset)
        if not endpoints:
            self.waiting_for = DECODE
            return None
        self.healthy_now = healthy
        self.endpoints_now = endpoints
        for produce in self._producers:
            produce(request)
        single = self._single
        if single is not None:
            chosen = single.choose(request, True)
            if isinstance(chosen, Endpoint):
                single.learn(request, chosen)
                if self._placed:
                    self._tell_placed(request, {single.name: chosen}, single.name)
            return chosen
        picks = self.picks
        picks.clear()
        chosen = self._handler.choose(request, self._runners)
        # Scorers learn only once every profile has chosen, so a decider
        # reading the prefix index sees it as it was before this request;
        # and only when it goes (it may wait for a prefill credit).
        if isinstance(chosen, Endpoint):
            for runner, endpoint in picks:
                runner.learn(request, endpoint)
            if self._placed and picks:
                results = {runner.name: endpoint for runner, endpoint in picks}
                self._tell_placed(request, results, picks[0][0].name)
        return chosen

    def _tell_placed(
        self, request: InferenceRequest, results: dict[str, Endpoint], primary: str
    ) -> None:
        for placed in self._placed:
            placed(request, results, primary)

    def total_scores(
        self, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> list[float]:
        """The first profile's weighted sum of scores, one per candidate."""
        return next(iter(self._runners.values())).total_scores(request, candidates)

    def reachable_now(self) -> Sequence[Endpoint]:
        """The reachable ones of `endpoints_now` (the first fallback when no
        endpoint is fresh and unsaturated): the same list while those are the
        same sequence, so the scorers' per-candidates state holds across picks."""
        endpoints = self.endpoints_now
        if endpoints is not self._reachable_of:
            self._reachable = reachable(endpoints)
            self._reachable_of = endpoints
        return self._reachable

    def _fresh_unsaturated(self, pool: PoolSnapshot) -> list[Endpoint]:
        """The pool's endpoints with fresh, unsaturated metrics, recomputed
        only when the snapshot changes or one of them turns stale."""
        now = self._clock()
        if pool.version != self._healthy_version or now > self._healthy_until:
            self._healthy, self._healthy_until = unsaturated(
                pool.endpoints, now, self._config.saturation
            )
            self._healthy_version = pool.version
        return self._healthy

    def _forget_departed(self, pool: PoolSnapshot) -> None:
        current = frozenset(endpoint.address for endpoint in pool.endpoints)
        for address in self._known - current:
            for plugin in self._plugins:
                forget = getattr(plugin, "forget", None)
                if forget is not None:
                    forget(address)
        self._known = current
        self._membership = pool.membership


class ProfileRunner:
    """One scheduling profile over the scheduler's current candidates:
    filters, weighted scorers, picker (see the module docstring)."""

    __slots__ = (
        "_addresses_list",
        "_addresses_of",
        "_dense",
        "_dense_pair",
        "_dense_weights",
        "_filters",
        "_kept",
        "_kept_pick",
        "_learning",
        "_pick",
        "_picker",
        "_positions",
        "_positions_of",
        "_seen",
        "_source",
        "_sparse",
        "credits",
        "name",
        "scorers",
        "stage",
    )

    def __init__(
        self,
        source: Scheduler,
        profile: ProfileConfig,
        context: BuildContext,
        concurrency: Credits | None,
    ) -> None:
        self._source = source
        self.name = profile.name
        self.credits = concurrency
        """The credits this profile's choice must respect (the prefill profile's are
        the prefill stage's)."""
        self.stage = DECODE
        """The stage whose credits `credits` are."""
        self.scorers: tuple[tuple[float, Scorer], ...] = tuple(
            (scorer.weight, context.build(scorer.plugin)) for scorer in profile.scorers
        )
        timed = context.timed
        specs = [scorer.plugin for scorer in profile.scorers]
        filter_plugins = [context.build(plugin) for plugin in profile.filters]
        filters = [
            timed("Filter", spec, plugin.filter)
            for spec, plugin in zip(profile.filters, filter_plugins, strict=True)
        ]
        filters.extend(
            timed("Filter", plugin, scorer.filter)
            for plugin, (_, scorer) in zip(specs, self.scorers, strict=True)
            if callable(getattr(scorer, "filter", None))
        )
        self._filters = tuple(filters)
        sparse = [
            (plugin, weight, scorer)
            for plugin, (weight, scorer) in zip(specs, self.scorers, strict=True)
            if isinstance(scorer, SparseScorer)
        ]
        dense = [
            (plugin, weight, scorer)
            for plugin, (weight, scorer) in zip(specs, self.scorers, strict=True)
            if not isinstance(scorer, SparseScorer)
        ]
        self._sparse = tuple(
            (weight, timed("Scorer", plugin, scorer.sparse_scores))
            for plugin, weight, scorer in sparse
        )
        self._dense = tuple(timed("Scorer", plugin, scorer.score) for plugin, _, scorer in dense)
        """Each dense scorer's `score`."""
        self._dense_weights = tuple(weight for _, weight, _ in dense)
        self._dense_pair = (
            (self._dense_weights[0], self._dense[0], self._dense_weights[1], self._dense[1])
            if len(self._dense) == 2
            else None
        )
        self._learning = tuple(
            scorer.picked for _, scorer in self.scorers if not isinstance(scorer, StatelessScorer)
        ) + tuple(plugin.picked for plugin in filter_plugins if hasattr(plugin, "picked"))
        self._positions_of: Sequence[Endpoint] | None = None
        self._positions: dict[str, int] = {}
        self._addresses_of: Sequence[Endpoint] | None = None
        self._addresses_list: list[str] = []
        self._kept = KeptTotals(maps=[NO_MAP] * len(self._sparse))
        """The dense pair's totals, sparse columns added, over the latest
        candidates chosen among (see `total_scores`)."""
        self._kept_pick = -1
        """The position in the kept candidates of the latest pick among them."""
        self._seen: Sequence[Endpoint] | None = None
        """The candidates of the latest sum not kept."""
        self._picker = context.build(profile.picker)
        self._pick = timed("Picker", profile.picker, self._picker.pick)

    def _filtered(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        for keep in self._filters:
            if not endpoints:
                break
            endpoints = keep(request, endpoints)
        return endpoints

    def choose(self, request: InferenceRequest, take_credit: bool) -> Endpoint | Outcome | None:
        source = self._source
        endpoints = source.endpoints_now
        candidates = source.healthy_now
        if self._filters:
            candidates = self._filtered(request, candidates)
            if not candidates:
                candidates = self._filtered(request, source.reachable_now()) or self._filtered(
                    request, endpoints
                )
                if not candidates:
                    return Outcome.REJECTED_FILTERED
        else:
            candidates = candidates or source.reachable_now() or endpoints
        gate = self.credits if take_credit else None
        priority = source.priority_now
        if gate is not None and not gate.may_have_room(candidates, priority):
            source.waiting_for = self.stage
            return None
        picked = self._pick(self.total_scores(request, candidates))
        chosen = candidates[picked]
        self._kept_pick = picked if candidates is self._kept.candidates else -1
        everyone = candidates
        if gate is not None and not gate.has_room(chosen.address, priority):
            candidates = with_room(candidates, gate, priority)
            if not candidates:
                source.waiting_for = self.stage
                return None
            chosen = candidates[self._pick(self.total_scores(request, candidates, keep=False))]
            self._kept_pick = -1
        if self._picker.count > 1 and not request.fallbacks:
            request.fallbacks = self._fallbacks(request, everyone, chosen)
        if source._single is None:
            source.picks.append((self, chosen))
        return chosen

    def _fallbacks(
        self, request: InferenceRequest, candidates: Sequence[Endpoint], chosen: Endpoint
    ) -> tuple[str, ...]:
        """The `count - 1` candidates the picker ranks first after `chosen`
        (whatever their credits: they are only tried when it fails)."""
        order = self._picker.rank(self.total_scores(request, candidates))
        others = [candidates[i].address for i in order if candidates[i] is not chosen]
        return tuple(others[: self._picker.count - 1])

    def learn(self, request: InferenceRequest, chosen: Endpoint) -> None:
        """Tell the scorers where the request went."""
        for picked in self._learning:
            picked(request, chosen)
        position = self._kept_pick
        if position >= 0:
            # The scorers may have changed the chosen one's scores in place
            # (the queue scorer does): its kept total follows them.
            self._kept_pick = -1
            kept = self._kept
            if kept.candidates[position] is chosen:
                try:
                    a = kept.first[position]
                    b = kept.second[position]
                except IndexError:  # a scorer reused its list for fewer candidates
                    return
                w1, _, w2, _ = self._dense_pair  # type: ignore[misc]
                kept.first_then[position] = a
                kept.second_then[position] = b
                if kept.pair is not None:
                    kept.pair[position] = w1 * a + w2 * b
                columns = kept.columns
                # `total_at` of one whole column, written out: the default profile's (bench.owner)
                if len(columns) == 1 and columns[0][2]:
                    weight, scores, _ = columns[0]
                    total = w1 * a + w2 * b + weight * scores.get(chosen.address, 0.0)
                else:
                    total = total_at(w1, a, w2, b, columns, chosen.address)
                kept.totals[position] = total

    def total_scores(
        self, request: InferenceRequest, candidates: Sequence[Endpoint], keep: bool = True
    ) -> list[float]:
        """The weighted sum of every scorer's scores, one per candidate.

        With a dense pair (the default profile's queue and KV-cache scorers)
        the totals over the latest candidates are kept (from the second sum
        over the same sequence on, and unless not to `keep`: the candidates
        with room, scored once when the choice had none) and given again
        while the candidates are the same sequence,
        both dense columns hold the same values and each sparse scorer gives
        the same map (a map is never modified, so the same map holds the
        same scores): between two scrapes the pool's candidates are one
        list, a pick moves one queue score (followed in `learn`) and the
        prefix index answers an unchanged prompt's match with the same map.
        Equal values give equal totals, whichever scorer changed them and
        how; a kept total is worked out by the same operations in the same
        order (`total_at`)."""
        pair = self._dense_pair
        if pair is None:
            columns = [score(request, candidates) for score in self._dense]
            totals = weighted_sum(columns, self._dense_weights, len(candidates))
            size = len(candidates)
            for weight, sparse_scores in self._sparse:
                scores = sparse_scores(request)
                if not scores:  # no column to add (a prompt no endpoint holds)
                    continue
                if len(scores) * DENSE_SHARE >= size:
                    totals = with_column(totals, weight, scores, self._addresses(candidates))
                else:
                    add_named(totals, weight, scores, self._positions_by_address(candidates))
            return totals
        w1, score1, w2, score2 = pair
        first, second = score1(request, candidates), score2(request, candidates)
        sparse = self._sparse
        if len(sparse) == 1:  # the default profile's (no comprehension's frame)
            maps = [sparse[0][1](request)]
            same = maps[0] is self._kept.maps[0]
        else:
            maps = [sparse_scores(request) for _, sparse_scores in sparse]
            same = all(map(operator.is_, maps, self._kept.maps))
        kept = self._kept
        held = candidates is kept.candidates and first == kept.first_then
        held = held and second == kept.second_then
        if held:
            if same:
                return kept.totals.copy()
            # Another prompt over the same columns: its sparse columns are
            # added to the kept pair's sum (the fused pass's totals, to the
            # last bit: `pair_with_column`).
            if kept.pair is None:
                kept.pair = pair_sum(w1, first, w2, second)
        size = len(candidates)
        columns: list[tuple[float, Mapping[str, float], bool]] = []
        totals: list[float] | None = None
        summed: list[float] | None = None  # the pair's sum alone, when worked out apart
        for (weight, _), scores in zip(self._sparse, maps):  # noqa: B905
            if not scores:  # no column to add (a prompt no endpoint holds)
                continue
            dense = len(scores) * DENSE_SHARE >= size
            columns.append((weight, scores, dense))
            if totals is None:
                if held:
                    totals = kept.pair if dense else kept.pair.copy()  # type: ignore[union-attr]
                elif dense:
                    # The default profile's shape: the pair and the column in one pass.
                    addresses = self._addresses(candidates)
                    totals = pair_with_column(w1, first, w2, second, weight, scores, addresses)
                    continue
                else:
                    totals = pair_sum(w1, first, w2, second)
                    summed = totals.copy()
            if dense:
                totals = with_column(totals, weight, scores, self._addresses(candidates))
            else:
                add_named(totals, weight, scores, self._positions_by_address(candidates))
        if totals is None:
            if held:
                totals = kept.pair.copy()  # type: ignore[union-attr]
            else:
                totals = pair_sum(w1, first, w2, second)
                summed = totals.copy()
        if held:
            kept.maps, kept.columns, kept.totals = maps, columns, totals.copy()
        elif keep:
            if candidates is kept.candidates or candidates is self._seen:
                self._kept = KeptTotals(
                    candidates,
                    first,
                    first.copy(),
                    second,
                    second.copy(),
                    summed,
                    maps,
                    columns,
                    totals.copy(),
                )
            else:
                # Kept from the second sum over the same candidates on: a pool
                # whose candidates change at every pick is not charged the copies.
                self._seen = candidates
        return totals

    def _positions_by_address(self, candidates: Sequence[Endpoint]) -> dict[str, int]:
        if candidates is not self._positions_of:
            self._positions = {endpoint.address: index for index, endpoint in enumerate(candidates)}
            self._positions_of = candidates
        return self._positions

    def _addresses(self, candidates: Sequence[Endpoint]) -> list[str]:
        if candidates is not self._addresses_of:
            self._addresses_list = [endpoint.address for endpoint in candidates]
            self._addresses_of = candidates
        return self._addresses_list


@dataclass(slots=True)
class KeptTotals:
    """A profile's totals over one candidate sequence and what they were
    summed from (see `ProfileRunner.total_scores`)."""

    candidates: Sequence[Endpoint] = ()
    first: list[float] = field(default_factory=list)
    """The first dense column, as its scorer returned it (it may change it in place)."""
    first_then: list[float] = field(default_factory=list)
    """Its values the totals hold."""
    second: list[float] = field(default_factory=list)
    second_then: list[float] = field(default_factory=list)
    pair: list[float] | None = None
    """The dense pair's sum alone (None until another prompt needs it)."""
    maps: list[Mapping[str, float]] = field(default_factory=list)
    """Each sparse scorer's map, in order (empty ones too)."""
    columns: list[tuple[float, Mapping[str, float], bool]] = field(default_factory=list)
    """The sparse columns added: (weight, map, added as a whole column)."""
    totals: list[float] = field(default_factory=list)


def total_at(
    w1: float,
    a: float,
    w2: float,
    b: float,
    columns: Sequence[tuple[float, Mapping[str, float], bool]],
    address: str,
) -> float:
    """One candidate's total as `total_scores` sums it, to the last bit: its
    dense pair's scores `a`, `b`, then each sparse column, whole (a 0 where
    not named) or by name, in the same order."""
    total = w1 * a + w2 * b
    for weight, scores, dense in columns:
        if dense:
            total = total + weight * scores.get(address, 0.0)
        else:
            score = scores.get(address)
            if score is not None:
                total += weight * score
    return total


def pair_sum(w1: float, first: Sequence[float], w2: float, second: Sequence[float]) -> list[float]:
    """w1 * first[i] + w2 * second[i] for each i, as a new list."""
    # No `strict=` keyword: both columns score the same candidates, and
    # calling zip with any keyword costs a sixth of this sum.
    return [w1 * a + w2 * b for a, b in zip(first, second)]  # noqa: B905


def pair_with_column(
    w1: float,
    first: Sequence[float],
    w2: float,
    second: Sequence[float],
    weight: float,
    scores: Mapping[str, float],
    addresses: Sequence[str],
) -> list[float]:
    """`with_column(pair_sum(w1, first, w2, second), weight, scores,
    addresses)` in one pass, to the last bit: the same additions in the
    same order, one list built instead of two."""
    named = map(scores.get, addresses, repeat(0.0))
    return [w1 * a + w2 * b + weight * s for a, b, s in zip(first, second, named)]  # noqa: B905


def add_named(
    totals: list[float], weight: float, scores: Mapping[str, float], positions: Mapping[str, int]
) -> None:
    """Add `weight` times each named score to the total at its address's
    position (names not among the positions are left out)."""
    for address, score in scores.items():
        position = positions.get(address)
        if position is not None:
            totals[position] += weight * score


def with_column(
    totals: list[float], weight: float, scores: Mapping[str, float], addresses: Sequence[str]
) -> list[float]:
    """`add_named`'s totals as a new list, a whole column added: a 0 for each
    address not named, which leaves its total as it was. When most are
    named it costs half as much as a lookup and a store per name."""
    named = map(scores.get, addresses, repeat(0.0))
    return [total + weight * score for total, score in zip(totals, named)]  # noqa: B905


def weighted_sum(
    columns: Sequence[Sequence[float]], weights: Sequence[float], size: int
) -> list[float]:
    """sum_k weights[k] * columns[k][i] for each i, as a new list. Up to three
    columns are summed in one pass over the candidates."""
    count = len(columns)
    if count == 2:
        (w1, w2), (c1, c2) = weights, columns
        return [w1 * a + w2 * b for a, b in zip(c1, c2, strict=True)]
    if count == 3:
        (w1, w2, w3), (c1, c2, c3) = weights, columns
        return [w1 * a + w2 * b + w3 * c for a, b, c in zip(c1, c2, c3, strict=True)]
    if count == 1:
        weight = weights[0]
        return [weight * score for score in columns[0]]
    totals = [0.0] * size
    for weight, column in zip(weights, columns, strict=True):
        totals = [total + weight * score for total, score in zip(totals, column, strict=True)]
    return totals
