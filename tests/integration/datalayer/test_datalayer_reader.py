"""The metrics reader against pages written from each engine's metric definitions
(`pages/`, one per engine and version; each file says where its series come from)."""

from pathlib import Path

import pytest

from epp.datalayer.engines import ENGINES, EngineLookup, Series, parse_series
from epp.datalayer.reader import MetricsReader, select_lines

PAGES = Path(__file__).parent / "pages"
VLLM = ENGINES["vllm"]


def page(name: str) -> str:
    return (PAGES / name).read_text()


def read(text: str, engine: str = "vllm"):
    return MetricsReader().read(text, ENGINES[engine], now=7.0)


def page_with(waiting: str, kv: str) -> str:
    return (
        f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 0\n"
        f"vllm:kv_cache_usage_perc {kv}\n"
    )


def load(metrics) -> tuple[float, float, float]:
    return metrics.waiting, metrics.running, metrics.kv_usage


def test_a_vllm_page_gives_queue_running_and_kv_usage():
    metrics = read(page("vllm_v1_0.10.txt"))
    assert load(metrics) == (3.0, 7.0, 0.42)
    assert metrics.updated_at == 7.0


def test_the_newest_lora_sample_wins():
    metrics = read(page("vllm_v1_0.10.txt"))
    assert metrics.lora_running == {"sql-lora", "chat-lora"}
    assert metrics.lora_waiting == {"tool-lora"}
    assert metrics.lora_max == 4


def test_the_cache_config_gives_block_size_and_count():
    metrics = read(page("vllm_v1_0.10.txt"))
    assert (metrics.block_size, metrics.num_gpu_blocks) == (16, 27000)


def test_a_v0_engine_page_reads_kv_use_from_gpu_cache_usage_perc():
    metrics = read(page("vllm_v0_0.8.txt"))
    assert load(metrics) == (2.0, 5.0, 0.27)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (16, 7282)


def test_kv_cache_usage_perc_wins_over_the_deprecated_name_when_both_are_there():
    assert read(page("vllm_v1_0.10_dp2_none_blocks.txt")).kv_usage == 0.52


def test_data_parallel_engines_are_summed():
    metrics = read(page("vllm_v1_0.10_dp2_none_blocks.txt"))
    assert (metrics.waiting, metrics.running) == (3.0, 10.0)


def test_an_unset_block_count_drops_that_value_only():
    metrics = read(page("vllm_v1_0.10_dp2_none_blocks.txt"))
    assert (metrics.block_size, metrics.num_gpu_blocks) == (32, None)
    assert load(metrics) == (3.0, 10.0, 0.52)


def test_api_server_copies_of_a_gauge_are_counted_once():
    metrics = read(page("vllm_v1_api_servers_multiprocess.txt"))
    assert load(metrics) == (4.0, 9.0, 0.6)


def test_pid_copies_of_a_count_are_counted_once():
    text = (
        'vllm:num_requests_waiting{engine="0",pid="11"} 4\n'
        'vllm:num_requests_waiting{engine="0",pid="12"} 4\n'
        'vllm:num_requests_running{engine="0",pid="11"} 2\n'
        'vllm:num_requests_running{engine="0",pid="12"} 2\n'
        "vllm:kv_cache_usage_perc 0.1\n"
    )
    assert load(read(text)) == (4.0, 2.0, 0.1)


def test_sglang_tensor_parallel_ranks_are_one_scheduler():
    metrics = read(page("sglang_0.4_tp2_all_schedulers.txt"), "sglang")
    assert load(metrics) == (3.0, 8.0, 0.46)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (1, 111470)


def test_sglang_data_parallel_ranks_are_summed():
    metrics = read(page("sglang_0.5.11_dp2.txt"), "sglang")
    assert load(metrics) == (1.0, 12.0, 0.35)


def test_sglang_page_geometry_gauges_give_block_size_and_count():
    metrics = read(page("sglang_0.5.11_dp2.txt"), "sglang")
    assert (metrics.block_size, metrics.num_gpu_blocks) == (64, 2000)


def test_an_idle_sglang_server_reads_as_idle():
    metrics = read(page("sglang_idle.txt"), "sglang")
    assert load(metrics) == (0.0, 0.0, 0.0)
    assert metrics.updated_at == 7.0


def test_a_trtllm_page_gives_load_and_block_geometry():
    metrics = read(page("trtllm_serve_1.2.txt"), "trtllm-serve")
    assert load(metrics) == (2.0, 6.0, 0.375)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (32, 4096)


def test_an_idle_trtllm_server_reads_as_idle():
    metrics = read(page("trtllm_serve_idle.txt"), "trtllm-serve")
    assert load(metrics) == (0.0, 0.0, 0.0)


