"""`token-producer`'s parameters as `EppConfig.tokenizer`: each backend reads
its own fields; the model and the concurrency are every backend's."""

import pytest

from epp.config.loader import parse_config
from epp.config.precise import TokenizerBackend, TokenizerSettings


def tokenizer(parameters: dict) -> TokenizerSettings:
    document = {
        "apiVersion": "llm-d.ai/v1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "token-producer", "parameters": parameters},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "max-score-picker"}]}],
    }
    return parse_config(document).tokenizer


@pytest.mark.parametrize(
    ("backend", "fields", "expected"),
    [
        (
            "vllm",
            {"url": "http://h:1/", "timeout": "2s", "mmTimeout": "3s"},
            TokenizerSettings(
                TokenizerBackend.VLLM, "m", "http://h:1", 2.0, 3.0, max_concurrency=7
            ),
        ),
        (
            "udsTokenizerConfig",
            {"socketFile": "/s", "timeout": "4s"},
            TokenizerSettings(
                TokenizerBackend.UDS, "m", timeout=4.0, socket_file="/s", max_concurrency=7
            ),
        ),
        (
            "local",
            {"modelDir": "/d", "timeout": "6s"},
            TokenizerSettings(
                TokenizerBackend.LOCAL, "m", timeout=6.0, model_dir="/d", max_concurrency=7
            ),
        ),
    ],
)
def test_each_backend_reads_its_own_fields_and_the_shared_model_and_concurrency(
    backend, fields, expected
):
    assert tokenizer({"modelName": "m", "maxConcurrency": 7, backend: fields}) == expected


def test_without_a_backend_the_estimate_keeps_the_model_and_concurrency():
    assert tokenizer({"modelName": "m", "maxConcurrency": 7}) == TokenizerSettings(
        model_name="m", max_concurrency=7
    )


@pytest.mark.parametrize(
    ("backend", "fields", "expected"),
    [
        ("vllm", {}, TokenizerSettings(TokenizerBackend.VLLM, "m")),
        (
            "local",
            {"modelDir": "/d"},
            TokenizerSettings(TokenizerBackend.LOCAL, "m", model_dir="/d"),
        ),
    ],
)
def test_a_backends_absent_fields_are_the_settings_defaults(backend, fields, expected):
    assert tokenizer({"modelName": "m", backend: fields}) == expected
