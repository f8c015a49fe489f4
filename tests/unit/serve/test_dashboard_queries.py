"""Reading the reference's dashboard and alert queries: the series each
selects, its label matchers, the labels it groups and joins on, and what a
metrics page lacks for it."""

from __future__ import annotations

import pytest

from tests.support.dashboards import read_page, reference_queries, unmet
from tests.support.promql import Matcher, reads


def test_a_dashboard_query_parses_with_grafanas_interval_variables():
    (selector,) = reads('rate(x_total{a="b", c=~"$c"}[$__rate_interval])')
    assert selector.name == "x_total"
    assert selector.matchers == (Matcher("a", "=", "b"), Matcher("c", "=~", "$c"))


def test_the_labels_an_aggregation_groups_by_apply_to_the_series_beneath_it():
    (selector,) = reads("histogram_quantile(0.9, sum by (le, model_name) (rate(x_bucket[5m])))")
    assert selector.grouped == {"le", "model_name"}
    (summed,) = reads("sum(rate(x_bucket[5m]))")
    assert summed.grouped == frozenset()


def test_the_labels_a_join_is_on_apply_to_both_sides_up_to_an_aggregation():
    left, right = reads("x and on (a, b) rate(y[5m])")
    assert left.grouped == right.grouped == {"a", "b"}
    summed, joined = reads("sum by (a) (x) and on (a) topk(10, sum by (a, b) (y))")
    assert (summed.grouped, joined.grouped) == ({"a"}, {"a", "b"})


def test_a_template_variable_accepts_any_value_and_a_regex_must_match_whole():
    assert Matcher("m", "=~", "$model_name").accepts("anything")
    assert Matcher("o", "=~", "Dispatched|EvictedTTL").accepts("EvictedTTL")
    assert not Matcher("o", "=~", "Dispatch").accepts("Dispatched")
    assert Matcher("code", "!~", "OK|Canceled").accepts("Unknown")
    assert not Matcher("o", "!=", "x").accepts("x")


def test_a_query_that_is_not_promql_is_refused():
    with pytest.raises(ValueError, match="not PromQL"):
        reads("sum by (")


def test_a_page_lacks_a_series_a_matched_value_and_a_grouping_label():
    page = read_page('# TYPE x counter\nx_total{a="1"} 1.0\n')
    (absent,) = reads("rate(y_total[5m])")
    assert unmet(absent, page) == ["no series y_total"]
    (wrong_value,) = reads('x_total{a="2", namespace=~"$ns"}')
    assert unmet(wrong_value, page) == ["no x_total sample matching {a='2'}"]
    (ungrouped,) = reads("sum by (b, pod) (x_total)")
    assert unmet(ungrouped, page) == ["x_total has no label b to group on"]
    (met,) = reads('sum by (a) (x_total{a=~"1|3"})')
    assert unmet(met, page) == []


def test_every_reference_query_parses_and_the_epp_panels_are_counted():
    queries = reference_queries()
    panels = {(q.source, q.panel) for q in queries if q.epp_selectors()}
    assert len(queries) > 100
    assert len(panels) >= 50
