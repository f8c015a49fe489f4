"""The P/D decision of the reference's sample configuration, end to end
through the scheduler: the prefix-based decider reads the decode endpoint's
cache as it was before this request was placed."""

import random
from pathlib import Path

from epp.config.loader import load_config
from epp.scheduling.endpoint import Endpoint, EndpointMetrics, PoolSnapshot
from epp.scheduling.profiles import PREFILLER_HEADER
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scheduler import Scheduler

NOW = 100.0
PD_CONFIG = Path(__file__).resolve().parents[3] / "config" / "scenarios" / "pd-epp.yaml"
LONG_PROMPT = "the same long system prompt " * 200  # 5,600 characters, 1,400 tokens


def endpoint(index: int, role: str) -> Endpoint:
    return Endpoint(
        f"e{index}",
        f"10.0.0.{index}:8000",
        {"llm-d.ai/role": role},
        EndpointMetrics(updated_at=NOW),
    )


def pd_scheduler() -> Scheduler:
    pool = PoolSnapshot((endpoint(1, "prefill"), endpoint(2, "decode")), 1, 1)
    config = load_config(PD_CONFIG).scheduling
    return Scheduler(config, lambda: pool, lambda: NOW, random.Random(1))


def request(prompt: str) -> InferenceRequest:
    return InferenceRequest("m", "m", prompt=prompt, input_tokens=len(prompt) // 4)


def test_an_uncached_long_prompt_is_prefilled_on_a_prefill_endpoint():
    placed = request(LONG_PROMPT)
    chosen = pd_scheduler().choose(placed)
    assert chosen.address == "10.0.0.2:8000"
    assert placed.routing == {PREFILLER_HEADER: "10.0.0.1:8000"}


def test_the_same_prompt_again_stays_on_the_decode_endpoint_that_cached_it():
    scheduler = pd_scheduler()
    scheduler.choose(request(LONG_PROMPT))
    again = request(LONG_PROMPT)
    assert scheduler.choose(again).address == "10.0.0.2:8000"
    assert again.routing is None


def test_a_short_prompt_is_never_disaggregated():
    placed = request("a short question")
    pd_scheduler().choose(placed)
    assert placed.routing is None
