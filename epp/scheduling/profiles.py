"""Profile handlers and disaggregation deciders: which scheduling profiles a
request runs, and what the model servers are told about the result.

- `SingleProfileHandler`: the one profile; its endpoint is the destination.
- `DisaggProfileHandler`: the decode profile first (its endpoint is the
  destination and takes the in-flight credit); then, when the encode
  decider says so, the encode profile, and when the prefill decider says so,
  the prefill profile. Their endpoints reach the decode pod's sidecar in
  `x-encoder-hosts-ports` and `x-prefiller-host-port`, as in the reference
  (`docs/disaggregation.md`). A stage whose profile finds no endpoint is
  skipped: the decode pod then does that stage itself.
  With a `primary_port` (the deprecated `pd-profile-handler`'s), the decode
  endpoint is a data-parallel rank, as below.
- `DataParallelProfileHandler`: the one profile picks a rank (ip:port); the
  request goes to the pod's primary port, the rank in
  `x-data-parallel-host-port`.
- `HeaderProfileHandler`: runs the one profile a request header names (the
  configured default without the header; the only profile when there is
  one). A name that is no profile ends the request with
  `rejected-no-endpoints`, as the reference answers no profile run.

Deciders read the decode endpoint: `prefix-based-pd-decider` disaggregates
when the prompt's tokens not cached there reach `nonCachedTokens`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from epp.api.address import format_address
from epp.flowcontrol.outcome import Outcome
from epp.scheduling.cache_scorers import CHARS_PER_TOKEN, PrefixCacheScorer
from epp.scheduling.endpoint import Endpoint
from epp.scheduling.request import InferenceRequest
from epp.scheduling.spec import BuildContext, PluginSpec

PREFILLER_HEADER = "x-prefiller-host-port"
ENCODERS_HEADER = "x-encoder-hosts-ports"
DATA_PARALLEL_HEADER = "x-data-parallel-host-port"


class Runner(Protocol):
    """One scheduling profile, run over the pool's current candidates."""

    def choose(self, request: InferenceRequest, take_credit: bool) -> Endpoint | Outcome | None:
        """The profile's endpoint; None when the endpoints it may choose
        have no credit left (when it must `take_credit`: the destination);
        an Outcome when none passes its filters."""
        ...


class Decider(Protocol):
    def disaggregate(self, request: InferenceRequest, decode: Endpoint) -> bool: ...


class ProfileHandler(Protocol):
    def choose(
        self, request: InferenceRequest, runners: Mapping[str, Runner]
    ) -> Endpoint | Outcome | None: ...


class SingleProfileHandler:
    __slots__ = ()

    def choose(
        self, request: InferenceRequest, runners: Mapping[str, Runner]
    ) -> Endpoint | Outcome | None:
        runner = next(iter(runners.values()))
        return runner.choose(request, True)


@dataclass(slots=True, frozen=True)
class DataParallelProfileHandler:
    primary_port: int

    def choose(
        self, request: InferenceRequest, runners: Mapping[str, Runner]
    ) -> Endpoint | Outcome | None:
        chosen = next(iter(runners.values())).choose(request, True)
        if isinstance(chosen, Endpoint):
            to_primary_port(request, chosen, self.primary_port)
        return chosen


def to_primary_port(request: InferenceRequest, rank: Endpoint, primary_port: int) -> None:
    """Send `request` to the primary port of `rank`'s pod, the rank in
    `x-data-parallel-host-port`."""
    routing = request.routing if request.routing is not None else {}
    routing[DATA_PARALLEL_HEADER] = rank.address
    request.routing = routing
    request.destination = format_address(rank.ip, primary_port)


@dataclass(slots=True, frozen=True)
class HeaderProfileHandler:
    header: str
    default: str

    def choose(
        self, request: InferenceRequest, runners: Mapping[str, Runner]
    ) -> Endpoint | Outcome | None:
        if len(runners) == 1:
            runner: Runner | None = next(iter(runners.values()))
        else:
            runner = runners.get(request.headers.get(self.header, "").strip() or self.default)
        if runner is None:
            return Outcome.REJECTED_NO_ENDPOINTS
        return runner.choose(request, True)


