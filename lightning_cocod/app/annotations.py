"""Config values against a signature's type annotations (``Trainer(precision=...)`` and the like).

A config holds only YAML values: None, bool, int, float, str, lists and mappings. An annotation
naming a class (a Logger, a Profiler) is met by a mapping with ``_target_``, which Hydra builds;
an annotation this module does not understand accepts anything and leaves the check to the
callee.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin


def _literals(annotation: Any) -> list[Any] | None:
    """The values of a Literal, or of a union of Literals and None; None for anything else."""
    origin = get_origin(annotation)
    if annotation is type(None):
        return [None]
    if origin is Literal:
        return list(get_args(annotation))
    if origin in (Union, types.UnionType):
        parts = [_literals(a) for a in get_args(annotation)]
        return None if any(p is None for p in parts) else [v for p in parts for v in p]
    return None


def accepts(annotation: Any, value: Any) -> bool:
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin in (Union, types.UnionType):
        return any(accepts(a, value) for a in args)
    if origin is Literal:
        # type() too: True == 1 and 16 == 16.0, but neither is a precision Lightning knows.
        return any(value == a and type(value) is type(a) for a in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, Sequence, Iterable):
        return isinstance(value, (list, tuple)) and (not args or all(accepts(args[0], v) for v in value))
    if origin in (dict, Mapping):
        return isinstance(value, dict)
    if isinstance(annotation, type):
        return isinstance(value, annotation) or (isinstance(value, dict) and "_target_" in value)
    return True


def describe(annotation: Any) -> str:
    """What ``annotation`` accepts, in the words of a config: "an integer or null", "one of ..."."""
    literals = _literals(annotation)
    if literals is not None:
        named = [("null" if v is None else repr(v)) for v in literals]
        return "one of " + ", ".join(named) if len(named) > 1 else named[0]
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        parts = list(dict.fromkeys(describe(a) for a in get_args(annotation)))
        if "a number" in parts and "an integer" in parts:  # a number includes the integers
            parts.remove("an integer")
        return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]
    if annotation is type(None):
        return "null"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if annotation in names:
        return names[annotation]
    if origin in (list, tuple, Sequence, Iterable):
        return "a list"
    if origin in (dict, Mapping):
        return "a mapping"
    return f"a {getattr(annotation, '__name__', annotation)} (a node with _target_)"
