"""Session affinity as the reference's session-affinity-scorer,
session-affinity-filter and session-id-producer behave (their READMEs),
configured through the loader and run by the scheduler."""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.flowcontrol.gate import ConcurrencyGate
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.filters import ROLE_LABEL
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.sessions import SessionBindings, cookie_value, decode_token, encode_token

HEAD = {"apiVersion": "llm-d.ai/v1", "kind": "EndpointPickerConfig"}
TOKEN = "x-session-token"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pod(index: int, waiting: float = 0, role: str | None = None) -> Endpoint:
    labels = {ROLE_LABEL: role} if role else {}
    return Endpoint(
        f"pod-{index}",
        f"10.0.0.{index}:8000",
        labels,
        EndpointMetrics(waiting=waiting, updated_at=100.0),
        id=f"default/pod-{index}-rank-0",
    )


class Pool:
    """The pool a test's scheduler reads; `set` replaces it."""

    def __init__(self, pods: list[Endpoint]) -> None:
        self.set(pods, 1)

    def set(self, pods: list[Endpoint], version: int) -> None:
        self.snapshot = PoolSnapshot(endpoints=tuple(pods), version=version, membership=version)

    def __call__(self) -> PoolSnapshot:
        return self.snapshot


def scheduler_for(
    document: dict[str, Any],
    pods: list[Endpoint] | Pool,
    clock: Clock | None = None,
    gate: ConcurrencyGate | None = None,
) -> Scheduler:
    config = parse_config({**HEAD, **document}).scheduling
    pool = pods if isinstance(pods, Pool) else Pool(pods)
    return Scheduler(config, pool, clock or Clock(), random.Random(3), gate)


def request(**headers: str) -> InferenceRequest:
    return InferenceRequest("m", "m", prompt="hello", headers=headers)


def sticky(affinity: dict[str, Any], weight: float = 10) -> dict[str, Any]:
    """A profile of the session plugin and queue-scorer (weight 1): the
    queue alone would pick the shortest queue."""
    return {
        "plugins": [affinity, {"type": "queue-scorer"}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": affinity.get("name", affinity["type"]), "weight": weight}
                    if affinity["type"].endswith("scorer")
                    else {"pluginRef": affinity.get("name", affinity["type"])},
                    {"pluginRef": "queue-scorer"},
                ],
            }
        ],
    }


SCORER = {"type": "session-affinity-scorer"}
SESSION_ID = {"type": "session-affinity-scorer", "parameters": {"strategy": "session_id"}}


# -- the token ---------------------------------------------------------------


def test_a_token_is_base64_of_the_endpoints_namespace_and_name_as_the_reference_writes() -> None:
    assert encode_token(pod(1)) == base64.b64encode(b"default/pod-1-rank-0").decode()
    assert decode_token(encode_token(pod(1))) == "default/pod-1-rank-0"


@pytest.mark.parametrize("token", ["", "not base64!", "YWJj="])
def test_a_token_that_does_not_decode_names_no_endpoint(token: str) -> None:
    assert decode_token(token) == ""


# -- encoded_endpoint_header (the default) --------------------------------------


def test_the_response_carries_the_chosen_endpoint_in_x_session_token() -> None:
    placer = scheduler_for(sticky(SCORER), [pod(1, waiting=3), pod(2)])
    first = request()
    chosen = placer.choose(first)
    assert chosen is not None and chosen.name == "pod-2"
    assert first.response_headers == {TOKEN: encode_token(chosen)}


def test_a_request_with_the_token_goes_to_its_endpoint_over_a_shorter_queue() -> None:
    pods = [pod(1, waiting=3), pod(2)]
    placer = scheduler_for(sticky(SCORER), pods)
    chosen = placer.choose(request(**{TOKEN: encode_token(pods[0])}))
    assert chosen is pods[0]


def test_a_token_of_an_endpoint_that_left_expresses_no_preference() -> None:
    placer = scheduler_for(sticky(SCORER), [pod(1, waiting=3), pod(2)])
    gone = Endpoint("pod-9", "10.0.0.9:8000", id="default/pod-9-rank-0")
    follow = request(**{TOKEN: encode_token(gone)})
    chosen = placer.choose(follow)
    assert chosen is not None and chosen.name == "pod-2"
    assert follow.response_headers == {TOKEN: encode_token(chosen)}


def test_the_scorer_rates_the_sessions_endpoint_one_and_the_others_zero() -> None:
    pods = [pod(1), pod(2), pod(3)]
    placer = scheduler_for(sticky(SCORER), pods)
    scorer = placer.scorers[0][1]
    assert scorer.score(request(**{TOKEN: encode_token(pods[1])}), pods) == [0.0, 1.0, 0.0]
    assert scorer.score(request(), pods) == [0.0, 0.0, 0.0]
    assert scorer.score(request(**{TOKEN: "garbage"}), pods) == [0.0, 0.0, 0.0]


