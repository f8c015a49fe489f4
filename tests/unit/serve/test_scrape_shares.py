"""Under `--workers`, every read a worker makes reaches the owner's store
(`epp.serve.scrapes`): the worker's `ScrapeShare` and the owner's
`ScrapeShares` joined by a list standing for the link."""

from __future__ import annotations

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.engines import EngineLookup
from epp.datalayer.scraper import MetricsSource
from epp.datalayer.store import EndpointStore
from epp.scheduling.endpoint import EndpointMetrics
from epp.serve import wire
from epp.serve.scrapes import ScrapeSettings, ScrapeShare, ScrapeShares

ADDRESS = "10.0.0.1:8000"


class ListLink:
    def __init__(self) -> None:
        self.messages: list[wire.Message] = []

    def send(self, message: wire.Message) -> None:
        self.messages.append(message)


def joined() -> tuple[ScrapeShare, ScrapeShares, list[wire.Message]]:
    store = EndpointStore()
    store.replace_all([EndpointSpec("pod", ADDRESS, {}, None)])
    owner = ScrapeShares(store)
    to_worker = ListLink()
    owner.assign([(0, to_worker)])  # type: ignore[list-item]
    to_owner: list[wire.Message] = []
    worker = ScrapeShare(
        ScrapeSettings(MetricsSource(), EngineLookup(), interval=0.05, timeout=1.0),
        to_owner.append,
    )
    [(_, share)] = to_worker.messages
    worker.assign(share)
    return worker, owner, to_owner


def read(worker: ScrapeShare, owner: ScrapeShares, sent: list, metrics: EndpointMetrics) -> bool:
    """One read through the worker; whether the owner's core would look again."""
    worker.on_read(ADDRESS, metrics, None)
    looks = [owner.apply(0, message) for message in sent]
    sent.clear()
    return any(looks)


def test_every_read_of_the_same_values_moves_the_owners_read_time_and_pokes() -> None:
    worker, owner, sent = joined()
    idle = EndpointMetrics(waiting=0.0, running=0.0, updated_at=1.0)
    assert read(worker, owner, sent, idle)
    for at in (1.05, 1.10, 1.15):
        assert read(worker, owner, sent, idle._replace(updated_at=at))
        assert owner.store.get(ADDRESS).metrics == idle._replace(updated_at=at)
    assert owner.reads == 4


def test_a_read_of_the_same_values_goes_as_its_time_alone() -> None:
    worker, _, sent = joined()
    idle = EndpointMetrics(updated_at=1.0)
    worker.on_read(ADDRESS, idle, None)
    worker.on_read(ADDRESS, idle._replace(updated_at=1.05), None)
    assert [message[0] for message in sent] == [wire.METRICS, wire.FRESH]
    assert sent[1] == [wire.FRESH, ADDRESS, 1.05]


def test_a_read_whose_latency_counters_moved_reaches_the_owner_whole() -> None:
    # The adaptive gate reads a step between two reads from the counters.
    worker, owner, sent = joined()
    first = EndpointMetrics(running=2.0, itl_sum=0.5, itl_count=50.0, updated_at=1.0)
    stepped = first._replace(itl_sum=0.6, itl_count=60.0, updated_at=1.05)
    read(worker, owner, sent, first)
    assert read(worker, owner, sent, stepped)
    assert owner.store.get(ADDRESS).metrics == stepped


def test_after_a_failed_read_the_next_good_one_goes_whole() -> None:
    worker, owner, sent = joined()
    idle = EndpointMetrics(updated_at=1.0)
    read(worker, owner, sent, idle)
    worker.on_read(ADDRESS, None, "timeout")
    worker.on_read(ADDRESS, idle._replace(updated_at=1.10), None)
    assert [message[0] for message in sent] == [wire.SCRAPE_FAILED, wire.METRICS]
    for message in sent:
        owner.apply(0, message)
    assert owner.store.get(ADDRESS).metrics == idle._replace(updated_at=1.10)
