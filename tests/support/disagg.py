"""An EndpointPickerConfig that disaggregates every request (prefill on a
`llm-d.ai/role: prefill` endpoint, decode on a decode one), for tests."""

from __future__ import annotations

DISAGG_SCHEDULING = """\
plugins:
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  name: pd
  parameters:
    deciders: {prefill: always-disagg-pd-decider}
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}]
"""


def disagg_config(gate: str) -> str:
    """The config's text, with `gate` the flowControl.gate mapping in flow style."""
    return (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        f"flowControl:\n  gate: {gate}\n{DISAGG_SCHEDULING}"
    )
