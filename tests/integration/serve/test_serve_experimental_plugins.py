"""--allow-experimental-plugins: a config that declares a plugin of the
reference's Alpha stability level loads only with it, as in the reference."""

from __future__ import annotations

import dataclasses

import pytest

from epp.config.loader import ConfigError
from epp.config.plugin import Stability
from epp.config.registry import REGISTRY
from epp.serve.server import EppServer
from tests.support.serving import loopback_options

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: my-queue
  type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: my-queue
"""


@pytest.fixture
def queue_scorer_is_alpha():
    """No Alpha type of the catalogue loads in epp yet, so a loadable one is
    marked Alpha for the test."""
    entry = REGISTRY.get("queue-scorer")
    assert entry is not None
    REGISTRY.replace(dataclasses.replace(entry, stability=Stability.ALPHA))
    yield
    REGISTRY.replace(entry)


def server(**options: object) -> EppServer:
    return EppServer(
        loopback_options(
            config_text=CONFIG, endpoints="127.0.0.1:1", secure_serving=False, **options
        )
    )


def test_an_alpha_plugin_is_refused_without_the_flag(queue_scorer_is_alpha):
    with pytest.raises(ConfigError, match="'my-queue' \\(type: 'queue-scorer'\\) has Alpha"):
        server()


def test_an_alpha_plugin_loads_with_the_flag(queue_scorer_is_alpha):
    assert server(allow_experimental_plugins=True).config.plugins == (("my-queue", "queue-scorer"),)


def test_beta_plugins_need_no_flag():
    assert server().config.plugins == (("my-queue", "queue-scorer"),)
