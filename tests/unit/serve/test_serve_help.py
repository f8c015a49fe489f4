"""`epp serve --help`: every flag says what it does, and its default once."""

from __future__ import annotations

import re

from tests.unit.serve.test_serve_options import parser

DEFAULT = re.compile(r"\(default |default: ")


def helps() -> dict[str, str]:
    return {
        action.option_strings[-1]: action.help or ""
        for action in parser()._actions
        if action.option_strings and action.option_strings[-1] != "--help"
    }


def test_every_flag_has_a_description_besides_its_default():
    bare = [name for name, text in helps().items() if not DEFAULT.split(text)[0].strip()]
    assert bare == []


def test_no_flag_states_its_default_twice():
    doubled = [name for name, text in helps().items() if len(DEFAULT.findall(text)) > 1]
    assert doubled == []


def test_the_transport_limits_describe_what_they_limit_with_sizes_in_binary_units():
    text = helps()["--grpc-stream-window-bytes"]
    assert text == (
        "Inbound flow-control window of each stream (SETTINGS_INITIAL_WINDOW_SIZE). (default 1MiB)"
    )


def test_a_size_default_is_read_back_as_the_same_size():
    options = parser().parse_args(["--grpc-max-header-list-bytes", "16KiB"])
    assert vars(options)["transport.max_header_list_bytes"] == 16 * 1024
