"""The simulator hands the scheduler block hashes the prompt text would give."""

from epp.scheduling.prefix import block_hashes
from epp.sim.policies import CHARS_PER_TOKEN, PromptBlocks
from epp.sim.requests import SimRequest
from epp.sim.scenario_file import parse_scenario

BLOCK_CHARS = 64
MAX_BLOCKS = 256


def scenario():
    tenant = {
        "objective": "standard",
        "rate_rps": 1,
        "prompt_tokens": {"constant": 100},
        "output_tokens": {"constant": 10},
    }
    return parse_scenario(
        {
            "name": "blocks",
            "duration_s": 1,
            "pool": {"servers": 1},
            "objectives": [{"name": "standard", "priority": 0}],
            "tenants": [
                {**tenant, "name": "shared", "prefix": {"group": "sys", "tokens": 100}},
                {**tenant, "name": "plain"},
            ],
        }
    )


def request(number, tenant, prompt_tokens):
    return SimRequest(number, prompt_tokens, 10, tenant=tenant)


def hashes(blocks, number, tenant, prompt_tokens):
    return blocks.of(request(number, tenant, prompt_tokens))[0][2]


def test_a_prompt_has_as_many_blocks_as_its_text_would():
    blocks = PromptBlocks(scenario(), BLOCK_CHARS, MAX_BLOCKS)
    assert len(hashes(blocks, 1, 0, 150)) == 150 * CHARS_PER_TOKEN // BLOCK_CHARS
    assert len(hashes(blocks, 2, 1, 10)) == 0
    assert len(hashes(blocks, 3, 1, 100_000)) == MAX_BLOCKS


def test_blocks_wholly_inside_the_shared_prefix_hash_as_the_prefix_text():
    text = "<sys|" * (100 * CHARS_PER_TOKEN)
    shared = block_hashes(text[: 100 * CHARS_PER_TOKEN], "model", BLOCK_CHARS, MAX_BLOCKS)
    blocks = PromptBlocks(scenario(), BLOCK_CHARS, MAX_BLOCKS)
    assert len(shared) == 6
    assert hashes(blocks, 1, 0, 300)[:6] == shared
    assert hashes(blocks, 2, 0, 200)[:6] == shared


def test_blocks_after_the_shared_prefix_belong_to_one_request():
    blocks = PromptBlocks(scenario(), BLOCK_CHARS, MAX_BLOCKS)
    one, two = hashes(blocks, 1, 0, 300), hashes(blocks, 2, 0, 300)
    assert len(set(one)) == len(one)
    assert not set(one[6:]) & set(two)
    assert not set(hashes(blocks, 3, 1, 300)) & set(hashes(blocks, 4, 1, 300))


def test_unique_blocks_cannot_equal_a_text_hash():
    blocks = PromptBlocks(scenario(), BLOCK_CHARS, MAX_BLOCKS)
    assert max(hashes(blocks, 0, 1, 300)) < 0


def test_the_blocks_after_the_shared_prefix_are_declared_the_prompts_own():
    blocks = PromptBlocks(scenario(), BLOCK_CHARS, MAX_BLOCKS)
    assert blocks.of(request(1, 0, 300))[1] == 6
    assert blocks.of(request(2, 1, 300))[1] == 0
    assert blocks.of(request(3, 0, 100))[1] is None  # all inside the shared prefix
