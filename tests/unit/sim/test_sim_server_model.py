"""The model server's timing formulas, queue limit and prefix cache."""

from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.sim.server_model import ITL_BUCKETS, ModelServer, ServerParams, ServerRequest

PARAMS = ServerParams(
    max_num_seqs=4,
    prefill_ms_per_token=0.5,
    prefill_overhead_ms=10.0,
    decode_ms_per_token=20.0,
    decode_batch_growth=0.1,
    kv_blocks=1000,
    block_size=16,
)


class Recorder:
    def __init__(self):
        self.done = []

    def started(self, request, now):
        pass

    def first_token(self, request, now):
        pass

    def finished(self, request, now):
        self.done.append(request)


def run_until_idle(server):
    while server.next_event_time() != float("inf"):
        server.advance(server.next_event_time())


def test_first_token_after_one_step_with_prefill_and_last_after_one_step_per_token():
    server = ModelServer(PARAMS, Recorder())
    request = ServerRequest(1, prompt_tokens=100, output_tokens=5)
    server.admit(request, 1.0)
    run_until_idle(server)
    assert request.first_token_at == pytest.approx(1.0 + (20.0 + 10.0 + 0.5 * 100) / 1000)
    assert request.finished_at == pytest.approx(request.first_token_at + 4 * 0.020)


def test_decode_steps_grow_with_the_batch():
    server = ModelServer(PARAMS, Recorder())
    long = ServerRequest(1, prompt_tokens=10, output_tokens=100)
    short = ServerRequest(2, prompt_tokens=10, output_tokens=5)
    server.admit(long, 0.0)
    server.admit(short, 0.0)
    run_until_idle(server)
    batch_of_two = 0.020 * (1 + 0.1)
    assert short.finished_at - short.first_token_at == pytest.approx(4 * batch_of_two)


def test_a_request_arriving_mid_run_joins_at_the_next_step_boundary():
    server = ModelServer(PARAMS, Recorder())
    first = ServerRequest(1, prompt_tokens=10, output_tokens=100)
    server.admit(first, 0.0)
    server.advance(0.5)
    late = ServerRequest(2, prompt_tokens=10, output_tokens=2)
    server.admit(late, 0.5)
    prefill_end = first.first_token_at
    steps_done = int((0.5 - prefill_end) / 0.020)
    run_until_idle(server)
    assert late.started_at == pytest.approx(prefill_end + (steps_done + 1) * 0.020)


def test_new_params_set_the_decode_step_from_the_next_batch_change_even_over_the_new_batch_cap():
    server = ModelServer(PARAMS, Recorder())
    # The first prefills alone, the rest a step later: each ends a step after the one before.
    held = [
        ServerRequest(i, prompt_tokens=10, output_tokens=n) for i, n in enumerate((50, 50, 51, 52))
    ]
    for request in held:
        server.admit(request, 0.0)
    server.advance(0.2)
    server.params = ServerParams(max_num_seqs=2, decode_ms_per_token=40.0, decode_batch_growth=0.1)
    run_until_idle(server)
    # Each finish changes the batch: after the first, the three left step at
    # the new speed for a batch of three, though the new cap is two.
    three, two = 0.040 * (1 + 0.1 * 2), 0.040 * (1 + 0.1)
    assert held[1].finished_at - held[0].finished_at == pytest.approx(three)
    assert held[2].finished_at - held[1].finished_at == pytest.approx(two)


def test_a_full_waiting_queue_rejects_and_counts():
    params = ServerParams(max_num_seqs=1, max_waiting=1)
    server = ModelServer(params, Recorder())
    assert server.admit(ServerRequest(1, 10, 100), 0.0)
    assert server.admit(ServerRequest(2, 10, 100), 0.0)
    assert not server.admit(ServerRequest(3, 10, 100), 0.0)
    assert server.rejected == 1
    assert len(server.waiting) == 1


def test_a_shared_prefix_is_served_from_the_cache_the_second_time():
    server = ModelServer(PARAMS, Recorder())
    first = ServerRequest(1, 200, 2, prefix_group=0, prefix_tokens=160)
    server.admit(first, 0.0)
    run_until_idle(server)
    second = ServerRequest(2, 200, 2, prefix_group=0, prefix_tokens=160)
    server.admit(second, 1.0)
    run_until_idle(server)
    assert (first.cached_tokens, second.cached_tokens) == (0, 160)
    assert second.first_token_at - 1.0 == pytest.approx((20.0 + 10.0 + 0.5 * 40) / 1000)


def test_a_failed_server_hands_back_every_request_it_held():
    server = ModelServer(ServerParams(max_num_seqs=1), Recorder())
    held = [ServerRequest(i, 10, 100) for i in range(3)]
    for request in held:
        server.admit(request, 0.0)
    assert sorted(r.request_id for r in server.fail()) == [0, 1, 2]
    assert (server.running, len(server.waiting), server.next_event_time()) == (0, 0, float("inf"))