def test_the_token_header_is_configurable_and_matched_in_lower_case() -> None:
    affinity = {
        "type": "session-affinity-scorer",
        "parameters": {"encodedEndpointHeaderConfig": {"header": "X-My-Token"}},
    }
    pods = [pod(1, waiting=3), pod(2)]
    placer = scheduler_for(sticky(affinity), pods)
    follow = request(**{"x-my-token": encode_token(pods[0])})
    assert placer.choose(follow) is pods[0]
    assert follow.response_headers == {"x-my-token": encode_token(pods[0])}


def test_the_filter_keeps_only_the_sessions_endpoint_whatever_the_scores() -> None:
    pods = [pod(1, waiting=3), pod(2)]
    placer = scheduler_for(sticky({"type": "session-affinity-filter"}), pods)
    follow = request(**{TOKEN: encode_token(pods[0])})
    assert placer.choose(follow) is pods[0]
    assert follow.response_headers == {TOKEN: encode_token(pods[0])}


def test_the_filter_keeps_every_candidate_without_a_usable_token() -> None:
    pods = [pod(1), pod(2), pod(3)]
    placer = scheduler_for(sticky({"type": "session-affinity-filter"}), pods)
    keep = placer.plugins["session-affinity-filter"].filter
    assert keep(request(), pods) is pods
    gone = Endpoint("pod-9", "10.0.0.9:8000", id="default/pod-9-rank-0")
    assert keep(request(**{TOKEN: encode_token(gone)}), pods) is pods
    assert keep(request(**{TOKEN: encode_token(pods[2])}), pods) == [pods[2]]


PD_SESSIONS = {
    "plugins": [
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
        {"type": "queue-scorer"},
        {"type": "always-disagg-pd-decider", "name": "always"},
        {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "always"}}},
        {"type": "session-affinity-scorer", "name": "decode-affinity"},
        {
            "type": "session-affinity-scorer",
            "name": "prefill-affinity",
            "parameters": {
                "profileName": "prefill",
                "encodedEndpointHeaderConfig": {"header": "x-session-token-prefill"},
            },
        },
    ],
    "schedulingProfiles": [
        {
            "name": "prefill",
            "plugins": [
                {"pluginRef": "prefill-filter"},
                {"pluginRef": "queue-scorer"},
                {"pluginRef": "prefill-affinity", "weight": 10},
            ],
        },
        {
            "name": "decode",
            "plugins": [
                {"pluginRef": "decode-filter"},
                {"pluginRef": "queue-scorer"},
                {"pluginRef": "decode-affinity", "weight": 10},
            ],
        },
    ],
}


def test_with_pd_each_instance_pins_its_profiles_endpoint_under_its_own_header() -> None:
    pods = [pod(1, role="prefill"), pod(2, role="prefill"), pod(3, role="decode"), pod(4)]
    placer = scheduler_for(PD_SESSIONS, pods)
    first = request()
    decode = placer.choose(first)
    assert decode is not None and first.routing is not None
    prefill = next(p for p in pods if p.address == first.routing["x-prefiller-host-port"])
    assert first.response_headers == {
        TOKEN: encode_token(decode),
        "x-session-token-prefill": encode_token(prefill),
    }
    for _ in range(5):
        again = request(**first.response_headers)
        assert placer.choose(again) is decode
        assert again.routing == first.routing


# -- session_id ------------------------------------------------------------------


def test_an_unbound_session_expresses_no_preference_then_sticks_where_it_went() -> None:
    pods = [pod(1, waiting=3), pod(2)]
    pool = Pool(pods)
    placer = scheduler_for(sticky(SESSION_ID), pool)
    scorer = placer.scorers[0][1]
    assert scorer.score(request(**{"x-session-id": "s1"}), pods) == [0.0, 0.0]
    first = request(**{"x-session-id": "s1"})
    assert placer.choose(first) is pods[1]
    assert first.response_headers is None  # the client owns its session id
    pool.set([pod(1), pod(2, waiting=3)], version=2)
    assert placer.choose(request(**{"x-session-id": "s1"})).name == "pod-2"
    assert placer.choose(request(**{"x-session-id": "s2"})).name == "pod-1"


def test_a_session_whose_endpoint_left_moves_to_where_its_request_went() -> None:
    pods = [pod(1, waiting=3), pod(2)]
    pool = Pool(pods)
    placer = scheduler_for(sticky(SESSION_ID), pool)
    assert placer.choose(request(**{"x-session-id": "s"})) is pods[1]
    pool.set([pod(1, waiting=3), pod(3, waiting=4)], version=2)
    assert placer.choose(request(**{"x-session-id": "s"})).name == "pod-1"
    pool.set([pod(1, waiting=4), pod(3)], version=3)
    assert placer.choose(request(**{"x-session-id": "s"})).name == "pod-1"


