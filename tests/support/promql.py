"""What a PromQL query reads: each series selector (metric name and label
matchers) with the labels the query groups or joins on above it, from the
maintained parser (promql-parser). Grafana's interval variables are replaced
by a duration first so that a dashboard's query parses.

    for selector in reads('sum by (le) (rate(x_bucket{a="b"}[$__rate_interval]))'):
        selector.name, selector.matchers, selector.grouped   # x_bucket, (a="b",), {"le"}
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import promql_parser

GRAFANA_RANGE = re.compile(r"\$(?:__rate_interval|__interval|__range|interval)\b|\$\{__\w+\}")


@dataclass(slots=True, frozen=True)
class Matcher:
    label: str
    op: str
    """`=`, `!=`, `=~` or `!~`."""
    value: str

    @property
    def variable(self) -> bool:
        """A Grafana template variable (`$model_name`): any value may be chosen."""
        return "$" in self.value

    def accepts(self, value: str) -> bool:
        if self.variable:
            return True
        if self.op in ("=", "!="):
            found = value == self.value
        else:
            found = re.fullmatch(self.value, value) is not None
        return found if self.op in ("=", "=~") else not found


@dataclass(slots=True, frozen=True)
class Selector:
    name: str
    matchers: tuple[Matcher, ...]
    grouped: frozenset[str]
    """The labels an enclosing `by (...)` or `on (...)` needs this series to carry."""


OPS = (
    (promql_parser.MatchOp.Equal, "="),
    (promql_parser.MatchOp.NotEqual, "!="),
    (promql_parser.MatchOp.Re, "=~"),
    (promql_parser.MatchOp.NotRe, "!~"),
)
"""The binding's match operators (comparable, not hashable) and their PromQL."""


def _op(op: object) -> str:
    return next(text for known, text in OPS if op == known)


def reads(query: str) -> list[Selector]:
    """The selectors of `query` (ValueError if it does not parse)."""
    text = GRAFANA_RANGE.sub("5m", query)
    try:
        tree = promql_parser.parse(text)
    except Exception as error:  # the binding raises a bare Exception
        raise ValueError(f"not PromQL: {query!r}: {error}") from error
    return list(_walk(tree, frozenset()))


def _walk(node: object, grouped: frozenset[str]) -> Iterator[Selector]:
    kind = type(node).__name__
    if kind == "MatrixSelector":
        node = node.vector_selector  # type: ignore[attr-defined]
        kind = "VectorSelector"
    if kind == "VectorSelector":
        matchers = tuple(
            Matcher(m.name, _op(m.op), m.value)
            for m in node.matchers.matchers  # type: ignore[attr-defined]
        )
        yield Selector(node.name, matchers, grouped)  # type: ignore[attr-defined]
        return
    if kind == "AggregateExpr":
        modifier = node.modifier  # type: ignore[attr-defined]
        if modifier is None:
            inner: frozenset[str] = frozenset()
        elif modifier.type == promql_parser.AggModifierType.By:
            inner = frozenset(modifier.labels)
        else:
            inner = grouped - frozenset(modifier.labels)
        yield from _walk(node.expr, inner)  # type: ignore[attr-defined]
        return
    if kind == "BinaryExpr":
        modifier = node.modifier  # type: ignore[attr-defined]
        matching = modifier.matching if modifier is not None else None
        if matching is not None and matching.type == promql_parser.LabelModifierType.Include:
            grouped = grouped | frozenset(matching.labels)
        yield from _walk(node.lhs, grouped)  # type: ignore[attr-defined]
        yield from _walk(node.rhs, grouped)  # type: ignore[attr-defined]
        return
    if kind == "Call":
        inner = frozenset() if node.func.name == "absent" else grouped  # type: ignore[attr-defined]
        for argument in node.args:  # type: ignore[attr-defined]
            yield from _walk(argument, inner)
        return
    if kind in ("ParenExpr", "SubqueryExpr", "UnaryExpr"):
        yield from _walk(node.expr, grouped)  # type: ignore[attr-defined]
