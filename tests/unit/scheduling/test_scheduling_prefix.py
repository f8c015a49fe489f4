import gc

from hypothesis import given, settings
from hypothesis import strategies as st
from xxhash import xxh64_intdigest

from epp.scheduling.prefix import PrefixIndex, block_hashes

BLOCK = 4


def test_first_block_hash_chains_on_the_model_seed():
    seed = xxh64_intdigest(b"model-a")
    expected = xxh64_intdigest(b"abcd", seed)
    assert block_hashes("abcdefgh", "model-a", BLOCK, 10)[0] == expected


def test_each_block_hash_chains_on_the_previous_one():
    hashes = block_hashes("abcdefgh", "m", BLOCK, 10)
    assert hashes[1] == xxh64_intdigest(b"efgh", hashes[0])


def test_prompts_sharing_leading_blocks_share_leading_hashes():
    one = block_hashes("aaaabbbbcccc", "m", BLOCK, 10)
    two = block_hashes("aaaabbbbdddd", "m", BLOCK, 10)
    assert one[:2] == two[:2]
    assert one[2] != two[2]


def test_the_same_prompt_for_another_model_shares_no_hash():
    assert not set(block_hashes("aaaabbbb", "m1", BLOCK, 10)) & set(
        block_hashes("aaaabbbb", "m2", BLOCK, 10)
    )


def test_blocks_count_characters_not_bytes():
    seed = xxh64_intdigest(b"m")
    expected = xxh64_intdigest("éééé".encode(), seed)
    assert block_hashes("ééééé", "m", BLOCK, 10) == (expected,)


def test_a_trailing_partial_block_is_not_hashed():
    assert len(block_hashes("aaaabbbbcc", "m", BLOCK, 10)) == 2


def test_a_prompt_shorter_than_one_block_has_no_hashes():
    assert block_hashes("abc", "m", BLOCK, 10) == ()


def test_blocks_beyond_the_maximum_are_not_hashed():
    assert len(block_hashes("a" * 40, "m", BLOCK, 3)) == 3


def test_a_recorded_prompt_matches_all_its_blocks():
    index = PrefixIndex(capacity=100)
    index.record("e1", (1, 2, 3))
    assert index.matches((1, 2, 3)) == {"e1": 3}


def test_matching_stops_at_the_first_missing_block():
    index = PrefixIndex(capacity=100)
    index.record("e1", (1, 2, 3))
    index.record("e2", (1, 9))
    assert index.matches((1, 2, 3, 4)) == {"e1": 3, "e2": 1}


def test_an_unknown_first_block_matches_nothing():
    index = PrefixIndex(capacity=100)
    index.record("e1", (1, 2))
    assert index.matches((7, 1, 2)) == {}


def test_the_old_generation_is_forgotten_when_the_young_one_overflows():
    index = PrefixIndex(capacity=4)
    index.record("e1", (1, 2))
    index.record("e1", (5, 6))
    index.record("e1", (7, 8))
    assert index.matches((1, 2)) == {}
    assert index.matches((5, 6)) == {"e1": 2}
    assert index.size("e1") == 4


def test_blocks_recorded_again_outlive_their_old_generation():
    index = PrefixIndex(capacity=4)
    index.record("e1", (1, 2))
    index.record("e1", (5, 6))
    index.record("e1", (1,))
    index.record("e1", (7,))
    assert index.size("e1") == 4
    assert index.matches((1, 2)) == {"e1": 1}
    assert index.matches((5, 6)) == {"e1": 2}


def test_deep_blocks_are_forgotten_before_their_prefix():
    index = PrefixIndex(capacity=4)
    index.record("e1", (1, 2, 3))
    index.record("e1", (1,))
    index.record("e1", (9,))
    index.record("e1", (8,))
    assert index.matches((1, 2, 3)) == {"e1": 1}


