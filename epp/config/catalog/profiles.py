"""Profile-handler and decider plugin types (and the deprecated headers
handlers), with the reference's parameter names, types and defaults
(`pkg/epp/framework/plugins/scheduling/profile/`, `.../requestcontrol/`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.config.catalog import ALPHA, T, made
from epp.config.plugin import (
    Kind,
    Param,
    ParameterError,
    PluginType,
    configured,
)
from epp.scheduling import profiles
from epp.scheduling.spec import PluginSpec


def _disagg(parameters: Mapping[str, Any]) -> PluginSpec:
    if parameters["stageOrder"] not in ("", "decode-first"):
        raise ParameterError("stageOrder", "only decode-first is supported by epp")
    names = parameters["profiles"]
    deciders = parameters["deciders"]
    return made(
        profiles.disagg_profile_handler,
        decode=names["decode"],
        prefill=names["prefill"],
        encode=names["encode"],
        prefill_decider=deciders["prefill"] or None,
        encode_decider=deciders["encode"] or None,
    )


def _header_profile(parameters: Mapping[str, Any]) -> PluginSpec:
    return made(
        profiles.header_profile_handler,
        header=parameters["headerName"].strip().lower() or "epp-profile",
        default=parameters["defaultProfile"].strip() or "decode",
    )


def _pd_profile_handler(parameters: Mapping[str, Any]) -> PluginSpec:
    """The deprecated P/D handler as the disagg handler it became: decode,
    then prefill when `deciderPluginName` says so; `primaryPort` sends the
    decode leg to the pod's primary port (data parallel)."""
    if not parameters["deciderPluginName"]:
        raise ParameterError("deciderPluginName", "decider plugin name is not defined")
    port = parameters["primaryPort"]
    if port and not 1 <= port <= 65535:
        raise ParameterError("primaryPort", f"must be between 1 and 65535, got {port}")
    return made(
        profiles.disagg_profile_handler,
        decode=parameters["decodeProfile"],
        prefill=parameters["prefillProfile"],
        encode="",
        prefill_decider=parameters["deciderPluginName"],
        encode_decider=None,
        primary_port=port,
    )


ENTRIES: tuple[PluginType, ...] = (
    PluginType(
        "single-profile-handler",
        Kind.PROFILE_HANDLER,
        "runs the one scheduling profile",
        factory=lambda p: made(profiles.single_profile_handler),
    ),
    PluginType(
        "disagg-profile-handler",
        Kind.PROFILE_HANDLER,
        "decode profile first, then prefill and encode when their deciders say so",
        (
            Param(
                "profiles",
                T.OBJECT,
                fields=(
                    Param("decode", T.STRING, "decode"),
                    Param("prefill", T.STRING, "prefill"),
                    Param("encode", T.STRING, "encode"),
                ),
            ),
            Param(
                "deciders",
                T.OBJECT,
                fields=(Param("prefill", T.STRING, ""), Param("encode", T.STRING, "")),
            ),
            Param("stageOrder", T.STRING, ""),
        ),
        factory=_disagg,
    ),
    PluginType(
        "pd-profile-handler",
        Kind.PROFILE_HANDLER,
        "deprecated P/D handler: decode, then prefill when its decider says so",
        (
            Param("decodeProfile", T.STRING, "decode"),
            Param("prefillProfile", T.STRING, "prefill"),
            Param("prefixPluginType", T.STRING, "", "deprecated and ignored"),
            Param("prefixPluginName", T.STRING, "", "deprecated and ignored"),
            Param("deciderPluginName", T.STRING, "prefix-based-pd-decider", "the decider plugin"),
            Param("primaryPort", T.INT, 0, "data-parallel pods' primary port; 0 = none"),
            Param("prefixMatchInfoProducerName", T.STRING, ""),
        ),
        factory=_pd_profile_handler,
        deprecated_for="disagg-profile-handler",
    ),
    PluginType(
        "data-parallel-profile-handler",
        Kind.PROFILE_HANDLER,
        "one profile; the chosen rank's port becomes the pod's primary port",
        (Param("primaryPort", T.INT, 8000, "the pod's primary service port", 1, 65535),),
        factory=lambda p: made(
            profiles.data_parallel_profile_handler, primary_port=p["primaryPort"]
        ),
    ),
    PluginType(
        "header-profile-handler",
        Kind.PROFILE_HANDLER,
        "runs the profile a request header names",
        (
            Param("headerName", T.STRING, "EPP-Profile", "header naming the profile"),
            Param("defaultProfile", T.STRING, "decode", "profile run without the header"),
        ),
        factory=_header_profile,
        stability=ALPHA,
    ),
    PluginType(
        "always-disagg-pd-decider",
        Kind.DECIDER,
        "always runs the prefill stage",
        factory=lambda p: made(profiles.always_disagg_pd_decider),
    ),
    PluginType(
        "prefix-based-pd-decider",
        Kind.DECIDER,
        "runs prefill when the uncached prompt tokens reach nonCachedTokens",
        (
            Param(
                "nonCachedTokens", T.INT, 0, "uncached tokens that trigger prefill; 0 = never", 0
            ),
            Param("promptTokens", T.INT, 0, "shortest prompt that may disaggregate", 0),
        ),
        factory=lambda p: made(
            profiles.prefix_based_pd_decider,
            non_cached_tokens=p["nonCachedTokens"],
            prompt_tokens=p["promptTokens"],
        ),
    ),
    PluginType(
        "always-disagg-multimodal-decider",
        Kind.DECIDER,
        "runs the encode stage for every request with multimodal content",
        factory=lambda p: made(profiles.always_disagg_multimodal_decider),
    ),
    PluginType(
        "disagg-headers-handler",
        Kind.REQUEST_CONTROL,
        "deprecated: the disagg profile handler writes x-prefiller-host-port and "
        "x-encoder-hosts-ports itself",
        (Param("prefillProfile", T.STRING, "prefill"), Param("encodeProfile", T.STRING, "encode")),
        factory=configured,
        deprecated_for="disagg-profile-handler",
    ),
    PluginType(
        "prefill-header-handler",
        Kind.REQUEST_CONTROL,
        "deprecated name of disagg-headers-handler",
        (Param("prefillProfile", T.STRING, "prefill"), Param("encodeProfile", T.STRING, "encode")),
        factory=configured,
        deprecated_for="disagg-profile-handler",
    ),
)
