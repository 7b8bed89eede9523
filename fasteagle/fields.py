"""Type checks for settings read from JSON (a training config, a drafter's config.json): each value
against its dataclass field's annotation, so that a wrong type is one clear error up front rather
than a traceback wherever the value is first used."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping

from fasteagle.errors import FastEagleError

_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}


def fits(value, hint) -> bool:
    """Whether `value` (as JSON gives it) is of the annotated type; an int passes for a float, a bool
    for neither. Annotations other than these simple ones are not checked."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, h) for h in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (typing.Any,)
        return isinstance(value, list) and all(fits(v, item) for v in value)
    if hint is bool or hint is type(None) or hint is str:
        return isinstance(value, hint)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def describe(hint) -> str:
    """The annotated type in words: "an integer or null", "a list of integers"."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(h) for h in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (typing.Any,)
        return "a list" + (f" of {describe(item).split(' ', 1)[-1]}s" if item in _NAMES else "")
    return _NAMES.get(hint, str(hint))


def check_types(cls, values: Mapping, what: str) -> None:
    """Refuse the first of `values` (field name -> value) whose type does not fit field `cls.<name>`;
    names that are not fields of `cls` are left alone."""
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if name in hints and not fits(value, hints[name]):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise FastEagleError(f"{what}: {name} must be {describe(hints[name])}, not {shown}")


def from_json(cls, raw, what: str):
    """An instance of the dataclass `cls` from a parsed JSON object, every value type-checked (keys that
    are not fields are ignored: a drafter's config.json also records how it was made)."""
    import dataclasses

    if not isinstance(raw, dict):
        raise FastEagleError(f"{what} must be a JSON object ({{\"name\": value, ...}}), not a {type(raw).__name__}")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in fields}
    values = {k: v for k, v in raw.items() if k in names}
    check_types(cls, values, what)
    missing = [f.name for f in fields if f.name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise FastEagleError(f"{what}: {missing[0]} is missing")
    return cls(**values)
