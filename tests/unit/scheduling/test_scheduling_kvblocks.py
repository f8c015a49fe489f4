"""The precise prefix cache's core: vLLM's block keys and the block index
that the servers' KV-cache events keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.scheduling.kvblocks import (
    AllBlocksCleared,
    BlockHasher,
    BlockRemoved,
    BlockStored,
    HashAlgorithm,
    KVBlockIndex,
    KVEvent,
)

VLLM_EVENT = json.loads(
    (
        Path(__file__).parents[2] / "data" / "vllm" / "block_stored_sha256_cbor_seed42.json"
    ).read_text()
)


def test_block_keys_equal_the_ones_a_vllm_server_published_for_the_same_tokens() -> None:
    hasher = BlockHasher(
        VLLM_EVENT["block_size"],
        VLLM_EVENT["hash_seed"],
        HashAlgorithm(VLLM_EVENT["hash_algorithm"]),
    )
    keys = hasher.keys(VLLM_EVENT["token_ids"])
    assert list(keys) == VLLM_EVENT["block_hashes"]
    assert len(keys) == 25


def test_another_seed_or_algorithm_gives_other_keys() -> None:
    tokens = VLLM_EVENT["token_ids"]
    expected = VLLM_EVENT["block_hashes"][0]
    assert BlockHasher(16, "0").keys(tokens)[0] != expected
    for algorithm in HashAlgorithm:
        if algorithm is not HashAlgorithm.SHA256_CBOR:
            assert BlockHasher(16, "42", algorithm).keys(tokens)[0] != expected


def test_only_full_blocks_are_keyed_and_max_blocks_caps_them() -> None:
    hasher = BlockHasher(16, "42")
    assert hasher.keys(list(range(15))) == ()
    assert len(hasher.keys(list(range(40)))) == 2
    assert hasher.keys(list(range(400)), max_blocks=3) == hasher.keys(list(range(48)))


def test_a_lora_name_or_a_cache_salt_changes_the_keys() -> None:
    hasher = BlockHasher(16, "42")
    tokens = list(range(64))
    plain = hasher.keys(tokens)
    salted = hasher.keys(tokens, cache_salt="tenant-a")
    lora = hasher.keys(tokens, lora_name="adapter")
    assert len({plain[0], salted[0], lora[0]}) == 3
    # the salt taints block 0 only, but the chain carries it on
    assert salted[1] != plain[1]


@given(
    st.lists(st.integers(0, 200_000), min_size=16, max_size=96),
    st.lists(st.integers(0, 200_000), max_size=64),
)
def test_prompts_share_keys_exactly_over_their_shared_full_blocks(
    prefix: list[int], tail: list[int]
) -> None:
    hasher = BlockHasher(16, "7")
    a = hasher.keys(prefix)
    b = hasher.keys(prefix + tail)
    assert b[: len(a)] == a


def test_a_bad_block_size_is_refused() -> None:
    with pytest.raises(ValueError, match="block size"):
        BlockHasher(0)


# -- the index ----------------------------------------------------------------


def test_an_endpoint_matches_its_leading_run_of_stored_keys() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2, 3))])
    index.apply("b", [BlockStored((1, 2)), BlockStored((9,))])
    assert index.matches((1, 2, 3, 4)) == {"a": 3, "b": 2}
    assert index.matches((3, 9)) == {"a": 1}
    assert index.matches((5, 1)) == {}


def test_matching_stops_at_an_endpoints_first_missing_key() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2, 3, 4)), BlockRemoved((2,))])
    assert index.matches((1, 2, 3, 4)) == {"a": 1}


def test_removed_blocks_no_longer_match() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2, 3)), BlockRemoved((3,))])
    assert index.matches((1, 2, 3)) == {"a": 2}
    index.apply("a", [BlockRemoved((1,))])
    assert index.matches((1, 2, 3)) == {}
    assert len(index) == 1  # key 2, still held


def test_a_block_offloaded_to_cpu_and_still_on_gpu_stays_until_both_are_removed() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1,), medium="GPU"), BlockStored((1,), medium="CPU")])
    index.apply("a", [BlockRemoved((1,), medium="GPU")])
    assert index.matches((1,)) == {"a": 1}
    index.apply("a", [BlockRemoved((1,), medium="CPU")])
    assert index.matches((1,)) == {}


def test_all_blocks_cleared_drops_only_that_endpoints_blocks() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2))])
    index.apply("b", [BlockStored((1, 2))])
    index.apply("a", [AllBlocksCleared()])
    assert index.matches((1, 2)) == {"b": 2}
    assert index.held_by("a") == 0


def test_a_restarted_endpoint_is_the_former_home_of_what_it_alone_held_deeper() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2, 3, 4))])
    index.apply("b", [BlockStored((1, 2))])
    index.apply("a", [AllBlocksCleared()])
    assert index.matches((1, 2, 3, 4, 5)) == {"b": 2}  # what the servers hold
    assert index.former_keys() == 4
    assert index.former_home((1, 2, 3, 4, 5), 2) == ("a", 4)
    assert index.former_home((1, 2), 2) is None  # b holds all of it
    assert index.former_home((1, 9, 3), 1) is None  # a held only 1 of its leading run


def test_a_restarted_endpoint_that_evicts_again_is_nobodys_former_home() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2, 3))])
    index.apply("a", [AllBlocksCleared()])
    index.apply("a", [BlockStored((7, 8))])
    assert index.former_home((1, 2, 3), 0) == ("a", 3)
    index.apply("a", [BlockRemoved((7,))])  # it is full again
    assert index.former_home((1, 2, 3), 0) is None
    assert index.former_keys() == 0


def test_a_departed_endpoint_takes_what_it_held_before_its_restart_with_it() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2)), AllBlocksCleared()])
    index.remove_endpoint("a")
    assert index.former_home((1, 2), 0) is None
    assert index.former_keys() == 0


def test_former_keys_count_against_the_size_the_oldest_restart_dropped_first() -> None:
    index = KVBlockIndex(size=5)
    index.apply("a", [BlockStored((1, 2)), AllBlocksCleared()])
    index.apply("b", [BlockStored((3, 4)), AllBlocksCleared()])
    index.apply("c", [BlockStored((5, 6))])
    assert index.former_keys() == 2 and index.former_home((1,), 0) is None
    assert index.former_home((3, 4), 0) == ("b", 2)
    assert index.counters.evictions == 0


def test_a_departed_endpoint_takes_its_blocks_with_it() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1, 2))])
    index.apply("b", [BlockStored((1,))])
    index.remove_endpoint("a")
    assert index.matches((1, 2)) == {"b": 1}
    assert len(index) == 1
    assert index.endpoints() == {"b"}


def test_removing_a_block_never_stored_is_counted_and_changes_nothing() -> None:
    index = KVBlockIndex()
    index.apply("a", [BlockStored((1,))])
    index.apply("a", [BlockRemoved((7,))])
    index.apply("b", [BlockRemoved((1,))])
    assert index.counters.removed_unknown == 2
    assert index.matches((1,)) == {"a": 1}


def test_past_its_size_the_index_evicts_the_least_recently_stored_key() -> None:
    index = KVBlockIndex(size=3)
    index.apply("a", [BlockStored((1, 2, 3))])
    index.apply("b", [BlockStored((1,))])  # 1 is now the most recent
    index.apply("a", [BlockStored((4,))])
    assert len(index) == 3
    assert index.counters.evictions == 1
    assert not index.holds("a", 2)
    assert index.matches((1, 2)) == {"a": 1, "b": 1}


def test_a_key_keeps_at_most_pods_per_key_endpoints() -> None:
    index = KVBlockIndex(pods_per_key=2)
    for endpoint in ("a", "b", "c"):
        index.apply(endpoint, [BlockStored((1,))])
    assert index.matches((1,)) == {"b": 1, "c": 1}
    assert index.held_by("a") == 0


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.booleans(),
            st.lists(st.integers(0, 20), min_size=1, max_size=5),
        ),
        max_size=60,
    ),
    st.integers(1, 12),
)
def test_the_index_stays_within_its_size_and_consistent(
    operations: list[tuple[str, bool, list[int]]], size: int
) -> None:
    index = KVBlockIndex(size=size, pods_per_key=2)
    for endpoint, stored, keys in operations:
        if keys == [0]:
            event: KVEvent = AllBlocksCleared()
        else:
            event = BlockStored(tuple(keys)) if stored else BlockRemoved(tuple(keys))
        index.apply(endpoint, [event])
        assert len(index) + index.former_keys() <= size
    for key in range(21):
        holders = {e for e in "abc" if index.holds(e, key)}
        assert len(holders) <= 2
        match = index.matches((key,))
        assert set(match) == holders


def test_a_speculative_guess_holds_until_its_ttl_unless_an_event_confirms_it() -> None:
    now = [0.0]
    index = KVBlockIndex(speculative_ttl=2.0, clock=lambda: now[0])
    index.record("a", (1, 2))
    index.record("b", (1,))
    assert index.matches((1, 2)) == {"a": 2, "b": 1}
    index.apply("a", [BlockStored((1,))])
    now[0] = 2.5
    assert index.matches((1, 2)) == {"a": 1}
    assert len(index) == 1


def test_without_speculation_recording_a_pick_stores_nothing() -> None:
    index = KVBlockIndex()
    index.record("a", (1, 2))
    assert index.matches((1, 2)) == {}


def test_block_keys_taken_from_the_digest_memo_are_the_ones_computed() -> None:
    from epp.scheduling.kvblocks import DigestMemo

    hasher = BlockHasher(16, "42")
    tokens = list(range(500, 500 + 16 * 5))
    memo = DigestMemo(capacity=100)
    first = hasher.keys(tokens, memo=memo, cache_salt="s")
    assert len(memo) == 5
    assert (
        hasher.keys(tokens, memo=memo, cache_salt="s")
        == first
        == hasher.keys(tokens, cache_salt="s")
    )
    assert len(memo) == 5  # the second prompt was all found
    longer = hasher.keys([*tokens, *range(16)], memo=memo, cache_salt="s")
    assert longer[:5] == first and len(memo) == 6
    assert hasher.keys(tokens, memo=memo) == hasher.keys(tokens)  # another salt: other inputs


def test_the_digest_memo_starts_over_past_its_capacity_counting_what_it_dropped() -> None:
    from epp.scheduling.kvblocks import DigestMemo

    memo = DigestMemo(capacity=4)
    BlockHasher(16).keys(list(range(16 * 6)), memo=memo)
    assert len(memo) == 2  # cleared at the fifth block, then blocks 5 and 6
    assert memo.dropped == 4