@pytest.mark.parametrize("where", ["waiting", "prefilling", "running"])
def test_an_aborted_request_frees_its_place_and_blocks_and_never_finishes(where):
    params = ServerParams(max_num_seqs=1, kv_blocks=1000, block_size=16)
    recorder = Recorder()
    server = ModelServer(params, recorder)
    first = ServerRequest(1, prompt_tokens=10, output_tokens=50)
    second = ServerRequest(2, prompt_tokens=10, output_tokens=5)
    server.admit(first, 0.0)
    server.admit(second, 0.0)
    if where == "running":
        server.advance(server.next_event_time())
    victim = second if where == "waiting" else first
    assert server.abort(victim, server.next_event_time() - 1e-6 if where != "running" else 0.1)
    assert not server.abort(victim, 0.1)
    run_until_idle(server)
    assert victim not in recorder.done
    assert len(recorder.done) == 1
    assert server.used_blocks == 0
    assert (server.running, len(server.waiting)) == (0, 0)


# -- the inter-token latency histogram ------------------------------------------


def test_the_latency_histogram_holds_every_token_after_each_requests_first():
    # Arrivals that cut runs of decode steps short and prefill steps that
    # stall the requests decoding: each request's tokens after its first
    # span exactly the latencies the histogram holds for it.
    server = ModelServer(PARAMS, Recorder())
    requests = [ServerRequest(i, prompt_tokens=50 * i, output_tokens=3 + 7 * i) for i in range(6)]
    for index, request in enumerate(requests):
        at = 0.037 * index
        server.advance(at)
        server.admit(request, at)
    run_until_idle(server)
    metrics = server.metrics(100.0)
    assert metrics.itl_count == sum(r.output_tokens - 1 for r in requests)
    assert metrics.itl_sum == pytest.approx(sum(r.finished_at - r.first_token_at for r in requests))


def test_a_decoding_request_observes_the_prefill_step_of_a_newcomer_who_observes_none():
    server = ModelServer(PARAMS, Recorder())
    server.admit(ServerRequest(1, prompt_tokens=10, output_tokens=100), 0.0)
    # Its first token at 0.035; 20 ms steps; the one under way at 0.5 ends
    # at 0.515, when the newcomer's prefill step starts.
    server.advance(0.5)
    server.admit(ServerRequest(2, prompt_tokens=400, output_tokens=100), 0.5)
    prefill_step = (20.0 * 1.1 + 10.0 + 0.5 * 400) / 1000
    now = 0.515 + prefill_step + 3 * 0.022 + 0.001  # three steps of both since
    server.advance(now)
    metrics = server.metrics(now)
    assert metrics.itl_count == 24 + 1 + 3 * 2
    assert metrics.itl_sum == pytest.approx(24 * 0.020 + prefill_step + 3 * 2 * 0.022)


def test_the_histograms_buckets_hold_each_steps_observations_under_its_length():
    server = ModelServer(PARAMS, Recorder())
    server.admit(ServerRequest(1, prompt_tokens=10, output_tokens=100), 0.0)
    server.advance(0.5)
    server.admit(ServerRequest(2, prompt_tokens=400, output_tokens=100), 0.5)
    prefill_step = (20.0 * 1.1 + 10.0 + 0.5 * 400) / 1000  # 0.232: under 0.3
    now = 0.515 + prefill_step + 3 * 0.022 + 0.001
    server.advance(now)
    metrics = server.metrics(now)
    assert metrics.itl_bounds == ITL_BUCKETS
    buckets = dict(zip(metrics.itl_bounds, metrics.itl_buckets, strict=True))
    assert (buckets[0.01], buckets[0.025], buckets[0.2], buckets[0.3]) == (0, 30, 30, 31)
    assert buckets[80.0] == 31


def test_the_metrics_count_the_steps_that_ended_by_then():
    server = ModelServer(PARAMS, Recorder())
    request = ServerRequest(1, prompt_tokens=100, output_tokens=100)
    server.admit(request, 0.0)
    server.advance(0.1)  # past the prefill step
    first = request.first_token_at
    metrics = server.metrics(first + 10.5 * 0.020)
    assert metrics.itl_count == 10
    assert metrics.itl_sum == pytest.approx(10 * 0.020)


def test_a_server_that_fails_starts_its_histogram_again():
    server = ModelServer(PARAMS, Recorder())
    server.admit(ServerRequest(1, prompt_tokens=10, output_tokens=50), 0.0)
    server.advance(0.5)
    assert server.metrics(0.5).itl_count > 0
    server.fail()
    assert (server.metrics(0.6).itl_sum, server.metrics(0.6).itl_count) == (0.0, 0)
    assert not any(server.metrics(0.6).itl_buckets)


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 4000), min_size=1, max_size=12),
    prefill_ms_per_token=st.sampled_from([0.01, 0.5, 5.0, 50.0]),
    fail_after=st.integers(0, 40),
)
def test_the_cumulative_buckets_are_the_running_sums_of_the_servers_own_at_every_event(
    prompts, prefill_ms_per_token, fail_after
):
    params = ServerParams(max_num_seqs=3, prefill_ms_per_token=prefill_ms_per_token)
    server = ModelServer(params, Recorder())
    for index, prompt in enumerate(prompts):
        server.admit(ServerRequest(index, prompt_tokens=prompt, output_tokens=20), 0.01 * index)
    events = 0
    while server.next_event_time() != float("inf"):
        now = server.next_event_time()
        server.advance(now)
        events += 1
        if events == fail_after:
            server.fail()
            server.admit(ServerRequest(99, prompt_tokens=10, output_tokens=20), now)
        expected = tuple(accumulate(server.itl_buckets[:-1]))
        assert server.metrics(now).itl_buckets == expected
