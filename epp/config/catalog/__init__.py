"""Every plugin type epp knows, by room; `epp.config.registry` joins them."""

from __future__ import annotations

from typing import Any

from epp.config.plugin import ParamType, Stability
from epp.scheduling.spec import PluginSpec, spec

T = ParamType
ALPHA = Stability.ALPHA


def made(make: Any, **arguments: Any) -> PluginSpec:
    """A spec whose name the loader fills in (the plugin's configured name)."""
    return spec("", make, **arguments)
