"""Reading a scenario file (`epp.sim.scenario` says what a scenario is).

Every key is checked; an unknown key or a bad value is an error naming its
path (`tenants[1].arrival`), and all errors are reported together. Relative
paths (the EPP config, trace files) are tried against the current directory
first, then against the scenario file's directory.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from epp.config.fieldreader import ANY, NON_NEGATIVE, POSITIVE, REQUIRED, FieldReader
from epp.config.loader import ConfigError, EppConfig, load_config
from epp.flowcontrol.config import Fairness
from epp.sim.scenario import (
    ARRIVALS,
    BASELINES,
    DISTRIBUTIONS,
    REQUEST_PATH,
    RESPONSE_PATH,
    ROLES,
    Arrival,
    Conversation,
    KvTransfer,
    Lengths,
    Objective,
    PathDelay,
    Pool,
    Scenario,
    ServerEvent,
    ServerGroup,
    Tenant,
    Trace,
    Variant,
)
from epp.sim.server_model import ServerParams


class ScenarioError(ConfigError):
    """A scenario with errors; `errors` holds one "path: message" each."""


PARAM_KEYS = {f.name for f in fields(ServerParams)}
POSITIVE_PARAMS = {"max_num_seqs", "kv_blocks", "block_size", "decode_ms_per_token"}
"""Server keys that must be above 0 (the others must not be negative)."""
GROUP_KEYS = {"servers", *PARAM_KEYS}
POOL_KEYS = {
    "groups",
    "roles",
    "scrape_interval_ms",
    "scrape_lag_ms",
    "kv_event_lag_ms",
    "path_ms",
    "token_producer_ms",
    "token_store_ms",
    *GROUP_KEYS,
}
TENANT_KEYS = {
    "name",
    "objective",
    "fairness_id",
    "rate_rps",
    "arrival",
    "prompt_tokens",
    "output_tokens",
    "prefix",
    "conversation",
    "stream",
    "lora",
    "ttl_s",
}
TOP_KEYS = {
    "name",
    "seed",
    "duration_s",
    "pool",
    "objectives",
    "tenants",
    "events",
    "kv_transfer",
    "epp",
    "baselines",
    "drain_s",
    "isolation",
    "model",
    "samples",
}


class _Reader(FieldReader):
    """Collects errors by path while reading a parsed YAML document; relative
    file names are looked up beside the scenario (`base`)."""

    def __init__(self, base: Path | None) -> None:
        super().__init__()
        self.base = base

    def path(self, value: Any, path: str) -> Path | None:
        name = self.string(value, path)
        if not name:
            return None
        candidate = Path(name)
        if not candidate.is_absolute() and not candidate.exists() and self.base is not None:
            candidate = self.base / name
        if not candidate.exists():
            self.fail(path, f"file {name!r} not found")
            return None
        return candidate


def _params(
    reader: _Reader, raw: Mapping[str, Any], path: str, defaults: ServerParams
) -> ServerParams:
    """Server parameters at `path`; keys not given keep `defaults`."""
    params: dict[str, Any] = {}
    for spec in fields(ServerParams):
        default = getattr(defaults, spec.name)
        where = f"{path}.{spec.name}"
        bounds = POSITIVE if spec.name in POSITIVE_PARAMS else NON_NEGATIVE
        read = reader.integer if isinstance(default, int) else reader.number
        params[spec.name] = read(raw.get(spec.name), where, default, bounds)
    return ServerParams(**params)


def _pool(reader: _Reader, value: Any) -> Pool:
    """A uniform pool (`servers` and server keys), or `groups` of servers,
    each with its own keys over the pool's (`pool.decode_ms_per_token`
    applies to every group that does not set its own)."""
    raw = reader.mapping(value, "pool", POOL_KEYS)
    if value is None:
        reader.fail("pool", "is required")
    shared = _params(reader, raw, "pool", ServerParams())
    groups = []
    if "groups" in raw:
        if "servers" in raw:
            reader.fail("pool.servers", "give servers per group when the pool has groups")
        items = reader.sequence(raw["groups"], "pool.groups")
        if not items:
            reader.fail("pool.groups", "needs at least one group")
        for index, item in enumerate(items):
            path = f"pool.groups[{index}]"
            entry = reader.mapping(item, path, GROUP_KEYS)
            servers = reader.integer(entry.get("servers"), f"{path}.servers", bounds=POSITIVE)
            groups.append(ServerGroup(servers, _params(reader, entry, path, shared)))
    else:
        servers = reader.integer(raw.get("servers"), "pool.servers", bounds=POSITIVE)
        groups.append(ServerGroup(servers, shared))
    total = sum(group.servers for group in groups)
    lag = raw.get("kv_event_lag_ms")
    if lag is not None and len({group.params.block_size for group in groups}) > 1:
        reader.fail("pool.kv_event_lag_ms", "KV-cache events need one block_size in the pool")
    return Pool(
        groups=tuple(groups),
        roles=_roles(reader, raw.get("roles"), total),
        scrape_interval_s=reader.number(
            raw.get("scrape_interval_ms"), "pool.scrape_interval_ms", 50.0, bounds=POSITIVE
        )
        / 1000.0,
        scrape_lag_s=reader.number(raw.get("scrape_lag_ms"), "pool.scrape_lag_ms", 10.0) / 1000.0,
        kv_event_lag_s=None
        if lag is None
        else reader.number(lag, "pool.kv_event_lag_ms", 0.0) / 1000.0,
        **_path(reader, raw.get("path_ms")),
        token_producer=_delay(reader, raw.get("token_producer_ms"), "pool.token_producer_ms"),
        token_store=_delay(reader, raw.get("token_store_ms"), "pool.token_store_ms"),
    )


def _delay(reader: _Reader, value: Any, where: str) -> PathDelay:
    """`{median, p90}` in milliseconds (absent: no delay)."""
    if value is None:
        return PathDelay()
    entry = reader.mapping(value, where, {"median", "p90"})
    median = reader.number(entry.get("median"), f"{where}.median")
    p90 = reader.number(entry.get("p90"), f"{where}.p90", median)
    if p90 < median:
        reader.fail(f"{where}.p90", f"must be at least the median ({median:g}), got {p90:g}")
        p90 = median
    return PathDelay(median, p90)


def _path(reader: _Reader, value: Any) -> dict[str, PathDelay]:
    """`pool.path_ms`: `{request: {median, p90}, response: {median, p90}}`,
    each leg left out keeping its default; `{median: 0}` turns a leg off,
    and `path_ms: 0` both (the servers then talk to the EPP directly)."""
    if value == 0 and not isinstance(value, bool):
        return {"request_path": PathDelay(), "response_path": PathDelay()}
    raw = reader.mapping(value, "pool.path_ms", {"request", "response"})
    legs = {}
    for leg, default in (("request", REQUEST_PATH), ("response", RESPONSE_PATH)):
        if leg not in raw:
            continue
        given = raw[leg]
        if isinstance(given, dict):
            given = {"median": default.median_ms, **given}
        legs[f"{leg}_path"] = _delay(reader, given, f"pool.path_ms.{leg}")
    return legs


def _roles(reader: _Reader, value: Any, servers: int) -> tuple[str, ...]:
    """`{role: count, ...}`: the servers in order get the roles in order;
    the rest get none."""
    if value is None:
        return ()
    raw = reader.mapping(value, "pool.roles", set(ROLES))
    roles: list[str] = []
    for role, count in raw.items():
        roles.extend([role] * reader.integer(count, f"pool.roles.{role}", bounds=POSITIVE))
    if len(roles) > servers:
        reader.fail("pool.roles", f"gives {len(roles)} roles to {servers} servers")
    return tuple(roles[:servers]) + ("",) * (servers - len(roles))


def _kv_transfer(reader: _Reader, value: Any) -> KvTransfer:
    raw = reader.mapping(value, "kv_transfer", {"fixed_ms", "bytes_per_token", "gbytes_per_s"})
    default = KvTransfer()
    return KvTransfer(
        reader.number(raw.get("fixed_ms"), "kv_transfer.fixed_ms", default.fixed_ms),
        reader.number(
            raw.get("bytes_per_token"), "kv_transfer.bytes_per_token", default.bytes_per_token
        ),
        reader.number(
            raw.get("gbytes_per_s"),
            "kv_transfer.gbytes_per_s",
            default.gbytes_per_s,
            bounds=POSITIVE,
        ),
    )


def _one_key(reader: _Reader, value: Any, path: str, allowed: tuple[str, ...]) -> tuple[str, Any]:
    """A `name` or a one-entry mapping `{name: parameters}`."""
    if isinstance(value, str):
        if value not in allowed:
            reader.fail(path, f"unknown kind {value!r}; known: {', '.join(allowed)}")
        return value, None
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, parameters),) = value.items()
        if kind not in allowed:
            reader.fail(f"{path}.{kind}", f"unknown kind; known: {', '.join(allowed)}")
        return kind, parameters
    reader.fail(path, f"must be one of {', '.join(allowed)} or a mapping with one of them")
    return allowed[0], None


def _lengths(reader: _Reader, value: Any, path: str, has_trace: bool) -> Lengths:
    if isinstance(value, int) and not isinstance(value, bool):
        return Lengths("constant", reader.integer(value, path, bounds=POSITIVE))
    kind, parameters = _one_key(reader, value, path, DISTRIBUTIONS)
    where = f"{path}.{kind}"
    if kind == "constant":
        return Lengths(kind, reader.integer(parameters, where, bounds=POSITIVE))
    if kind == "uniform":
        if (
            not isinstance(parameters, list)
            or len(parameters) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in parameters)
            or not 0 < parameters[0] <= parameters[1]
        ):
            reader.fail(where, f"must be [low, high] with 0 < low <= high, got {parameters!r}")
            return Lengths("constant", 1)
        return Lengths(kind, parameters[0], parameters[1])
    if kind == "lognormal":
        raw = reader.mapping(parameters, where, {"mean", "sigma"})
        return Lengths(
            kind,
            reader.number(raw.get("mean"), f"{where}.mean", bounds=POSITIVE),
            reader.number(raw.get("sigma"), f"{where}.sigma"),
        )
    if not has_trace:
        reader.fail(path, "trace lengths need `arrival: {trace: FILE}`")
    return Lengths("trace")


def _trace(reader: _Reader, value: Any, path: str) -> Trace | None:
    """A CSV file with a header: `time_s` and optional `prompt_tokens`, `output_tokens`."""
    file = reader.path(value, path)
    if file is None:
        return None
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    try:
        with file.open(newline="", encoding="utf-8") as stream:
            for line, row in enumerate(csv.DictReader(stream), start=2):
                try:
                    times.append(float(row["time_s"]))
                    prompts.append(int(row.get("prompt_tokens") or 1))
                    outputs.append(int(row.get("output_tokens") or 1))
                except (KeyError, TypeError, ValueError) as error:
                    reader.fail(path, f"{file}:{line}: bad row ({error})")
                    return None
    except (OSError, UnicodeDecodeError) as error:
        reader.fail(path, f"cannot read {file}: {error}")
        return None
    if any(later < earlier for earlier, later in itertools.pairwise(times)):
        reader.fail(path, f"{file}: times must not decrease")
    return Trace(tuple(times), tuple(prompts), tuple(outputs))


def _arrival(reader: _Reader, value: Any, path: str) -> tuple[Arrival, Trace | None]:
    kind, parameters = _one_key(
        reader, "poisson" if value is None else value, path, (*ARRIVALS, "bursts", "ramp", "trace")
    )
    where = f"{path}.{kind}"
    if kind == "bursts":
        raw = reader.mapping(parameters, where, {"on_s", "off_s"})
        return Arrival(
            kind,
            on_s=reader.number(raw.get("on_s"), f"{where}.on_s", bounds=POSITIVE),
            off_s=reader.number(raw.get("off_s"), f"{where}.off_s"),
        ), None
    if kind == "ramp":
        raw = reader.mapping(parameters, where, {"from_rps", "to_rps"})
        return Arrival(
            kind,
            from_rps=reader.number(raw.get("from_rps"), f"{where}.from_rps"),
            to_rps=reader.number(raw.get("to_rps"), f"{where}.to_rps"),
        ), None
    if kind == "trace":
        return Arrival(kind), _trace(reader, parameters, where)
    if parameters is not None:
        reader.fail(where, "takes no parameters")
    return Arrival(kind), None


def _tenant(reader: _Reader, value: Any, path: str, objectives: set[str]) -> Tenant:
    raw = reader.mapping(value, path, TENANT_KEYS)
    name = reader.string(raw.get("name"), f"{path}.name", "?")
    objective = reader.string(raw.get("objective"), f"{path}.objective")
    if objective and objective not in objectives:
        reader.fail(f"{path}.objective", f"{objective!r} is not in objectives")
    arrival, trace = _arrival(reader, raw.get("arrival"), f"{path}.arrival")
    rate_default = 0.0 if arrival.kind in ("trace", "ramp") else REQUIRED
    rate = reader.number(raw.get("rate_rps"), f"{path}.rate_rps", rate_default)
    if arrival.kind in (*ARRIVALS, "bursts") and rate == 0:
        reader.fail(f"{path}.rate_rps", "must be positive")
    prefix = reader.mapping(raw.get("prefix"), f"{path}.prefix", {"group", "tokens"})
    ttl = raw.get("ttl_s")
    conversation = None
    if raw.get("conversation") is not None:
        where = f"{path}.conversation"
        chat = reader.mapping(raw["conversation"], where, {"turns", "think_s"})
        conversation = Conversation(
            reader.integer(chat.get("turns"), f"{where}.turns", bounds=POSITIVE),
            reader.number(chat.get("think_s"), f"{where}.think_s", bounds=POSITIVE),
        )
        if trace is not None:
            reader.fail(where, "a conversation's turns are not read from a trace")
    return Tenant(
        name=name,
        objective=objective,
        fairness_id=reader.string(raw.get("fairness_id"), f"{path}.fairness_id", name),
        rate_rps=rate,
        arrival=arrival,
        prompt_tokens=_lengths(
            reader, raw.get("prompt_tokens"), f"{path}.prompt_tokens", trace is not None
        ),
        output_tokens=_lengths(
            reader, raw.get("output_tokens"), f"{path}.output_tokens", trace is not None
        ),
        prefix_group=reader.string(prefix.get("group"), f"{path}.prefix.group") if prefix else None,
        prefix_tokens=reader.integer(prefix.get("tokens"), f"{path}.prefix.tokens", bounds=POSITIVE)
        if prefix
        else 0,
        conversation=conversation,
        stream=reader.boolean(raw.get("stream"), f"{path}.stream", True),
        lora=reader.string(raw.get("lora"), f"{path}.lora") if raw.get("lora") else None,
        ttl_s=reader.number(ttl, f"{path}.ttl_s", bounds=POSITIVE) if ttl is not None else None,
        trace=trace,
    )


EVENT_KINDS = ("server_down", "server_up", "server_change", "server_restart")


def _events(reader: _Reader, value: Any, pool: Pool) -> tuple[ServerEvent, ...]:
    """`server_down: N`, `server_up: N`, `server_restart: N`, or
    `server_change: N` with `params: {server keys}` (the keys not given
    keep the server's current values)."""
    servers = pool.servers
    events = []
    for index, item in enumerate(reader.sequence(value, "events")):
        path = f"events[{index}]"
        raw = reader.mapping(item, path, {"at_s", "params", *EVENT_KINDS})
        at = reader.number(raw.get("at_s"), f"{path}.at_s")
        kinds = [key for key in EVENT_KINDS if key in raw]
        if len(kinds) != 1:
            reader.fail(path, f"needs exactly one of {', '.join(EVENT_KINDS)}")
            continue
        kind = kinds[0]
        server = reader.integer(raw[kind], f"{path}.{kind}")
        if not 0 <= server < servers:
            reader.fail(f"{path}.{kind}", f"must name a server in 0..{servers - 1}")
            continue
        params = None
        if kind == "server_change":
            changes = reader.mapping(raw.get("params"), f"{path}.params", PARAM_KEYS)
            if not changes:
                reader.fail(f"{path}.params", "needs at least one server key")
            params = _params(reader, changes, f"{path}.params", pool.server_params[server])
        elif "params" in raw:
            reader.fail(f"{path}.params", "only a server_change takes params")
        events.append(
            ServerEvent(at, server, kind != "server_down", params, kind == "server_restart")
        )
    return tuple(sorted(events, key=lambda event: event.at_s))


def _config_file(reader: _Reader, value: Any, path: str) -> tuple[EppConfig, str | None]:
    """The EPP configuration file named at `path` (the default when it has errors)."""
    file = reader.path(value, path)
    if file is None:
        return EppConfig(), None
    try:
        return load_config(file), str(file)
    except ConfigError as error:
        for problem in error.errors:
            reader.fail(path, problem)
    return EppConfig(), str(file)


def _epp(reader: _Reader, value: Any) -> tuple[EppConfig, str | None, tuple[Variant, ...]]:
    raw = reader.mapping(value, "epp", {"config", "variants"})
    config, config_path = EppConfig(), None
    if raw.get("config") is not None:
        config, config_path = _config_file(reader, raw["config"], "epp.config")
    variants = []
    for index, item in enumerate(reader.sequence(raw.get("variants"), "epp.variants")):
        path = f"epp.variants[{index}]"
        entry = reader.mapping(item, path, {"name", "fairness", "config"})
        if "config" in entry:
            if "fairness" in entry:
                reader.fail(path, "a variant sets its fairness or its config, not both")
            variant_config, variant_path = _config_file(reader, entry["config"], f"{path}.config")
            name = reader.string(entry.get("name"), f"{path}.name")
            variants.append(Variant(name, config=variant_config, config_path=variant_path))
            continue
        fairness = reader.string(entry.get("fairness"), f"{path}.fairness")
        if fairness and fairness not in {policy.value for policy in Fairness}:
            reader.fail(
                f"{path}.fairness",
                f"unknown fairness {fairness!r}; known: {', '.join(p.value for p in Fairness)}",
            )
            continue
        name = reader.string(entry.get("name"), f"{path}.name", f"epp-{fairness}")
        variants.append(Variant(name, Fairness(fairness or Fairness.VTC)))
    return config, config_path, tuple(variants)


def parse_scenario(document: Any, base: Path | None = None) -> Scenario:
    """A Scenario from a parsed YAML document; ScenarioError lists every problem."""
    reader = _Reader(base)
    raw = reader.mapping(document, "", TOP_KEYS)
    if not isinstance(document, Mapping):
        raise ScenarioError(reader.errors or ["<document>: must be a mapping"])
    pool = _pool(reader, raw.get("pool"))
    objectives = []
    for index, item in enumerate(reader.sequence(raw.get("objectives"), "objectives")):
        path = f"objectives[{index}]"
        entry = reader.mapping(item, path, {"name", "priority", "slo_ttft_s", "slo_tpot_s"})
        priority = reader.integer(entry.get("priority"), f"{path}.priority", 0, ANY)
        slos = [
            reader.number(entry[key], f"{path}.{key}", bounds=POSITIVE)
            if entry.get(key) is not None
            else None
            for key in ("slo_ttft_s", "slo_tpot_s")
        ]
        objectives.append(
            Objective(reader.string(entry.get("name"), f"{path}.name"), priority, *slos)
        )
    names = {objective.name for objective in objectives}
    tenant_items = reader.sequence(raw.get("tenants"), "tenants")
    if not tenant_items:
        reader.fail("tenants", "needs at least one tenant")
    tenants = tuple(
        _tenant(reader, item, f"tenants[{index}]", names) for index, item in enumerate(tenant_items)
    )
    seen: set[str] = set()
    for index, tenant in enumerate(tenants):
        if tenant.name in seen:
            reader.fail(f"tenants[{index}].name", f"duplicate tenant {tenant.name!r}")
        seen.add(tenant.name)
    baselines = []
    for index, item in enumerate(
        reader.sequence(raw.get("baselines", list(BASELINES)), "baselines")
    ):
        if item not in BASELINES:
            reader.fail(f"baselines[{index}]", f"unknown baseline {item!r}; known: {BASELINES}")
        else:
            baselines.append(item)
    epp_config, epp_path, variants = _epp(reader, raw.get("epp"))
    scenario = Scenario(
        name=reader.string(raw.get("name"), "name"),
        seed=reader.integer(raw.get("seed"), "seed", 0),
        duration_s=reader.number(raw.get("duration_s"), "duration_s", bounds=POSITIVE),
        pool=pool,
        objectives=tuple(objectives),
        tenants=tenants,
        events=_events(reader, raw.get("events"), pool),
        kv_transfer=_kv_transfer(reader, raw.get("kv_transfer")),
        epp_config=epp_config,
        epp_config_path=epp_path,
        variants=variants,
        baselines=tuple(baselines),
        drain_s=reader.number(raw.get("drain_s"), "drain_s", 120.0),
        isolation=reader.boolean(raw.get("isolation"), "isolation", True),
        model=reader.string(raw.get("model"), "model", "model"),
        samples=reader.integer(raw.get("samples"), "samples", 200, bounds=POSITIVE),
    )
    if reader.errors:
        raise ScenarioError(reader.errors)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and parse a scenario file."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ScenarioError([f"cannot read: {error}"], str(path)) from None
    try:
        return parse_scenario(document, path.parent)
    except ScenarioError as error:
        raise ScenarioError(error.errors, str(path)) from None
