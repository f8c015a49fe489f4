"""The Accepted condition: written once, kept quiet, shared between EPPs."""

from __future__ import annotations

from epp.k8s.status import ACCEPTED_MESSAGE
from tests.support.kube import (
    OBJECTIVES,
    Epp,
    KubeEmulator,
    StartEpp,
    caught_up,
    objective,
    pod,
    pool,
)
from tests.support.waiting import eventually

OBJECTIVE = ("llm-d.ai/v1", "InferenceObjective")


def conditions(kube: KubeEmulator, name: str) -> list[dict]:
    return kube.get(*OBJECTIVE, name)["status"]["conditions"]


def accepted_writes(kube: KubeEmulator) -> int:
    return sum(1 for write in kube.status_writes() if write.status == 200)


def refused_writes(kube: KubeEmulator) -> int:
    return sum(1 for write in kube.status_writes() if write.status == 409)


async def pool_change_handled(kube: KubeEmulator, epp: Epp, **labels: str) -> None:
    """Change the pool's labels (which marks every objective for status) and
    wait until the EPP has seen it and its status writer has settled."""
    version = int(kube.apply(pool(labels=labels))["metadata"]["resourceVersion"])
    await eventually(
        lambda: (
            int(epp.mode.pool_reflector.resource_version or 0) >= version
            and epp.mode.status.settled
        )
    )


async def test_accepted_replaces_the_placeholder_condition(kube, start_epp: StartEpp):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    await start_epp()
    await eventually(lambda: accepted_writes(kube) == 1)
    [condition] = conditions(kube, "premium")
    assert condition["type"] == "Accepted"
    assert condition["status"] == "True"
    assert condition["reason"] == "Accepted"
    assert condition["message"] == ACCEPTED_MESSAGE
    assert condition["observedGeneration"] == 1


async def test_status_is_not_rewritten_when_nothing_changed(kube, start_epp: StartEpp):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    epp = await start_epp()
    await eventually(lambda: accepted_writes(kube) == 1)
    kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}))
    kube.apply(pool(labels={"tier": "gpu"}))
    labelled = objective("premium", priority=10)
    labelled["metadata"]["labels"] = {"team": "search"}
    kube.apply(labelled)
    kube.drop_watches()
    await eventually(lambda: "10.0.0.1:8000" in epp.addresses())
    await caught_up(kube, epp)
    assert len(kube.status_writes()) == 1


async def test_no_second_write_while_the_objective_watch_lags_behind_our_own_write(
    kube, start_epp: StartEpp
):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    kube.hold(OBJECTIVES)
    epp = await start_epp()
    await eventually(lambda: accepted_writes(kube) == 1)
    await pool_change_handled(kube, epp, tier="gpu")
    assert len(kube.status_writes()) == 1
    kube.release()
    await caught_up(kube, epp)
    assert len(kube.status_writes()) == 1


async def test_a_refused_write_is_not_repeated_from_the_same_version(
    kube, start_epp: StartEpp, caplog
):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    kube.fail("/status")
    epp = await start_epp()
    await eventually(lambda: "premium: status write failed" in caplog.text)
    kube.hold(OBJECTIVES)
    labelled = objective("premium", priority=10)
    labelled["metadata"]["labels"] = {"team": "search"}
    kube.apply(labelled)
    kube.heal()
    await eventually(lambda: refused_writes(kube) == 1)
    await pool_change_handled(kube, epp, tier="gpu")
    assert refused_writes(kube) == 1
    assert accepted_writes(kube) == 0
    kube.release()
    await caught_up(kube, epp)
    assert (refused_writes(kube), accepted_writes(kube)) == (1, 1)


async def test_a_spec_change_updates_the_observed_generation_only(kube, start_epp):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    await start_epp()
    await eventually(lambda: accepted_writes(kube) == 1)
    [before] = conditions(kube, "premium")
    kube.apply(objective("premium", priority=20))
    await eventually(lambda: accepted_writes(kube) == 2)
    [after] = conditions(kube, "premium")
    assert after["observedGeneration"] == 2
    assert after["lastTransitionTime"] == before["lastTransitionTime"]


async def test_objectives_of_other_pools_are_left_alone(kube, start_epp: StartEpp):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    kube.apply(objective("elsewhere", priority=7, pools=("pool-b",)))
    epp = await start_epp()
    await eventually(lambda: accepted_writes(kube) == 1)
    await caught_up(kube, epp)
    assert conditions(kube, "elsewhere")[0]["reason"] == "Pending"
    assert len(kube.status_writes()) == 1


async def test_two_epps_sharing_an_objective_stay_quiet(kube, start_epp: StartEpp):
    kube.apply(pool("pool-a"))
    kube.apply(pool("pool-b"))
    kube.apply(objective("shared", priority=5, pools=("pool-a", "pool-b")))
    first = await start_epp("pool-a", identity="epp-a", leader_election=True)
    second = await start_epp("pool-b", identity="epp-b", leader_election=True)
    await eventually(lambda: first.mode.is_leader and second.mode.is_leader)
    await eventually(lambda: accepted_writes(kube) == 1)
    kube.apply(pool("pool-a", labels={"zone": "a"}))
    kube.apply(pool("pool-b", labels={"zone": "b"}))
    await caught_up(kube, first, second)
    assert accepted_writes(kube) == 1
    assert len(kube.status_writes()) <= 2

    kube.apply(objective("shared", priority=6, pools=("pool-a", "pool-b")))
    await eventually(lambda: conditions(kube, "shared")[0]["observedGeneration"] == 2)
    await caught_up(kube, first, second)
    assert accepted_writes(kube) == 2
    assert len(kube.status_writes()) <= 4
    assert first.mode.status.writes + second.mode.status.writes == 2


async def test_a_failed_status_write_is_retried(kube, start_epp: StartEpp, caplog):
    kube.apply(pool())
    kube.apply(objective("premium", priority=10))
    kube.fail("/status")
    await start_epp()
    await eventually(lambda: "premium: status write failed" in caplog.text)
    assert conditions(kube, "premium")[0]["reason"] == "Pending"
    kube.heal()
    await eventually(lambda: conditions(kube, "premium")[0]["type"] == "Accepted")
