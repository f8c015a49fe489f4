"""Turn a model server's Prometheus text page into `EndpointMetrics`.

Parsing is prometheus-client's text parser. A vLLM page holds ~450 lines
(mostly histograms) and the parser costs ~15-40 us per line, so parsing the
whole page (~6 ms) for 64 endpoints at 20 Hz would need several cores.
Instead the reader first picks out the few sample lines of the series it
needs (a substring search, ~20 us per page), and parses only those; a line
identical to one seen in this endpoint's previous page (the cache config,
an unchanged LoRA state or queue) reuses its earlier parse, a line whose
value alone changed (a histogram's buckets, at every step) reuses the parse
of its name and labels, and a page whose picked lines are all as in the
previous page gives the previous metrics, read at the new time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import pairwise

from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.engines import EngineMetricNames, Series
from epp.scheduling.endpoint import EndpointMetrics

Sample = tuple[str, dict[str, str], float]
HISTOGRAM_SUFFIXES = ("_sum", "_count", "_bucket")
HEADS_KEPT = 4


def select_lines(text: str, names: Iterable[str], histograms: Iterable[str] = ()) -> list[str]:
    """The sample lines of the series called exactly one of `names`, and
    the `_sum`, `_count` and `_bucket` lines of the first of the
    `histograms` the page carries.

    The exposition format keeps all samples of a metric in one group, so the
    search for a name stops at the end of its first group instead of
    scanning the rest of the page. A histogram's group repeats its buckets,
    count and sum per label set, so they are searched for up to the next
    comment line (the next family's HELP or TYPE).
    """
    page = "\n" + text
    lines = []
    for histogram in histograms:
        start = page.find("\n" + histogram + "_")
        if start == -1:
            continue
        end = page.find("\n#", start)
        if end == -1:
            end = len(page)
        series = tuple(histogram + suffix for suffix in HISTOGRAM_SUFFIXES)
        for line in page[start + 1 : end].split("\n"):
            if line.startswith(series):
                name_end = line.find("{")
                if name_end == -1:
                    name_end = line.find(" ")
                if line[:name_end] in series:
                    lines.append(line.rstrip("\r"))
        break  # the first one the page carries is the one read
    for name in names:
        needle = "\n" + name
        position = page.find(needle)
        in_group = False
        while position != -1:
            line, end = _sample_line(page, position, len(needle))
            if line is not None:
                lines.append(line)
                in_group = True
            elif in_group:
                break
            if page.startswith(needle, end):
                position = end
            elif in_group:
                break
            else:
                position = page.find(needle, end)
    return lines


def _sample_line(page: str, position: int, after: int) -> tuple[str | None, int]:
    """The line of `page` after the newline at `position`, if the name
    searched for (`after` characters, the newline included) is its whole
    metric name (labels or a space follow, not a longer name), else None;
    and where that line ends."""
    end = page.find("\n", position + 1)
    if end == -1:
        end = len(page)
    if page[position + after : position + after + 1] in ("{", " "):
        return page[position + 1 : end].rstrip("\r"), end
    return None, end


def parse_line(line: str) -> Sample:
    """One sample line, by prometheus-client's parser."""
    for family in text_string_to_metric_families(line):
        for sample in family.samples:
            return sample.name, sample.labels, float(sample.value)
    raise ValueError(f"no sample in metrics line {line!r}")


class MetricsReader:
    """Reads successive metrics pages of one endpoint (see the module docstring)."""

    __slots__ = ("_heads", "_lines", "_metrics", "_names", "_previous")

    def __init__(self) -> None:
        self._previous: dict[str, Sample] = {}
        self._heads: dict[str, tuple[str, dict[str, str]]] = {}
        """The parsed name and labels of the heads (a line up to its value)
        of lines seen; at most `HEADS_KEPT` times the lines a page gives,
        plus 64."""
        self._lines: list[str] | None = None
        self._names: EngineMetricNames | None = None
        self._metrics: EndpointMetrics | None = None
        """What the last page that read well gave, from its `_lines`."""

    def read(self, text: str, names: EngineMetricNames, now: float) -> EndpointMetrics:
        """The metrics in `text`, read at `now`. ValueError when a value is
        malformed, or when the page carries no series of the engine at all."""
        lines = select_lines(text, names.names(), names.itl)
        if lines == self._lines and names is self._names and self._metrics is not None:
            return self._metrics._replace(updated_at=now)
        previous = self._previous
        heads = self._heads
        if len(heads) > HEADS_KEPT * len(lines) + 64:
            heads.clear()
        parsed: dict[str, Sample] = {}
        samples: dict[str, list[Sample]] = {}
        for line in lines:
            sample = previous.get(line)
            if sample is None:
                sample = _parse_changed(line, heads)
            parsed[line] = sample
            found = samples.get(sample[0])
            if found is None:
                samples[sample[0]] = [sample]
            else:
                found.append(sample)
        self._previous = parsed
        self._lines = None
        if not samples and names.prefix is not None and names.prefix not in text:
            raise ValueError(
                f"the page has no {names.prefix}* series: not this engine's metrics "
                "(check the engine label and the metrics path)"
            )
        metrics = metrics_from_samples(samples, names, now)
        self._lines, self._names, self._metrics = lines, names, metrics
        return metrics


def _parse_changed(line: str, heads: dict[str, tuple[str, dict[str, str]]]) -> Sample:
    """`line`, whose value changed since the previous page: its name and
    labels are parsed once (a histogram's buckets change at every step),
    its value by `float`; a line without labels is one `select_lines`
    picked by its whole name; anything else unusual goes to the full
    parser, which raises on what is malformed."""
    brace = line.rfind("}")
    if brace == -1:
        rest = line.split()
        if len(rest) in (2, 3) and "_" not in rest[1]:
            try:
                return rest[0], {}, float(rest[1])
            except ValueError:
                pass
        return parse_line(line)
    head = line[: brace + 1]
    labelled = heads.get(head)
    if labelled is None:
        name, labels, _ = parse_line(head + " 0")
        labelled = heads[head] = (name, labels)
    rest = line[brace + 1 :].split()
    if len(rest) in (1, 2) and "_" not in rest[0]:
        try:
            return labelled[0], labelled[1], float(rest[0])
        except ValueError:
            pass
    return parse_line(line)


def metrics_from_samples(
    samples: dict[str, list[Sample]], names: EngineMetricNames, now: float
) -> EndpointMetrics:
    """Counts are summed over the engine's separate schedulers (`rank_labels`)
    and counted once over copies of one scheduler's state; KV-cache usage is
    the largest, clamped to [0, 1]. A load series the page lacks reads 0: the
    engines create labelled gauges only once stats flow, so a fresh server
    has none. A malformed optional value (LoRA, block geometry, the latency
    histogram) drops that value only."""
    waiting = _count(samples, names.waiting, names.rank_labels)
    running = _count(samples, names.running, names.rank_labels)
    kv_values = _values(samples, names.kv_usage)
    kv_usage = min(1.0, max(0.0, max(kv_values))) if kv_values else 0.0
    if waiting < 0 or running < 0:
        raise ValueError(f"negative request count: waiting {waiting}, running {running}")
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    lora_max = 0
    lora = samples.get(names.lora_info) if names.lora_info else None
    if lora:
        labels = max(lora, key=lambda sample: sample[2])[1]
        lora_running = _adapters(labels.get("running_lora_adapters", ""))
        lora_waiting = _adapters(labels.get("waiting_lora_adapters", ""))
        lora_max = _int_label(labels, "max_lora") or 0
    block_size = num_gpu_blocks = None
    cache = samples.get(names.cache_info) if names.cache_info else None
    if cache:
        labels = cache[0][1]
        block_size = _int_label(labels, names.block_size_label)
        num_gpu_blocks = _int_label(labels, names.num_blocks_label)
    block_size = _gauge_int(samples, names.block_size_gauge, block_size)
    num_gpu_blocks = _gauge_int(samples, names.num_blocks_gauge, num_gpu_blocks)
    itl_sum, itl_count = _histogram_totals(samples, names.itl)
    itl_bounds, itl_buckets = _histogram_buckets(samples, names.itl) if itl_count else ((), ())
    return EndpointMetrics(
        waiting=waiting,
        running=running,
        kv_usage=kv_usage,
        lora_running=lora_running,
        lora_waiting=lora_waiting,
        lora_max=lora_max,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        updated_at=now,
        itl_sum=itl_sum,
        itl_count=itl_count,
        itl_bounds=itl_bounds,
        itl_buckets=itl_buckets,
    )


def _histogram_totals(
    samples: dict[str, list[Sample]], histograms: tuple[str, ...]
) -> tuple[float, float]:
    """The sum and count of the first of `histograms` the page carries,
    added over its label sets (each holds its own observations); (0, 0)
    when none is there or a value is not a finite, non-negative number."""
    for histogram in histograms:
        sums = samples.get(histogram + "_sum")
        counts = samples.get(histogram + "_count")
        if not sums or not counts:
            continue
        total = math.fsum(sample[2] for sample in sums)
        count = math.fsum(sample[2] for sample in counts)
        if not (0.0 <= total < math.inf and 0.0 <= count < math.inf):
            return 0.0, 0.0
        return total, count
    return 0.0, 0.0


def _histogram_buckets(
    samples: dict[str, list[Sample]], histograms: tuple[str, ...]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The buckets of the first of `histograms` the page carries (the one
    `_histogram_totals` reads): their upper bounds, growing, without
    `+Inf`, and their cumulative counts, each added over the label sets;
    empty when it has none, or a bound or count is malformed or the counts
    do not grow."""
    for histogram in histograms:
        if not samples.get(histogram + "_sum") or not samples.get(histogram + "_count"):
            continue
        added: dict[float, float] = {}
        for _, labels, value in samples.get(histogram + "_bucket", ()):
            try:
                bound = float(labels.get("le", ""))
            except ValueError:
                return (), ()
            if not 0.0 <= value < math.inf or math.isnan(bound):
                return (), ()
            added[bound] = added.get(bound, 0.0) + value
        buckets = sorted((bound, count) for bound, count in added.items() if bound < math.inf)
        if any(later[1] < earlier[1] for earlier, later in pairwise(buckets)):
            return (), ()
        return tuple(bound for bound, _ in buckets), tuple(count for _, count in buckets)
    return (), ()


def _matching(samples: dict[str, list[Sample]], choices: tuple[Series, ...]) -> list[Sample]:
    """The samples of the first of `choices` the page carries."""
    for series in choices:
        found = [sample for sample in samples.get(series.name, ()) if series.matches(sample[1])]
        if found:
            return found
    return []


def _values(samples: dict[str, list[Sample]], choices: tuple[Series, ...]) -> list[float]:
    found = _matching(samples, choices)
    values = [sample[2] for sample in found]
    if any(math.isnan(value) or math.isinf(value) for value in values):
        raise ValueError(f"series {found[0][0]} is not a finite number: {values}")
    return values


def _count(
    samples: dict[str, list[Sample]], choices: tuple[Series, ...], rank_labels: frozenset[str]
) -> float:
    """Summed over ranks; the largest of the copies within one rank."""
    found = _matching(samples, choices)
    if not found:
        return 0.0
    per_rank: dict[tuple[str | None, ...], float] = {}
    for _, labels, value in found:
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"series {found[0][0]} is not a finite number: {value}")
        rank = tuple(labels.get(label) for label in sorted(rank_labels))
        current = per_rank.get(rank)
        if current is None or value > current:
            per_rank[rank] = value
    return sum(per_rank.values())


def _adapters(value: str) -> frozenset[str]:
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def _int_label(labels: dict[str, str], label: str) -> int | None:
    """An integer label's value; None when absent or not an integer (vLLM
    prints an unset field as "None")."""
    value = labels.get(label)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _gauge_int(
    samples: dict[str, list[Sample]], gauge: Series | None, fallback: int | None
) -> int | None:
    if gauge is None:
        return fallback
    found = _matching(samples, (gauge,))
    if not found:
        return fallback
    value = found[0][2]
    if math.isnan(value) or math.isinf(value) or value < 0:
        return fallback
    return int(value)
