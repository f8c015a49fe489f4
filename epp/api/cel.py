"""Evaluation of CRD `x-kubernetes-validations` rules with cel-python.

Rules are compiled once per rule text. `self` is bound to the value at the
rule's schema node, already defaulted and pruned, as the API server does.
The rules of our CRDs use `has()`, `size()`, the `all`/`exists_one` macros,
comparisons and boolean logic, all of which are standard CEL.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import celpy

_ENV = celpy.Environment()


@lru_cache(maxsize=256)
def _program(expression: str) -> celpy.Runner:
    return _ENV.program(_ENV.compile(expression))


class RuleError(Exception):
    """A rule that does not compile or does not evaluate to a boolean."""


def evaluate(expression: str, value: Any) -> Any:
    """The result of `expression` with `self` bound to `value`."""
    try:
        result = _program(expression).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELParseError as error:
        raise RuleError(f"compilation failed: {error}") from None
    except celpy.CELEvalError as error:
        raise RuleError(str(error.args[0] if error.args else error)) from None
    if isinstance(result, celpy.CELEvalError):
        raise RuleError(str(result.args[0] if result.args else result))
    return result


def holds(rule: str, value: Any) -> bool:
    """Whether the boolean `rule` holds for `value`."""
    result = evaluate(rule, value)
    if not isinstance(result, celpy.celtypes.BoolType):
        raise RuleError(f"rule must evaluate to a bool, got {type(result).__name__}")
    return bool(result)
