"""The token producer's prefix store: a prompt's tokens found again by its
text, block by block."""

from epp.serve.token_store import PrefixTokenStore

BLOCK = 8


def tokenized(text: str, width: int = 2) -> tuple[list[int], list[int]]:
    """A stand-in tokenizer: a token per `width` characters (its ord sum)."""
    starts = range(0, len(text), width)
    tokens = [sum(map(ord, text[s : s + width])) for s in starts]
    ends = [min(s + width, len(text)) for s in starts]
    return tokens, ends


def test_a_prompt_that_begins_as_one_held_gets_the_tokens_of_its_held_blocks():
    store = PrefixTokenStore(BLOCK)
    seen = "abcdefgh" * 10
    store.add(seen, *tokenized(seen))
    found = store.find(seen + "tail and more")
    assert found is not None
    assert found.chars == 80
    assert (found.tokens, found.ends) == tokenized(seen)


def test_a_prompt_whose_first_block_is_not_held_is_not_found():
    store = PrefixTokenStore(BLOCK)
    seen = "abcdefgh" * 4
    store.add(seen, *tokenized(seen))
    assert store.find("x" + seen) is None
    assert store.find(seen[:7]) is None  # no whole block


def test_blocks_are_chained_so_a_change_early_in_the_text_matches_nothing_after_it():
    store = PrefixTokenStore(BLOCK)
    seen = "".join(chr(ord("a") + i) * BLOCK for i in range(6))
    store.add(seen, *tokenized(seen))
    changed = seen[:BLOCK] + "z" * BLOCK + seen[2 * BLOCK :]
    found = store.find(changed)
    assert found is not None and found.chars == BLOCK  # blocks 3..6 repeat but follow a miss


def test_a_token_that_straddles_a_blocks_end_belongs_to_the_next_block():
    store = PrefixTokenStore(BLOCK)
    seen = "abcdefghijklmnop"
    tokens, ends = tokenized(seen, width=3)  # ends 3, 6, 9 (straddles 8), 12, 15, 16
    store.add(seen, tokens, ends)
    found = store.find(seen[:BLOCK] + "XXXXXXXX")
    assert found is not None
    assert (found.tokens, found.ends) == (tokens[:2], [3, 6])


def test_the_store_holds_at_most_its_capacity_the_least_recently_used_leaving_counted():
    store = PrefixTokenStore(BLOCK, capacity=4)
    first, second = "a" * 2 * BLOCK, "b" * 2 * BLOCK
    store.add(first, *tokenized(first))
    store.add(second, *tokenized(second))
    assert store.find(first) is not None  # first is now the most recent
    third = "c" * 2 * BLOCK
    store.add(third, *tokenized(third))
    assert len(store) == 4
    assert store.evictions == 2
    assert store.find(second) is None
    assert store.find(first) is not None and store.find(third) is not None
