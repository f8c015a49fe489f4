from pathlib import Path

import pytest

from epp.datalayer.engines import ENGINES, engine_metric_names
from epp.datalayer.reader import MetricsReader, select_lines

VLLM_PAGE = (Path(__file__).parent / "vllm_metrics.txt").read_text()
VLLM = ENGINES["vllm"]


def read(text: str, engine: str = "vllm"):
    return MetricsReader().read(text, ENGINES[engine], now=7.0)


def page_with(waiting: str, kv: str) -> str:
    return (
        f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 0\n"
        f"vllm:kv_cache_usage_perc {kv}\n"
    )


def test_a_vllm_page_gives_queue_running_and_kv_usage():
    metrics = read(VLLM_PAGE)
    assert (metrics.waiting, metrics.running, metrics.kv_usage) == (3.0, 7.0, 0.42)
    assert metrics.updated_at == 7.0


def test_the_newest_lora_sample_wins():
    metrics = read(VLLM_PAGE)
    assert metrics.lora_running == {"sql-lora", "chat-lora"}
    assert metrics.lora_waiting == {"tool-lora"}
    assert metrics.lora_max == 4


def test_the_cache_config_gives_block_size_and_count():
    metrics = read(VLLM_PAGE)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (16, 27000)


def test_an_sglang_page_is_read_with_sglang_names():
    page = (
        "sglang:num_queue_reqs 2\nsglang:num_running_reqs 5\nsglang:token_usage 0.3\n"
        'sglang:cache_config_info{page_size="64",num_pages="900"} 1\n'
    )
    metrics = read(page, "sglang")
    assert (metrics.waiting, metrics.running, metrics.kv_usage) == (2, 5, 0.3)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (64, 900)


def test_a_trtllm_page_is_read_with_trtllm_names():
    page = (
        "trtllm_num_requests_waiting 1\ntrtllm_num_requests_running 4\n"
        "trtllm_kv_cache_utilization 0.6\ntrtllm_kv_cache_tokens_per_block 32\n"
    )
    metrics = read(page, "trtllm-serve")
    assert (metrics.waiting, metrics.running, metrics.kv_usage, metrics.block_size) == (
        1,
        4,
        0.6,
        32,
    )


def test_a_series_whose_name_only_starts_alike_is_ignored():
    page = "vllm:num_requests_waiting_total 50\nother 2\nvllm:num_requests_waiting 1\n"
    assert select_lines(page, ["vllm:num_requests_waiting"]) == ["vllm:num_requests_waiting 1"]


def test_samples_of_several_engines_are_summed():
    page = (
        'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} 2\n'
        "vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.1\n"
    )
    assert read(page).waiting == 3


def test_windows_line_ends_are_read():
    page = "\r\n".join(
        ["vllm:num_requests_waiting 1", "vllm:num_requests_running 2", "vllm:kv_cache_usage_perc 0"]
    )
    assert read(page).running == 2


def test_kv_usage_above_one_is_clamped():
    page = page_with(waiting="0", kv="1.2")
    assert read(page).kv_usage == 1.0


def test_a_missing_series_is_a_clear_error():
    with pytest.raises(ValueError, match="vllm:kv_cache_usage_perc missing"):
        read("vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")


def test_a_non_number_is_a_clear_error():
    page = page_with(waiting="NaN", kv="0")
    with pytest.raises(ValueError, match="not a finite number"):
        read(page)


def test_a_malformed_line_is_an_error():
    with pytest.raises(ValueError):
        read("vllm:num_requests_waiting lots\n")


def test_an_unchanged_page_reads_the_same_values_again():
    reader = MetricsReader()
    first = reader.read(VLLM_PAGE, VLLM, now=1.0)
    again = reader.read(VLLM_PAGE, VLLM, now=2.0)
    assert again.same_values(first)
    assert again.updated_at == 2.0


def test_an_unknown_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model-server engine 'tgi'"):
        engine_metric_names("tgi")
