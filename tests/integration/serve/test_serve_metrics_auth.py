"""/metrics behind TokenReview and SubjectAccessReview in cluster mode
(`--metrics-endpoint-auth`, on by default), open in file mode; against the
emulated API server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from epp.k8s.metrics_auth import MetricsAuthorizer, bearer_token
from tests.support.kube import KubeEmulator, pod, pool
from tests.support.serving import serving


@pytest.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator:
        emulator.add_token("prom-token", "system:serviceaccount:monitoring:prometheus")
        emulator.add_token("group-token", "someone", groups=("metrics-readers",))
        emulator.add_token("nobody-token", "nobody")
        emulator.allow("system:serviceaccount:monitoring:prometheus")
        emulator.allow("metrics-readers")
        yield emulator


@contextlib.asynccontextmanager
async def epp(tmp_path, kube: KubeEmulator | None, **options: object) -> AsyncIterator[str]:
    """A started EppServer; yields its /metrics URL."""
    if kube is not None:
        kube.apply(pool())
        kube.apply(pod("a-1", "10.0.0.1", {"app": "pool-a"}))
        inputs: dict[str, object] = {
            "pool_name": "pool-a",
            "kubeconfig": kube.write_kubeconfig(tmp_path / "kubeconfig"),
        }
    else:
        inputs = {"endpoints": "127.0.0.1:1"}
    async with serving(secure_serving=False, **inputs, **options) as server:
        yield f"http://127.0.0.1:{server.ports['metrics']}/metrics"


async def scrape(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        body = await response.text()
        if response.status == 200:
            assert "inference_objective_request_total" in body or "# HELP" in body
        return response.status


@pytest.mark.parametrize(
    ("token", "status"),
    [
        (None, 401),
        ("forged-token", 401),
        ("nobody-token", 403),
        ("prom-token", 200),
        ("group-token", 200),
    ],
)
async def test_cluster_mode_metrics_need_an_allowed_token(tmp_path, kube, token, status):
    async with epp(tmp_path, kube) as url:
        assert await scrape(url, token) == status


async def test_the_access_review_asks_for_get_on_the_metrics_path(tmp_path, kube):
    async with epp(tmp_path, kube) as url:
        await scrape(url, "prom-token")
    token_review, access_review = kube.reviews
    assert token_review["spec"] == {"token": "prom-token"}
    assert access_review["spec"]["user"] == "system:serviceaccount:monitoring:prometheus"
    assert access_review["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}


async def test_metrics_endpoint_auth_false_leaves_metrics_open(tmp_path, kube):
    async with epp(tmp_path, kube, metrics_endpoint_auth=False) as url:
        assert await scrape(url) == 200
    assert kube.reviews == []


async def test_file_mode_metrics_are_open(tmp_path):
    async with epp(tmp_path, None) as url:
        assert await scrape(url) == 200


async def test_an_answer_is_reused_for_the_same_token(kube):
    async with kube.api_client() as api:
        authorizer = MetricsAuthorizer(api)
        for _ in range(3):
            assert await authorizer.check("Bearer prom-token") == 200
            assert await authorizer.check("Bearer nobody-token") == 403
    assert len(kube.reviews) == 4


async def test_answers_expire(kube):
    now = [0.0]
    async with kube.api_client() as api:
        authorizer = MetricsAuthorizer(api, clock=lambda: now[0])
        await authorizer.check("Bearer nobody-token")
        now[0] = 31.0
        await authorizer.check("Bearer nobody-token")
    assert len(kube.reviews) == 4


async def test_the_answer_table_is_bounded(kube):
    async with kube.api_client() as api:
        authorizer = MetricsAuthorizer(api, max_cached=1)
        await authorizer.check("Bearer prom-token")
        await authorizer.check("Bearer group-token")
        await authorizer.check("Bearer prom-token")
    assert len(kube.reviews) == 6


async def test_an_api_server_outage_is_500_and_not_remembered(kube):
    async with kube.api_client() as api:
        authorizer = MetricsAuthorizer(api)
        kube.fail("tokenreviews")
        assert await authorizer.check("Bearer prom-token") == 500
        kube.heal()
        assert await authorizer.check("Bearer prom-token") == 200


@pytest.mark.parametrize(
    ("header", "token"),
    [(None, None), ("Basic abc", None), ("Bearer ", None), ("bearer t1", "t1")],
)
def test_only_a_bearer_token_is_taken(header, token):
    assert bearer_token(header) == token
