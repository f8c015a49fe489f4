"""Lease naming, time format and settings checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from epp.k8s.leader import LeaseSettings, lease_name, micro_time


def test_the_lease_is_named_as_the_reference_epp_names_it():
    assert lease_name("prod", "llama") == (
        "epp-prod-llama.gateway-api-inference-extension.sigs.k8s.io"
    )


def test_micro_time_is_utc_with_six_fractional_digits():
    moment = datetime(2026, 3, 1, 14, 0, 0, tzinfo=timezone(timedelta(hours=2)))
    assert micro_time(moment) == "2026-03-01T12:00:00.000000Z"


def test_the_defaults_are_those_of_the_reference():
    assert LeaseSettings() == LeaseSettings(15.0, 10.0, 2.0)


@pytest.mark.parametrize("durations", [(10, 10, 2), (15, 2, 2), (15, 10, 0)])
def test_inconsistent_durations_are_refused(durations):
    with pytest.raises(ValueError, match="lease duration > renew deadline > retry period"):
        LeaseSettings(*durations)


def test_micro_time_of_now_parses_back():
    now = datetime.now(UTC)
    assert datetime.strptime(micro_time(now), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC) == now