def test_a_session_does_not_move_when_another_scorer_outweighs_it() -> None:
    pods = [pod(1, waiting=3), pod(2)]
    placer = scheduler_for(sticky(SESSION_ID, weight=0.5), pods)
    bindings = placer.scorers[0][1].bindings
    bindings.bind("s", pods[0].id)
    assert placer.choose(request(**{"x-session-id": "s"})) is pods[1]
    assert bindings.get("s") == pods[0].id


def test_a_binding_expires_exactly_its_ttl_after_its_last_use() -> None:
    clock = Clock()
    affinity = {
        "type": "session-affinity-scorer",
        "parameters": {"strategy": "session_id", "sessionIdConfig": {"evictionTtlSeconds": 30}},
    }
    pods = [pod(1, waiting=3), pod(2)]
    placer = scheduler_for(sticky(affinity), pods, clock)
    bindings = placer.scorers[0][1].bindings
    placer.choose(request(**{"x-session-id": "s"}))
    clock.now += 20
    placer.choose(request(**{"x-session-id": "s"}))
    clock.now += 30
    assert bindings.get("s") == pods[1].id
    clock.now += 0.001
    assert bindings.get("s") == ""
    assert len(bindings) == 0


def test_at_most_max_sessions_are_kept_least_recently_used_dropped_first() -> None:
    clock = Clock()
    bindings = SessionBindings(ttl=60, max_sessions=2, clock=clock)
    bindings.bind("a", "x")
    bindings.bind("b", "y")
    bindings.bind("a", "x")
    bindings.bind("c", "z")
    assert (bindings.get("a"), bindings.get("b"), bindings.get("c")) == ("x", "", "z")
    assert bindings.dropped == 1


def test_sources_are_tried_in_order_and_the_first_non_empty_wins() -> None:
    affinity = {
        "type": "session-affinity-filter",
        "parameters": {
            "strategy": "session_id",
            "sessionIdConfig": {"sources": [{"header": "X-Conversation"}, {"header": "x-user"}]},
        },
    }
    pods = [pod(1), pod(2)]
    placer = scheduler_for(sticky(affinity), pods)
    keep = placer.plugins["session-affinity-filter"]
    keep.bindings.bind("conv", pods[0].id)
    keep.bindings.bind("user", pods[1].id)
    assert keep.filter(request(**{"x-conversation": "conv", "x-user": "user"}), pods) == [pods[0]]
    assert keep.filter(request(**{"x-conversation": " ", "x-user": "user"}), pods) == [pods[1]]
    assert keep.filter(request(), pods) is pods


# -- session-id-producer -----------------------------------------------------------


def producer_document(producer: dict[str, Any], source: dict[str, str]) -> dict[str, Any]:
    document = sticky(
        {
            "type": "session-affinity-filter",
            "parameters": {"strategy": "session_id", "sessionIdConfig": {"sources": [source]}},
        }
    )
    document["plugins"].append(producer)
    return document


def test_the_producer_publishes_a_cookies_session_id_for_the_affinity_plugins() -> None:
    document = producer_document(
        {
            "type": "session-id-producer",
            "name": "sid",
            "parameters": {"cookieName": "llm-d-session"},
        },
        {"attribute": "SessionIDDataKey", "producer": "sid"},
    )
    pods = [pod(1, waiting=3), pod(2)]
    pool = Pool(pods)
    placer = scheduler_for(document, pool)
    first = request(cookie="theme=dark; llm-d-session=abc; x=1")
    assert placer.choose(first) is pods[1]
    assert first.attributes == {"SessionIDDataKey/sid": "abc"}
    pool.set([pod(1), pod(2, waiting=3)], version=2)
    assert placer.choose(request(cookie="llm-d-session=abc")).name == "pod-2"
    assert placer.choose(request(cookie="llm-d-session=other")).name == "pod-1"


def test_the_producer_reads_a_header_and_publishes_nothing_without_it() -> None:
    document = producer_document(
        {"type": "session-id-producer", "parameters": {"headerName": "X-Session-ID"}},
        {"attribute": "SessionIDDataKey", "producer": "session-id-producer"},
    )
    placer = scheduler_for(document, [pod(1), pod(2)])
    with_id = request(**{"x-session-id": " s1 "})
    placer.choose(with_id)
    assert with_id.attributes == {"SessionIDDataKey/session-id-producer": "s1"}
    without = request()
    placer.choose(without)
    assert without.attributes is None


