"""The checks every class makes of the options it is given, with one message style::

    CoCoDStrategy: tau=2.5 is invalid; accepted: a positive integer or "auto"

Each check returns the value it accepted, so a constructor reads ``self.tau = positive_int(...)``.
A bool is never a number here (``True`` would silently mean 1), and a number must be finite and
fit a float (``10**400`` would fail later, in arithmetic, naming nothing). Standard library only,
so ``core`` and the app's config checks can use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def invalid(
    owner: str, option: str, value: Any, accepted: str, error: type[Exception] = ValueError
) -> Exception:
    """The one-line error of an option refused: the owner, the option, the value, what is accepted."""
    return error(f"{owner}: {option}={value!r} is invalid; accepted: {accepted}")


def require(ok: bool, owner: str, option: str, value: Any, accepted: str) -> None:
    """Refuse ``value`` unless ``ok``: for a rule the checks below do not state."""
    if not ok:
        raise invalid(owner, option, value, accepted)


def is_number(value: Any) -> bool:
    """A finite int or float that fits a float; not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def boolean(owner: str, option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(owner, option, value, "True or False", TypeError)
    return value


def positive_int(owner: str, option: str, value: Any, accepted: str = "a positive integer") -> int:
    if not is_int(value) or value < 1:
        raise invalid(owner, option, value, accepted)
    return value


def count(owner: str, option: str, value: Any) -> int:
    """An integer >= 0 (steps taken, rounds seen)."""
    if not is_int(value) or value < 0:
        raise invalid(owner, option, value, "an integer >= 0")
    return value


def number(
    owner: str,
    option: str,
    value: Any,
    accepted: str,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> float:
    """A finite number within the bounds given (``above`` is exclusive, the others inclusive)."""
    ok = is_number(value) and not (
        (above is not None and value <= above)
        or (at_least is not None and value < at_least)
        or (at_most is not None and value > at_most)
    )
    if not ok:
        raise invalid(owner, option, value, accepted)
    return float(value)


def one_of(owner: str, option: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    # By equality and type: 1 == True, and a bool is not the integer choice it equals.
    if not any(value == c and type(value) is type(c) for c in choices):
        raise invalid(owner, option, value, "one of " + ", ".join(map(repr, choices)))
    return value
