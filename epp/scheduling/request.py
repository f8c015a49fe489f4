"""What the scheduler knows about a request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    """What a prefix-cache producer's index predicted for the endpoint a
    request was placed on: `matched` of the prompt's `blocks` blocks of
    `block_tokens` tokens held there, of a prompt of `prompt_tokens` tokens
    (the prefix metrics, `llm_d_epp_prefix_*`, read it)."""

    producer: str
    producer_type: str
    matched: int
    blocks: int
    block_tokens: int
    prompt_tokens: int

    @property
    def cached_tokens(self) -> int:
        return min(self.matched * self.block_tokens, self.prompt_tokens)


UNMEASURED = PrefixMatch("", "", 0, 0, 0, 0)
"""The `prefix_match` of a request whose caller reports no prefix metrics
(the simulator): set beforehand, it is kept, so the scorers build none."""


@dataclass(slots=True)
class InferenceRequest:
    """The parsed inference request, as the scheduler needs it.

    The live shell builds it from the HTTP request (`epp.extproc`), the
    simulator from its workload; it travels in `FlowRequest.payload`.

    `model` is what the client asked for, `target_model` what the model server
    will be asked for (they differ when the model name is rewritten; a LoRA
    adapter name is a target model). `prompt` is the text used for prefix-cache
    affinity. `subset` holds the endpoint IPs of Envoy's subset hint, or None
    when Envoy sent no hint (every endpoint is a candidate).

    `input_tokens` is the prompt's estimated token count and `multimodal`
    whether it carries images, audio or video (for the disaggregation
    deciders). The scheduler writes what the model server must be told
    besides the endpoint into `routing` (header name to value, e.g.
    `x-prefiller-host-port`), and sets `destination` when the request must
    go to another address than the endpoint it was placed on (data-parallel
    ranks behind one primary port). `fallbacks` are the addresses the
    destination profile's picker ranked next (`maxNumOfEndpoints` > 1), which
    follow the destination in `x-gateway-destination-endpoint` for the
    gateway's retries.

    `headers` are the request's HTTP headers (lower-case names), which
    affinity scorers and the header profile handler read; `attributes` what
    data producers published about it (`session-id-producer`), by the
    reference's key `<data type>/<producer name>`. Plugins write the headers
    the client's response must carry into `response_headers` (the session
    token) once the request is placed.

    `prefix_hashes` is the scheduler's cache of the prompt's block hashes, as
    (block_chars, max_blocks, hashes), so a request placed twice is hashed once.
    A caller that models prompts at block level (the simulator) fills it
    instead of `prompt`; the hashes must be chained as `prefix` describes.
    Such a caller may also know that the blocks from `prefix_own_from` on
    are the prompt's own (no other prompt has them: the index then counts
    them without storing them); None when any block may be another's.

    `token_ids` are the prompt's tokens as the model server will see them,
    when a token producer tokenized it (None otherwise: the precise prefix
    cache then matches nothing); `cache_salt` is the body's `cache_salt`.
    `kv_block_keys` caches their vLLM block keys (`kvblocks`).
    `prefix_match` is what the first prefix-cache scorer's index predicted
    for the endpoint it was placed on (`UNMEASURED`: not wanted). `body` is the
    request body as sent upstream and `chat` whether it is a chat (messages)
    request, for the token producer.
    """

    model: str
    target_model: str
    prompt: str = ""
    stream: bool = False
    max_tokens: int | None = None
    subset: frozenset[str] | None = None
    prefix_hashes: tuple[int, int, Sequence[int]] | None = field(
        default=None, repr=False, compare=False
    )
    input_tokens: int = 0
    multimodal: bool = False
    routing: dict[str, str] | None = None
    destination: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    attributes: dict[str, str] | None = None
    response_headers: dict[str, str] | None = None
    fallbacks: tuple[str, ...] = ()
    token_ids: Sequence[int] | None = field(default=None, repr=False, compare=False)
    cache_salt: str | None = None
    body: bytes = field(default=b"", repr=False, compare=False)
    chat: bool = False
    kv_block_keys: tuple[int, ...] | None = field(default=None, repr=False, compare=False)
    prefix_match: PrefixMatch | None = None
    prefix_own_from: int | None = field(default=None, repr=False, compare=False)