@pytest.mark.parametrize(
    ("header", "name", "value"),
    [
        ("a=1; b=2", "b", "2"),
        ("a=1;b=2", "a", "1"),
        ("a=1; junk; b=2", "b", "2"),
        ("a=1", "b", ""),
        ("", "a", ""),
        ("ab=1; a=2", "a", "2"),
    ],
)
def test_a_cookie_is_read_by_exact_name(header: str, name: str, value: str) -> None:
    assert cookie_value(header, name) == value


# -- parameters ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plugin", "error"),
    [
        (
            {"type": "session-affinity-scorer", "parameters": {"strategy": "sticky"}},
            "plugins[0].parameters.strategy: must be one of encoded_endpoint_header, session_id",
        ),
        (
            {
                "type": "session-affinity-filter",
                "parameters": {
                    "strategy": "session_id",
                    "sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]},
                },
            },
            "plugins[0].parameters.sessionIdConfig.sources[0]: exactly one of header or attribute",
        ),
        (
            {
                "type": "session-affinity-scorer",
                "parameters": {
                    "strategy": "session_id",
                    "sessionIdConfig": {"evictionTtlSeconds": -1},
                },
            },
            "plugins[0].parameters.sessionIdConfig.evictionTtlSeconds: must be > 0",
        ),
        (
            {"type": "session-id-producer"},
            "plugins[0].parameters: exactly one of headerName or cookieName must be set",
        ),
        (
            {"type": "session-id-producer", "parameters": {"headerName": "a", "cookieName": "b"}},
            "plugins[0].parameters: exactly one of headerName or cookieName must be set",
        ),
    ],
)
def test_parameters_the_reference_refuses_are_refused(plugin: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({**HEAD, "plugins": [plugin]})
    assert any(found.startswith(error) for found in raised.value.errors), raised.value.errors


def test_session_id_settings_are_ignored_under_the_default_strategy_as_in_the_reference() -> None:
    plugin = {
        "type": "session-affinity-scorer",
        "parameters": {"sessionIdConfig": {"evictionTtlSeconds": -1}},
    }
    parse_config({**HEAD, "plugins": [plugin]})


def test_zero_ttl_and_no_sources_mean_the_defaults() -> None:
    affinity = {
        "type": "session-affinity-scorer",
        "parameters": {
            "strategy": "session_id",
            "sessionIdConfig": {"sources": [], "evictionTtlSeconds": 0},
        },
    }
    placer = scheduler_for(sticky(affinity), [pod(1), pod(2)])
    scorer = placer.scorers[0][1]
    assert scorer.bindings.ttl == 300.0
    assert [source.header for source in scorer.sources] == ["x-session-id"]


def test_an_attribute_source_no_declared_plugin_publishes_is_warned_about() -> None:
    document = producer_document(
        {"type": "session-id-producer", "name": "sid", "parameters": {"headerName": "x-s"}},
        {"attribute": "SessionIDDataKey", "producer": "other"},
    )
    warnings = parse_config({**HEAD, **document}).warnings
    assert warnings == (
        "plugins[0].parameters.sessionIdConfig.sources[0]: no declared plugin publishes the "
        "attribute 'SessionIDDataKey/other', so this source finds no session id (a "
        "session-id-producer publishes SessionIDDataKey/<its name>)",
    )
    document["plugins"][0]["parameters"]["sessionIdConfig"]["sources"][0]["producer"] = "sid"
    assert parse_config({**HEAD, **document}).warnings == ()


def full(gate: ConcurrencyGate, endpoint: Endpoint) -> None:
    """`endpoint` holds its one in-flight credit."""
    holder = FlowRequest("holder", "f", 0, 0.0)
    holder.endpoint = endpoint.address
    gate.on_dispatch(holder)


def test_a_pinned_request_waits_for_its_full_endpoint_under_the_filter() -> None:
    pods = [pod(1), pod(2)]
    gate = ConcurrencyGate(max_per_endpoint=1)
    full(gate, pods[0])
    placer = scheduler_for(sticky({"type": "session-affinity-filter"}), pods, gate=gate)
    assert placer.choose(request(**{TOKEN: encode_token(pods[0])})) is None


def test_a_session_moves_off_its_full_endpoint_under_the_scorer() -> None:
    pods = [pod(1), pod(2)]
    gate = ConcurrencyGate(max_per_endpoint=1)
    full(gate, pods[0])
    placer = scheduler_for(sticky(SCORER), pods, gate=gate)
    moved = request(**{TOKEN: encode_token(pods[0])})
    assert placer.choose(moved) is pods[1]
    assert moved.response_headers == {TOKEN: encode_token(pods[1])}