@dataclass(slots=True, frozen=True)
class DisaggProfileHandler:
    decode: str
    prefill: str
    encode: str
    prefill_decider: Decider | None
    encode_decider: Decider | None
    primary_port: int = 0

    def choose(
        self, request: InferenceRequest, runners: Mapping[str, Runner]
    ) -> Endpoint | Outcome | None:
        runner = runners.get(self.decode)
        if runner is None:
            return Outcome.REJECTED_NO_ENDPOINTS
        decode = runner.choose(request, True)
        if not isinstance(decode, Endpoint):
            return decode
        routing: dict[str, str] = {}
        encode_runner = _stage(runners.get(self.encode), self.encode_decider, request, decode)
        if encode_runner is not None:
            encoder = encode_runner.choose(request, False)
            if isinstance(encoder, Endpoint):
                routing[ENCODERS_HEADER] = encoder.address
        prefill_runner = _stage(runners.get(self.prefill), self.prefill_decider, request, decode)
        if prefill_runner is not None:
            # With prefill credits (`epp.scheduling.stages`) the prefill
            # profile answers None when no prefill endpoint has one: wait.
            prefiller = prefill_runner.choose(request, True)
            if prefiller is None:
                return None
            if isinstance(prefiller, Endpoint):
                routing[PREFILLER_HEADER] = prefiller.address
        request.routing = routing or None
        if self.primary_port:
            to_primary_port(request, decode, self.primary_port)
        return decode


def _stage(
    runner: Runner | None, decider: Decider | None, request: InferenceRequest, decode: Endpoint
) -> Runner | None:
    """The runner of a stage `request` goes through before `decode`: only a
    stage with a profile and a decider, and only when the decider says so."""
    if runner is not None and decider is not None and decider.disaggregate(request, decode):
        return runner
    return None


class AlwaysDisaggregate:
    __slots__ = ()

    def disaggregate(self, request: InferenceRequest, decode: Endpoint) -> bool:
        return True


class MultimodalDecider:
    __slots__ = ()

    def disaggregate(self, request: InferenceRequest, decode: Endpoint) -> bool:
        return request.multimodal


@dataclass(slots=True, frozen=True)
class PrefixBasedDecider:
    """Disaggregates when the prompt has at least `prompt_tokens` tokens and
    at least `non_cached_tokens` of them are not cached on the decode
    endpoint (0 disables it)."""

    prefix: PrefixCacheScorer | None
    non_cached_tokens: int
    prompt_tokens: int

    def disaggregate(self, request: InferenceRequest, decode: Endpoint) -> bool:
        threshold = self.non_cached_tokens
        tokens = request.input_tokens
        if threshold == 0 or tokens < threshold or tokens < self.prompt_tokens:
            return False
        prefix = self.prefix
        cached = 0
        if prefix is not None:
            blocks = prefix.matched_blocks(request, decode.address)
            cached = blocks * prefix.block_chars_of(request) // CHARS_PER_TOKEN
        return tokens - cached >= threshold


# -- factories (the registry's profile handler and decider types build through these) --


def single_profile_handler(context: BuildContext) -> SingleProfileHandler:
    return SingleProfileHandler()


def data_parallel_profile_handler(
    context: BuildContext, primary_port: int = 8000
) -> DataParallelProfileHandler:
    return DataParallelProfileHandler(primary_port)


def disagg_profile_handler(
    context: BuildContext,
    decode: str = "decode",
    prefill: str = "prefill",
    encode: str = "encode",
    prefill_decider: PluginSpec | None = None,
    encode_decider: PluginSpec | None = None,
    primary_port: int = 0,
) -> DisaggProfileHandler:
    return DisaggProfileHandler(
        decode,
        prefill,
        encode,
        context.build(prefill_decider) if prefill_decider is not None else None,
        context.build(encode_decider) if encode_decider is not None else None,
        primary_port,
    )


def header_profile_handler(
    context: BuildContext, header: str = "epp-profile", default: str = "decode"
) -> HeaderProfileHandler:
    return HeaderProfileHandler(header, default)


def always_disagg_pd_decider(context: BuildContext) -> AlwaysDisaggregate:
    return AlwaysDisaggregate()


def always_disagg_multimodal_decider(context: BuildContext) -> MultimodalDecider:
    return MultimodalDecider()


def prefix_based_pd_decider(
    context: BuildContext, non_cached_tokens: int = 0, prompt_tokens: int = 0
) -> PrefixBasedDecider:
    return PrefixBasedDecider(context.first(PrefixCacheScorer), non_cached_tokens, prompt_tokens)
