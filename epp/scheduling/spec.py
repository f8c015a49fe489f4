"""How a configured scheduling plugin becomes a live one.

The configuration holds `PluginSpec`s: the plugin's configured name, the
function of this package that makes it, its keyword arguments and its
registry type. Specs
are plain values (equal when configured alike), so a reloaded configuration
that did not change builds nothing new. A `Scheduler` builds each named
plugin once (`BuildContext.build`), so a plugin referenced by two profiles is
one instance with one state, as in the reference EPP.

A `PluginTimer`, when the shell gives one, wraps each plugin call the
scheduler makes (filter, score, pick) so its duration is measured per
extension point, plugin type and name (the reference's
`plugin_duration_seconds`); the core itself reads no clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epp.scheduling.inflight import InFlightLoad


@dataclass(slots=True, frozen=True)
class PluginSpec:
    """A plugin as configured: `make(context, **arguments)` builds it.
    `type` is its registry type name; when not given, its name (the
    built-in defaults are named after their type)."""

    name: str
    make: Callable[..., Any]
    arguments: tuple[tuple[str, Any], ...] = ()
    type: str = ""

    def __post_init__(self) -> None:
        if not self.type:
            object.__setattr__(self, "type", self.name)


PluginTimer = Callable[[str, str, str, Callable[..., Any]], Callable[..., Any]]
"""(extension point, plugin type, plugin name, call) -> the call, timed."""


def spec(name: str, make: Callable[..., Any], **arguments: Any) -> PluginSpec:
    return PluginSpec(name, make, tuple(sorted(arguments.items())))


def named(plugin: PluginSpec, name: str) -> PluginSpec:
    """`plugin` under its configured `name`; a plugin that publishes under
    its own name (an argument `name`, as `session-id-producer`) gets it too."""
    arguments = plugin.arguments
    if any(key == "name" for key, _ in arguments):
        arguments = tuple((key, name if key == "name" else value) for key, value in arguments)
    return PluginSpec(name, plugin.make, arguments)


@dataclass(slots=True)
class BuildContext:
    """What plugins may need when they are built: the scheduling
    configuration (prefix-block parameters, ...), the scheduler's random
    source, the concurrency gate (its in-flight counts), the scheduler's
    clock (seconds), the in-flight load (made by `in_flight_load` for the
    first plugin that reads it; the core then tells it of every dispatch
    and completion), the plugins built so far, by name, and the shell's
    plugin timer, if any."""

    config: Any
    rng: random.Random
    gate: Any = None
    built: dict[str, Any] = field(default_factory=dict)
    clock: Callable[[], float] = field(default=lambda: 0.0)
    pool: Callable[[], Any] | None = None
    """The scheduler's pool snapshots (what the prefix index auto-tunes from)."""
    load: InFlightLoad | None = None
    kv_index: Any = None
    """The precise prefix index (`kvblocks.KVBlockIndex`), the core's when it
    has one, else made by the first scorer that reads it."""

    def in_flight_load(self) -> InFlightLoad:
        """The in-flight load the scheduler's plugins share."""
        if self.load is None:
            self.load = InFlightLoad()
        return self.load

    timer: PluginTimer | None = None

    def timed(self, extension_point: str, plugin: PluginSpec, call: Callable[..., Any]) -> Any:
        """`call` of `plugin`, timed when a timer is given."""
        if self.timer is None:
            return call
        return self.timer(extension_point, plugin.type, plugin.name, call)

    def build(self, plugin: PluginSpec) -> Any:
        """The plugin called `plugin.name`, built on first use."""
        instance = self.built.get(plugin.name)
        if instance is None:
            instance = plugin.make(self, **dict(plugin.arguments))
            self.built[plugin.name] = instance
        return instance

    def first(self, kind: type) -> Any:
        """The first built plugin that is a `kind`, or None."""
        return next((p for p in self.built.values() if isinstance(p, kind)), None)
