"""The token producer's prefix store: a prompt's tokens found again by its
text, block by block, when they cover enough of it."""

from epp.serve.token_store import PrefixTokenStore

BLOCK = 8


def tokenized(text: str, width: int = 2) -> tuple[list[int], list[int]]:
    """A stand-in tokenizer: a token per `width` characters (its ord sum)."""
    starts = range(0, len(text), width)
    tokens = [sum(map(ord, text[s : s + width])) for s in starts]
    ends = [min(s + width, len(text)) for s in starts]
    return tokens, ends


def test_a_prompt_that_mostly_repeats_one_held_gets_the_tokens_of_its_held_blocks():
    store = PrefixTokenStore(BLOCK, min_overlap=0.8)
    seen = "abcdefgh" * 10
    store.add(seen, *tokenized(seen))
    found = store.find(seen + "tail")  # 80 of 84 characters held
    assert found is not None
    assert found.chars == 80
    assert found.tokens == tokenized(seen)[0]


def test_a_prompt_covered_less_than_the_overlap_is_not_found():
    store = PrefixTokenStore(BLOCK, min_overlap=0.8)
    seen = "abcdefgh" * 4
    store.add(seen, *tokenized(seen))
    assert store.find(seen + "x" * 9) is None  # 32 of 41
    assert store.find(seen + "x" * 8) is not None  # 32 of 40


def test_blocks_are_chained_so_a_change_early_in_the_text_matches_nothing_after_it():
    store = PrefixTokenStore(BLOCK, min_overlap=0.0)
    seen = "".join(chr(ord("a") + i) * BLOCK for i in range(6))
    store.add(seen, *tokenized(seen))
    changed = seen[:BLOCK] + "z" * BLOCK + seen[2 * BLOCK :]
    found = store.find(changed)
    assert found is not None and found.chars == BLOCK  # blocks 3..6 repeat but follow a miss


def test_a_token_that_straddles_a_blocks_end_belongs_to_the_next_block():
    store = PrefixTokenStore(BLOCK, min_overlap=0.0)
    seen = "abcdefghijklmnop"
    tokens, ends = tokenized(seen, width=3)  # ends 3, 6, 9 (straddles 8), 12, 15, 16
    store.add(seen, tokens, ends)
    found = store.find(seen[:BLOCK] + "XXXXXXXX")
    assert found is not None
    assert found.tokens == tokens[:2]  # the tokens ending within the first block


def test_the_store_holds_at_most_its_capacity_the_least_recently_used_leaving():
    store = PrefixTokenStore(BLOCK, capacity=4, min_overlap=1.0)
    first, second = "a" * 2 * BLOCK, "b" * 2 * BLOCK
    store.add(first, *tokenized(first))
    store.add(second, *tokenized(second))
    assert store.find(first) is not None  # first is now the most recent
    third = "c" * 2 * BLOCK
    store.add(third, *tokenized(third))
    assert len(store) == 4
    assert store.find(second) is None
    assert store.find(first) is not None and store.find(third) is not None