def test_a_first_block_held_deeper_in_another_chain_still_matches():
    index = PrefixIndex(capacity=4)
    index.record("e1", (1, 2))
    index.record("e1", (2,))
    assert index.matches((2,)) == {"e1": 1}
    index.record("e1", (7, 8))
    index.record("e1", (9,))
    assert index.matches((2,)) == {}


def test_many_holders_get_their_own_match_lengths():
    index = PrefixIndex(capacity=100)
    chain = tuple(range(100, 132))
    for depth, endpoint in [(32, "a"), (31, "b"), (16, "c"), (16, "d"), (1, "e")]:
        index.record(endpoint, chain[:depth])
    assert index.matches(chain) == {"a": 32, "b": 31, "c": 16, "d": 16, "e": 1}


def test_a_removed_endpoint_matches_nothing():
    index = PrefixIndex(capacity=10)
    index.record("e1", (1, 2))
    index.record("e2", (1, 2))
    index.remove_endpoint("e1")
    assert index.matches((1, 2)) == {"e2": 2}
    assert index.endpoints() == {"e2"}


def chain(text: str) -> tuple[int, ...]:
    """Chained block ids of `text`, one character per block: block i stands
    for the whole prefix text[: i + 1], as a chained hash does."""
    return tuple(hash(text[: end + 1]) for end in range(len(text)))


class ReferenceGenerations:
    """The plain definition: per endpoint a young and an old set of blocks;
    a prompt whose blocks would overflow the young one (capacity // 2)
    first turns it into the old one, forgetting the old; a match counts
    leading blocks up to the first miss."""

    def __init__(self, capacity: int) -> None:
        self.generation = max(1, capacity // 2)
        self.held: dict[str, list[set[int]]] = {}

    def record(self, endpoint: str, hashes: tuple[int, ...]) -> None:
        young, old = self.held.setdefault(endpoint, [set(), set()])
        if young and len(young) + len(hashes) > self.generation:
            young, old = set(), young
            self.held[endpoint] = [young, old]
        young.update(hashes)

    def blocks(self, endpoint: str) -> set[int]:
        young, old = self.held[endpoint]
        return young | old

    def matches(self, hashes: tuple[int, ...]) -> dict[str, int]:
        matched = {}
        for endpoint in self.held:
            blocks, count = self.blocks(endpoint), 0
            while count < len(hashes) and hashes[count] in blocks:
                count += 1
            if count:
                matched[endpoint] = count
        return matched


recordings = st.lists(
    st.tuples(st.sampled_from("abcd"), st.text("xy", min_size=1, max_size=8)), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 24),
    steps=recordings,
    probes=st.lists(st.text("xy", min_size=1, max_size=8), min_size=1, max_size=5),
)
def test_matches_and_sizes_equal_the_plain_definition(capacity, steps, probes):
    index, reference = PrefixIndex(capacity), ReferenceGenerations(capacity)
    for endpoint, text in steps:
        index.record(endpoint, chain(text))
        reference.record(endpoint, chain(text))
    for text in probes + [text for _, text in steps]:
        assert index.matches(chain(text)) == reference.matches(chain(text))
    for endpoint in reference.held:
        assert index.size(endpoint) == len(reference.blocks(endpoint))


@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(16, 40), steps=recordings)
def test_an_endpoint_holds_its_latest_prompt_and_at_most_capacity_blocks(capacity, steps):
    index = PrefixIndex(capacity)
    for endpoint, text in steps:
        index.record(endpoint, chain(text))
        assert index.matches(chain(text))[endpoint] == len(text)
        assert index.size(endpoint) <= capacity


def test_a_new_endpoint_does_not_inherit_a_removed_ones_prefixes():
    index = PrefixIndex(capacity=100)
    index.record("e1", (1, 2))
    index.remove_endpoint("e1")
    index.record("e2", (5,))
    assert index.matches((1, 2)) == {}
    assert index.matches((5,)) == {"e2": 1}


