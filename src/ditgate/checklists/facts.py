"""Inspect facts in checklists: reading a dotted fact of the anatomy and judging it against an expectation."""

from __future__ import annotations

from typing import Any
from ditgate.checklists.context import Outcome
from ditgate.checklists.files import ChecklistError

_MISSING = object()  # a fact the anatomy does not have


# ---------------------------------------------------------------------------------------------------- facts
def fact_values(data: Any, fact: str) -> list[tuple[str, Any]]:
    """(concrete path, value) for every value `fact` addresses; a missing key gives _MISSING."""
    found: list[tuple[str, Any]] = [("", data)]
    for part in fact.split("."):
        nxt = []
        for where, value in found:
            here = f"{where}.{part}" if where else part
            if part == "*" and isinstance(value, (list, dict)):
                items = enumerate(value) if isinstance(value, list) else value.items()
                nxt += [(f"{where}.{k}" if where else str(k), v) for k, v in items]
            elif isinstance(value, dict):
                nxt.append((here, value.get(part, _MISSING)))
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                nxt.append((here, value[int(part)]))
            else:
                nxt.append((here, _MISSING))
        found = nxt
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1 in Python; not here
        return type(a) is type(b) and a == b
    return a == b


def expect_holds(expect: Any, value: Any) -> bool:
    if value is _MISSING:
        return isinstance(expect, dict) and expect.get("present") is False
    if not isinstance(expect, dict):
        return _same(value, expect)
    (op, arg), = expect.items()
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if op == "equals":
        return _same(value, arg)
    if op == "not_equals":
        return not _same(value, arg)
    if op == "one_of":
        return any(_same(value, a) for a in arg)
    if op == "at_least":
        return number and value >= arg
    if op == "at_most":
        return number and value <= arg
    if op == "present":
        return (value is not None) == arg
    if op == "empty":
        return (value is None or (hasattr(value, "__len__") and len(value) == 0)) == arg
    raise ChecklistError(f"unknown expectation {op!r}")


def describe_expect(expect: Any) -> str:
    if not isinstance(expect, dict):
        return f"equals {expect!r}"
    (op, arg), = expect.items()
    return {"equals": f"equals {arg!r}", "not_equals": f"differs from {arg!r}", "one_of": f"is one of {arg!r}",
            "at_least": f"is at least {arg!r}", "at_most": f"is at most {arg!r}",
            "present": "is present" if arg else "is absent", "empty": "is empty" if arg else "is not empty"}[op]


def _short(value: Any, limit: int = 160) -> str:
    text = "missing" if value is _MISSING else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_fact(anatomy: dict[str, Any], fact: str, expect: Any) -> Outcome:
    values = fact_values(anatomy, fact)
    wanted = describe_expect(expect)
    if not values:
        return Outcome("fail", f"{fact}: no value to check (the list is empty); expected: {wanted}")
    bad = [(p, v) for p, v in values if not expect_holds(expect, v)]
    shown = "; ".join(f"{p} = {_short(v)}" for p, v in (bad or values)[:6])
    if bad:
        return Outcome("fail", f"{shown} (expected: {wanted})")
    return Outcome("pass", f"{shown} ({wanted})")