def test_a_page_of_another_engine_is_an_error():
    with pytest.raises(ValueError, match="no vllm:\\* series"):
        read(page("sglang_0.4_tp2_all_schedulers.txt"), "vllm")


def test_an_empty_page_is_an_error():
    with pytest.raises(ValueError, match="no trtllm_\\* series"):
        read("", "trtllm-serve")


def test_triton_series_are_told_apart_by_their_labels():
    text = (
        'nv_trt_llm_request_metrics{request_type="waiting"} 3\n'
        'nv_trt_llm_request_metrics{request_type="scheduled"} 5\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"} 0.25\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"} 64\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"} 900\n'
    )
    metrics = read(text, "triton-tensorrt-llm")
    assert load(metrics) == (3.0, 5.0, 0.25)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (64, 900)


def test_a_series_whose_name_only_starts_alike_is_ignored():
    text = "vllm:num_requests_waiting_total 50\nother 2\nvllm:num_requests_waiting 1\n"
    assert select_lines(text, ["vllm:num_requests_waiting"]) == ["vllm:num_requests_waiting 1"]


def test_windows_line_ends_are_read():
    text = "\r\n".join(
        ["vllm:num_requests_waiting 1", "vllm:num_requests_running 2", "vllm:kv_cache_usage_perc 0"]
    )
    assert read(text).running == 2


def test_kv_usage_above_one_is_clamped():
    assert read(page_with(waiting="0", kv="1.2")).kv_usage == 1.0


def test_a_non_number_is_a_clear_error():
    with pytest.raises(ValueError, match="not a finite number"):
        read(page_with(waiting="NaN", kv="0"))


def test_a_malformed_line_is_an_error():
    with pytest.raises(ValueError):
        read("vllm:num_requests_waiting lots\n")


def test_an_unchanged_page_reads_the_same_values_again():
    reader = MetricsReader()
    text = page("vllm_v1_0.10.txt")
    first = reader.read(text, VLLM, now=1.0)
    again = reader.read(text, VLLM, now=2.0)
    assert again.same_values(first)
    assert again.updated_at == 2.0


def test_the_engine_comes_from_the_llm_d_label_then_the_legacy_one():
    lookup = EngineLookup()
    assert lookup.engine_name({"llm-d.ai/engine-type": "sglang"}) == "sglang"
    assert lookup.engine_name({"inference.networking.k8s.io/engine-type": "sglang"}) == "sglang"
    both = {"llm-d.ai/engine-type": "trtllm-serve", "inference.networking.k8s.io/engine-type": "x"}
    assert lookup.engine_name(both) == "trtllm-serve"


def test_an_unlabelled_endpoint_runs_the_default_engine():
    assert EngineLookup(default_engine="sglang").engine_name({}) == "sglang"


def test_an_unknown_engine_falls_back_to_the_default():
    assert EngineLookup().engine_name({"llm-d.ai/engine-type": "tgi"}) == "vllm"


def test_an_unknown_default_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="default engine 'tgi'"):
        EngineLookup(default_engine="tgi")


def test_trtllm_serve_is_read_at_prometheus_metrics():
    assert ENGINES["trtllm-serve"].metrics_path == "/prometheus/metrics"
    assert ENGINES["vllm"].metrics_path == "/metrics"


def test_a_series_spec_reads_name_and_labels():
    assert parse_series('m{a=b, c="d"}') == Series("m", (("a", "b"), ("c", "d")))
    with pytest.raises(ValueError):
        parse_series("m{a}")


# -- the inter-token latency histogram ------------------------------------------


def itl(metrics) -> tuple[float, float]:
    return metrics.itl_sum, metrics.itl_count


def test_a_vllm_page_gives_its_inter_token_latency_sum_and_count():
    assert itl(read(page("vllm_v1_0.10.txt"))) == (195.73, 529.0)


def test_the_inter_token_latency_of_every_data_parallel_engine_is_added():
    # Each engine's buckets, count and sum come in turn within one group.
    assert itl(read(page("vllm_v1_0.11_dp2_itl.txt"))) == (20.0, 604.0)


BUCKET = 'vllm:inter_token_latency_seconds_bucket{engine="1",le="0.05",model_name="Qwen/Qwen3-8B"}'


def test_the_buckets_of_every_data_parallel_engine_are_added_by_bound():
    metrics = read(page("vllm_v1_0.11_dp2_itl.txt"))
    assert metrics.itl_bounds[:4] == (0.01, 0.025, 0.05, 0.075)
    assert metrics.itl_buckets[:4] == (0.0, 300.0, 500.0, 600.0)
    assert (metrics.itl_bounds[-1], metrics.itl_buckets[-1]) == (80.0, 604.0)  # +Inf left out
    assert list(metrics.itl_bounds) == sorted(metrics.itl_bounds)