def test_blocks_after_the_first_are_not_walked_by_the_garbage_collector():
    index = PrefixIndex(capacity=4)
    young, old = int("1000000000001"), int("1000000000002")
    index.record("e1", [7, old])
    index.record("e1", [8, young, 9])
    assert gc.get_referrers(young) == []
    assert gc.get_referrers(old) == []


removals = st.lists(
    st.tuples(st.sampled_from("abcd"), st.one_of(st.none(), st.text("xy", min_size=1, max_size=8))),
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 24), steps=removals)
def test_matches_equal_the_plain_definition_as_endpoints_come_and_go(capacity, steps):
    index, reference = PrefixIndex(capacity), ReferenceGenerations(capacity)
    for endpoint, text in steps:
        if text is None:
            index.remove_endpoint(endpoint)
            reference.held.pop(endpoint, None)
            continue
        index.record(endpoint, chain(text))
        reference.record(endpoint, chain(text))
    for text in [text for _, text in steps if text is not None]:
        assert index.matches(chain(text)) == reference.matches(chain(text))
    assert index.endpoints() == set(reference.held)


def test_the_same_chain_recorded_where_it_was_held_is_answered_with_the_same_matches():
    index = PrefixIndex(capacity=100)
    index.record("e1", (1, 2, 3))
    first = index.matches((1, 2, 3))
    index.record("e1", (1, 2, 3))
    assert index.matches((1, 2, 3)) is first


def test_an_answer_handed_out_is_not_changed_by_a_later_record():
    index = PrefixIndex(capacity=100)
    index.record("e1", (1, 2, 3))
    first = index.matches((1, 2, 3))
    index.record("e2", (1, 2))
    assert first == {"e1": 3}
    assert index.matches((1, 2, 3)) == {"e1": 3, "e2": 2}


steps_and_probes = st.lists(
    st.tuples(
        st.sampled_from("abcd"),
        st.one_of(st.none(), st.text("xy", min_size=1, max_size=8)),
        st.text("xy", min_size=1, max_size=8),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 24), steps=steps_and_probes)
def test_matches_asked_between_records_and_removals_equal_the_plain_definition(capacity, steps):
    # Each step asks for the probe, records (or removes), asks again, then
    # asks for the step's own prompt: the answer kept for the latest chain
    # must follow every change to its holders.
    index, reference = PrefixIndex(capacity), ReferenceGenerations(capacity)
    for endpoint, text, probe in steps:
        index.matches(chain(probe))
        if text is None:
            index.remove_endpoint(endpoint)
            reference.held.pop(endpoint, None)
        else:
            index.record(endpoint, chain(text))
            reference.record(endpoint, chain(text))
        assert index.matches(chain(probe)) == reference.matches(chain(probe))
        if text is not None:
            assert index.matches(chain(text)) == reference.matches(chain(text))


own_recordings = st.lists(
    st.tuples(
        st.sampled_from("abcd"),
        st.text("xy", max_size=6),
        st.integers(0, 6),
        st.booleans(),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 24), steps=own_recordings)
def test_a_prompts_own_blocks_count_toward_its_generation_as_stored_ones_do(capacity, steps):
    # Every prompt is matched as it is placed, before it is recorded: its own
    # blocks are never asked for again, and the shared ones match as stored.
    index, reference = PrefixIndex(capacity), ReferenceGenerations(capacity)
    for number, (endpoint, text, own, twice) in enumerate(steps):
        # Own blocks: negative, unique to this prompt (as the simulator's).
        hashes = chain(text) + tuple(-1 - number * 10 - i for i in range(own))
        if not hashes:  # a scorer records none (and the reference would turn)
            continue
        assert index.matches(hashes) == reference.matches(hashes)
        for _ in range(2 if twice else 1):  # two profiles placing it on one endpoint
            index.record(endpoint, hashes, own_from=len(text) if own else None)
            reference.record(endpoint, hashes)
        assert index.size(endpoint) == len(reference.blocks(endpoint))
    for _, text, _, _ in steps:
        assert index.matches(chain(text)) == reference.matches(chain(text))
