"""The reader, which parses only the lines of the series its engine reads,
gives what parsing the whole page gives: on every engine page in `pages/`,
and on successive pages of one endpoint whose values change (the reader
reuses what it parsed in the previous page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datalayer.engines import ENGINES, EngineMetricNames
from epp.datalayer.reader import MetricsReader, Sample, metrics_from_samples
from epp.scheduling.endpoint import EndpointMetrics
from tests.support.metrics_page import MetricsPage

PAGES = Path(__file__).parent / "pages"
ENGINE_OF_PAGE = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm-serve"}
ENGINE_PAGES = sorted(
    (path.name, ENGINE_OF_PAGE[path.name.split("_")[0]]) for path in PAGES.glob("*.txt")
)
SAMPLE_VALUE = re.compile(r"^([^#\s][^\n]*[}\w])\s+(\S+)$", re.MULTILINE)
"""A sample line (no timestamp): its name and labels, and its value."""


def full_parse(text: str, names: EngineMetricNames, now: float) -> EndpointMetrics:
    """Every line of the page through prometheus-client's parser."""
    samples: dict[str, list[Sample]] = {}
    for sample in MetricsPage.parse(text).samples:
        samples.setdefault(sample.name, []).append((sample.name, sample.labels, sample.value))
    return metrics_from_samples(samples, names, now)


def outcome(read, *args) -> EndpointMetrics | str:
    try:
        return read(*args)
    except ValueError:
        return "ValueError"


def values(metrics: EndpointMetrics | str) -> tuple | str:
    """Every field, the latency histogram's too (`same_values` leaves it out)."""
    if isinstance(metrics, str):
        return metrics
    return tuple(metrics)


@pytest.mark.parametrize(("name", "engine"), ENGINE_PAGES)
def test_an_engine_page_reads_as_its_full_parse(name, engine):
    text = (PAGES / name).read_text()
    names = ENGINES[engine]
    assert values(MetricsReader().read(text, names, 3.0)) == values(full_parse(text, names, 3.0))


value = st.one_of(
    st.integers(0, 10_000).map(str),
    st.floats(0, 1e6, allow_nan=False).map(repr),
    st.sampled_from(["0", "1.0", "NaN", "+Inf", "-1", "1e3", "7.5e-1"]),
)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(ENGINE_PAGES),
    st.lists(
        st.dictionaries(st.tuples(st.booleans(), st.integers(0, 400)), value, max_size=12),
        min_size=1,
        max_size=4,
    ),
)
def test_successive_pages_whose_values_change_read_as_their_full_parse(page, changes):
    """A change hits a line of a series the engine reads, or any sample line."""
    name, engine = page
    names = ENGINES[engine]
    lines = (PAGES / name).read_text().split("\n")
    samples = [index for index, line in enumerate(lines) if SAMPLE_VALUE.match(line)]
    read_names = (*names.names(), *names.itl)
    read_lines = [index for index in samples if lines[index].startswith(read_names)]
    reader = MetricsReader()
    for step, changed in enumerate(changes):
        for (read_series, position), new in changed.items():
            among = read_lines if read_series and read_lines else samples
            index = among[position % len(among)]
            head = SAMPLE_VALUE.match(lines[index]).group(1)
            lines[index] = f"{head} {new}"
        text = "\n".join(lines)
        expected = outcome(full_parse, text, names, float(step))
        assert values(outcome(reader.read, text, names, float(step))) == values(expected)