def test_the_buckets_are_the_histogram_whose_sum_and_count_are_read():
    # vLLM 0.10 carries the deprecated name beside the new one, other counts.
    metrics = read(page("vllm_v1_0.10.txt"))
    assert metrics.itl_bounds[:3] == (0.001, 0.005, 0.01)
    assert metrics.itl_buckets[:3] == (9.0, 43.0, 50.0)
    assert metrics.itl_buckets[-1] <= metrics.itl_count


def test_an_sglang_page_gives_the_tokenizers_buckets():
    metrics = read(page("sglang_0.5_tokenizer_itl.txt"), "sglang")
    buckets = dict(zip(metrics.itl_bounds, metrics.itl_buckets, strict=True))
    assert (buckets[0.02], buckets[0.025], buckets[0.1]) == (0.0, 200.0, 220.0)


def test_a_malformed_bucket_drops_the_buckets_only():
    text = page("vllm_v1_0.11_dp2_itl.txt").replace(
        BUCKET + " 200.0",
        BUCKET + " -1",
    )
    metrics = read(text)
    assert (metrics.itl_bounds, metrics.itl_buckets) == ((), ())
    assert itl(metrics) == (20.0, 604.0)


def test_a_bucket_whose_value_changed_is_read_again():
    reader = MetricsReader()
    text = page("vllm_v1_0.11_dp2_itl.txt")
    reader.read(text, ENGINES["vllm"], now=1.0)
    grown = text.replace(
        BUCKET + " 200.0",
        BUCKET + " 250.0 1700000000000",  # with a timestamp
    )
    metrics = reader.read(grown, ENGINES["vllm"], now=2.0)
    assert metrics.itl_buckets[metrics.itl_bounds.index(0.05)] == 550.0


def test_a_vllm_before_0_11_gives_it_under_time_per_output_token():
    old = "\n".join(
        line
        for line in page("vllm_v1_0.11_dp2_itl.txt").splitlines()
        if "inter_token_latency" not in line
    )
    assert itl(read(old)) == (20.0, 604.0)


def test_the_new_name_wins_over_the_deprecated_one():
    text = page("vllm_v1_0.11_dp2_itl.txt").replace(
        'vllm:time_per_output_token_seconds_sum{engine="1",model_name="Qwen/Qwen3-8B"} 8.0',
        'vllm:time_per_output_token_seconds_sum{engine="1",model_name="Qwen/Qwen3-8B"} 99.0',
    )
    assert itl(read(text)) == (20.0, 604.0)


def test_an_sglang_page_gives_the_tokenizers_inter_token_latency_in_tokens():
    metrics = read(page("sglang_0.5_tokenizer_itl.txt"), "sglang")
    assert itl(metrics) == (6.8, 220.0)
    assert metrics.running == 12.0


def test_a_page_without_the_histogram_reads_no_latency():
    assert itl(read(page("vllm_v0_0.8.txt"))) == (0.0, 0.0)
    assert itl(read(page("trtllm_serve_1.2.txt"), "trtllm-serve")) == (0.0, 0.0)


def test_a_malformed_latency_drops_the_latency_only():
    text = page("vllm_v1_0.11_dp2_itl.txt").replace(
        'vllm:inter_token_latency_seconds_sum{engine="1",model_name="Qwen/Qwen3-8B"} 8.0',
        'vllm:inter_token_latency_seconds_sum{engine="1",model_name="Qwen/Qwen3-8B"} NaN',
    )
    metrics = read(text)
    assert itl(metrics) == (0.0, 0.0)
    assert load(metrics) == (1.0, 58.0, 0.61)


def test_the_histogram_search_stops_at_the_next_family():
    text = (
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        'vllm:inter_token_latency_seconds_count{engine="0"} 4.0\n'
        'vllm:inter_token_latency_seconds_sum{engine="0"} 0.2\n'
        "# TYPE other histogram\n"
        "vllm:inter_token_latency_seconds_sum_total 9.0\n"
        'vllm:inter_token_latency_seconds_sum{engine="9"} 9.0\n'
    )
    lines = select_lines(text, (), ("vllm:inter_token_latency_seconds",))
    assert sorted(lines) == [
        'vllm:inter_token_latency_seconds_count{engine="0"} 4.0',
        'vllm:inter_token_latency_seconds_sum{engine="0"} 0.2',
    ]
