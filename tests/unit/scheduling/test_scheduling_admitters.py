"""probabilistic-admitter: sheddable requests are refused with probability
min(saturation ** power * k, 1) (the reference's plugin and README)."""

from __future__ import annotations

from math import inf

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.config.loader import ConfigError, parse_config
from epp.scheduling.admitters import ProbabilisticAdmitter
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.saturation import SaturationThresholds

NOW = 10.0
HEAD = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def pool_at(*waiting: int, kv: float = 0.0) -> PoolSnapshot:
    endpoints = tuple(
        Endpoint(
            f"e{i}", f"10.0.0.{i}:8000", metrics=EndpointMetrics(w, kv_usage=kv, updated_at=0.0)
        )
        for i, w in enumerate(waiting)
    )
    return PoolSnapshot(endpoints, 1, 1)


def admitter_of(parameters: dict | None = None) -> ProbabilisticAdmitter:
    plugin = {"type": "probabilistic-admitter"}
    if parameters is not None:
        plugin["parameters"] = parameters
    (admitter,) = parse_config({**HEAD, "plugins": [plugin]}).flow_plugins.admitters
    return admitter


def test_defaults_are_the_references() -> None:
    assert admitter_of() == ProbabilisticAdmitter(SaturationThresholds(5, 0.8, inf), 5.0, 300.0)


def test_parameters_are_read() -> None:
    parameters = {"queueDepthThreshold": 10, "kvCacheUtilThreshold": 1.0, "power": 2, "k": 7}
    assert admitter_of(parameters) == ProbabilisticAdmitter(
        SaturationThresholds(10, 1.0, inf), 2.0, 7.0
    )


@pytest.mark.parametrize(
    "parameters",
    [{"queueDepthThreshold": 0}, {"kvCacheUtilThreshold": 0}, {"power": 0}, {"k": -1}],
)
def test_non_positive_parameters_are_refused(parameters: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(parameters))):
        admitter_of(parameters)


def test_requests_of_priority_zero_and_above_are_always_admitted() -> None:
    saturated = pool_at(50, 50)
    admitter = ProbabilisticAdmitter()
    assert admitter.deny(0, saturated, NOW, 0.0) is None
    assert admitter.deny(3, saturated, NOW, 0.0) is None


def test_an_empty_pool_admits() -> None:
    assert ProbabilisticAdmitter().deny(-1, PoolSnapshot(), NOW, 0.0) is None


def test_an_endpoint_without_metrics_counts_fully_saturated() -> None:
    blind = PoolSnapshot((Endpoint("e", "10.0.0.1:8000"),), 1, 1)
    saturation, probability = ProbabilisticAdmitter().shed_probability(blind, NOW)
    assert (saturation, probability) == (1.0, 1.0)


def test_old_metrics_are_still_read() -> None:
    idle_long_ago = pool_at(0)
    assert ProbabilisticAdmitter().shed_probability(idle_long_ago, 1e9) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("waiting", "probability"),
    [((0, 0), 0.0), ((1, 0), 300 * 0.1**5), ((2, 1), 300 * 0.3**5), ((2, 2), 1.0)],
)
def test_the_shedding_curve_is_the_references(waiting, probability) -> None:
    _, seen = ProbabilisticAdmitter().shed_probability(pool_at(*waiting), NOW)
    assert seen == pytest.approx(probability)


def test_kv_usage_counts_against_its_own_threshold() -> None:
    saturation, _ = ProbabilisticAdmitter().shed_probability(pool_at(0, kv=0.4), NOW)
    assert saturation == pytest.approx(0.5)


def test_a_sheddable_request_is_refused_when_the_draw_is_below_the_probability() -> None:
    pool = pool_at(2, 1)  # saturation 0.3, probability 0.729
    admitter = ProbabilisticAdmitter()
    assert admitter.deny(-1, pool, NOW, 0.72) == (
        "probabilistic-admitter: rejected, saturation=0.300 prob=0.73"
    )
    assert admitter.deny(-1, pool, NOW, 0.73) is None


@given(st.lists(st.integers(0, 20), min_size=1, max_size=8), st.integers(-5, -1))
def test_more_waiting_never_lowers_the_probability(waiting: list[int], priority: int) -> None:
    admitter = ProbabilisticAdmitter()
    lower = admitter.shed_probability(pool_at(*waiting), NOW)[1]
    higher = admitter.shed_probability(pool_at(*(w + 1 for w in waiting)), NOW)[1]
    assert 0.0 <= lower <= higher <= 1.0
