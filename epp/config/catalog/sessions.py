"""The session-affinity scorer's and filter's shared parameters and
factory, as the reference defines them for both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.config.catalog import T, made
from epp.config.plugin import Param, ParameterError
from epp.scheduling import sessions
from epp.scheduling.spec import PluginSpec

_SESSION_TIMES = {"evictionTtlSeconds": 300.0, "evictionSweepSeconds": 10.0}
"""The reference's defaults, which a 0 also means."""
_SESSION_SOURCES = ({"header": "x-session-id", "attribute": "", "producer": ""},)

SESSION_PARAMETERS = (
    Param(
        "strategy",
        T.STRING,
        "encoded_endpoint_header",
        "how the session is carried",
        choices=("encoded_endpoint_header", "session_id"),
    ),
    Param("profileName", T.STRING, "", "the profile whose result this instance pins"),
    Param(
        "encodedEndpointHeaderConfig",
        T.OBJECT,
        fields=(Param("header", T.STRING, "x-session-token", "header with the pod token"),),
    ),
    Param(
        "sessionIdConfig",
        T.OBJECT,
        fields=(
            Param(
                "sources",
                T.LIST,
                _SESSION_SOURCES,
                "where the session id is read, first non-empty wins",
                fields=(
                    Param("header", T.STRING, ""),
                    Param("attribute", T.STRING, ""),
                    Param("producer", T.STRING, ""),
                ),
            ),
            Param(
                "evictionTtlSeconds",
                T.FLOAT,
                _SESSION_TIMES["evictionTtlSeconds"],
                "unused bindings live this long",
            ),
            Param(
                "evictionSweepSeconds",
                T.FLOAT,
                _SESSION_TIMES["evictionSweepSeconds"],
                "checked only: epp expires each binding exactly at its TTL",
            ),
            Param(
                "maxSessions",
                T.INT,
                sessions.DEFAULT_MAX_SESSIONS,
                "epp's own: bindings kept, least recently used dropped past it",
                1,
            ),
        ),
    ),
)


def session_factory(kind: type) -> Any:
    """The factory of the session affinity scorer or filter (`kind`): the
    reference's defaults and checks, for the strategy chosen only."""

    def factory(parameters: Mapping[str, Any]) -> PluginSpec:
        strategy = parameters["strategy"]
        header = sessions.normal_header(parameters["encodedEndpointHeaderConfig"]["header"])
        if strategy != "session_id":
            return made(
                sessions.session_affinity,
                kind=kind,
                strategy=strategy,
                header=header,
                profile=parameters["profileName"],
            )
        config = parameters["sessionIdConfig"]
        found = []
        for index, source in enumerate(config["sources"] or _SESSION_SOURCES):
            if bool(source["header"]) == bool(source["attribute"]):
                raise ParameterError(
                    f"sessionIdConfig.sources[{index}]",
                    "exactly one of header or attribute must be set",
                )
            found.append(
                sessions.SessionSource(
                    sessions.normal_header(source["header"]) if source["header"] else "",
                    source["attribute"],
                    source["producer"],
                )
            )
        for field, default in _SESSION_TIMES.items():
            if config[field] < 0:
                raise ParameterError(
                    f"sessionIdConfig.{field}", f"must be > 0, got {config[field]}"
                )
            if config[field] == 0:
                config = {**config, field: default}
        return made(
            sessions.session_affinity,
            kind=kind,
            strategy=strategy,
            profile=parameters["profileName"],
            sources=tuple(found),
            ttl=float(config["evictionTtlSeconds"]),
            max_sessions=config["maxSessions"],
        )

    return factory
