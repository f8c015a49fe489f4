"""`bench.robustness`: random pools drawn from a seed, judged in virtual time."""

from bench.robustness import as_json, draw_pool, run_pool


def test_a_seed_draws_the_same_pools_and_another_seed_others():
    assert draw_pool(3, 5) == draw_pool(3, 5)
    assert draw_pool(3, 5) != draw_pool(4, 5)
    assert draw_pool(3, 5) != draw_pool(3, 6)


def test_a_pool_gives_the_same_figures_on_every_run():
    first = as_json(run_pool(2, 1, tuned=False, scale=0.1))
    second = as_json(run_pool(2, 1, tuned=False, scale=0.1))
    assert first == second
    assert first["epp"]["tokens_per_s"] > 0 and first["round_robin"]["tokens_per_s"] > 0
