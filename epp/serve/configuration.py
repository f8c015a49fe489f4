"""The live EPP's EndpointPickerConfig: read from `--config-file` or
`--config-text` (Alpha plugins refused unless `--allow-experimental-plugins`),
and on a reload the part of a new configuration that applies at once.

Gate kinds, eviction, the data layer and the models-responder keep their
start values until the next restart (warned): each of them is wired into
long-lived pieces (the credits, the evictor, the scrapers) when the server
starts. Everything else (flow control, scheduling, parsers, admitters) is
handed to the core and the stream settings by `EppServer.reload_config`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import yaml

from epp.config.loader import (
    ConfigError,
    EppConfig,
    experimental_errors,
    load_config,
    parse_config,
)
from epp.serve.options import ServeOptions

log = logging.getLogger("epp.serve.server")


def load_serve_config(options: ServeOptions) -> EppConfig:
    """The configuration `options` name; `ConfigError` when it does not load
    or names an Alpha plugin that is not allowed."""
    config = _read_config(options)
    if not options.allow_experimental_plugins:
        experimental = experimental_errors(config)
        if experimental:
            raise ConfigError(experimental, options.config_file or "--config-text")
    return config


def _read_config(options: ServeOptions) -> EppConfig:
    if options.config_text is not None:
        try:
            config = parse_config(yaml.safe_load(options.config_text))
        except yaml.YAMLError as error:
            raise ConfigError([f"cannot read: {error}"], "--config-text") from None
        except ConfigError as error:
            raise ConfigError(error.errors, "--config-text", error.unsupported) from None
    elif options.config_file is None:
        return EppConfig()
    else:
        config = load_config(options.config_file)
    for warning in config.warnings:
        log.warning("configuration: %s", warning)
    return config


def live_part(old: EppConfig, new: EppConfig, source: object) -> EppConfig:
    """`new` with what applies only at a restart kept as in `old`, each such
    change warned (naming `source`)."""
    gate, old_gate = new.flow_control.gate, old.flow_control.gate
    if replace(gate, prefill_timeout=old_gate.prefill_timeout) != old_gate:
        log.warning("%s: gate changes apply at the next restart", source)
        gate = replace(old_gate, prefill_timeout=gate.prefill_timeout)
        new = replace(new, flow_control=replace(new.flow_control, gate=gate))
    if new.flow_plugins.eviction != old.flow_plugins.eviction:
        log.warning("%s: enableEviction changes apply at the next restart", source)
        plugins = replace(new.flow_plugins, eviction=old.flow_plugins.eviction)
        new = replace(new, flow_plugins=plugins)
    if new.data_layer != old.data_layer:
        log.warning("%s: dataLayer changes apply at the next restart", source)
        new = replace(new, data_layer=old.data_layer)
    if new.models != old.models:
        log.warning("%s: models-responder changes apply at the next restart", source)
        new = replace(new, models=old.models)
    return new
