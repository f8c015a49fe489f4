"""`bench.robustness`: random pools drawn from a seed, judged in virtual time."""

from bench.robustness import as_json, draw_pool, run_pool, scenario_of, tokens_in_window
from epp.sim.requests import COMPLETED, SimRequest


def test_a_seed_draws_the_same_pools_and_another_seed_others():
    assert draw_pool(3, 5) == draw_pool(3, 5)
    assert draw_pool(3, 5) != draw_pool(4, 5)
    assert draw_pool(3, 5) != draw_pool(3, 6)


def test_a_pool_gives_the_same_figures_on_every_run():
    first = as_json(run_pool(2, 1, tuned=False, scale=0.1))
    second = as_json(run_pool(2, 1, tuned=False, scale=0.1))
    assert first == second
    assert first["epp"]["tokens_per_s"] > 0 and first["round_robin"]["tokens_per_s"] > 0


def _served(arrival: float, first: float, finished: float, tokens: int) -> SimRequest:
    return SimRequest(
        request_id=0,
        prompt_tokens=100,
        output_tokens=tokens,
        arrival=arrival,
        outcome=COMPLETED,
        first_token_at=first,
        finished_at=finished,
    )


def test_tokens_count_what_the_pool_produced_while_the_load_lasted():
    scenario = scenario_of(draw_pool(1, 0))
    end = scenario.duration_s
    requests = [
        _served(1.0, 2.0, end - 1.0, tokens=7),  # all of it
        _served(end - 2.0, end - 1.0, end + 1.0, tokens=11),  # 1 + half of 10
        _served(end - 1.0, end + 0.5, end + 2.0, tokens=9),  # nothing yet
    ]
    dropped = _served(1.0, 2.0, 3.0, tokens=100)
    dropped.outcome = "rejected-ttl-expired"
    assert tokens_in_window(scenario, [*requests, dropped]) == (7 + 6) / end
