"""Typed settings: a config section is a dataclass whose fields are declared with :func:`setting`, which gives each
one its default, its one-line meaning and what values it allows (its type from the annotation, a least and a
greatest value, or a list of choices). :func:`check_value` holds a value to all of that; the config loader
(:mod:`captioner.config`) calls it for every value a file or an override sets, so a wrong value is one line
naming the setting before anything runs.

A leaf module: the sections live beside the code that reads them (``EncoderConfig`` in the encoder, each
decoder's settings in its module), and all of them declare their fields through this one helper.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Sequence

from captioner.errors import CaptionerError


def setting(default, meaning: str, *, minimum: float | None = None, maximum: float | None = None,
            above: float | None = None, below: float | None = None, choices: Sequence | None = None,
            affects_results: bool = True):
    """A dataclass field that is a user setting: ``default``, its one-line ``meaning`` (the configuration
    reference prints it), and its bounds: ``minimum``/``maximum`` inclusive, ``above``/``below`` exclusive, or the
    allowed ``choices``. ``affects_results=False`` marks a path, an output or a log setting, which no number a run
    produces depends on (a result does not record it: :mod:`captioner.results`). A list or dict default is copied
    for each instance."""
    metadata = {"meaning": meaning, "minimum": minimum, "maximum": maximum, "above": above, "below": below,
                "choices": None if choices is None else tuple(choices), "affects_results": affects_results}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def settings_of(cls) -> dict[str, dataclasses.Field]:
    """The setting fields of a section dataclass (those declared with :func:`setting`), by name."""
    return {f.name: f for f in dataclasses.fields(cls) if "meaning" in f.metadata}


def default_of(field: dataclasses.Field):
    """A fresh copy of ``field``'s default."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return copy.deepcopy(field.default)


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def kind_of(cls, name: str):
    """The annotated type of setting ``name`` of section ``cls`` (``int``, ``str | None``, ``list[str]`` ...)."""
    return _hints(cls)[name]


def matches_kind(value, kind) -> bool:
    """Whether ``value`` (as YAML reads it) is of type ``kind``: a bool is not a number, an int is a float."""
    if kind is typing.Any:
        return True
    if kind is type(None):
        return value is None
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return any(matches_kind(value, k) for k in typing.get_args(kind))
    origin = typing.get_origin(kind)
    if origin in (list, tuple):
        args = typing.get_args(kind)
        item = args[0] if args else typing.Any
        return isinstance(value, (list, tuple)) and all(matches_kind(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(kind) or (typing.Any, typing.Any)
        return isinstance(value, dict) and all(matches_kind(k, key) and matches_kind(v, item) for k, v in value.items())
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def describe_kind(kind) -> str:
    """``kind`` in words, as an error message says what a setting takes."""
    if kind is type(None):
        return "null"
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        names = [describe_kind(k) for k in typing.get_args(kind)]
        return ", ".join(names[:-1]) + " or " + names[-1]
    origin = typing.get_origin(kind)
    if origin in (list, tuple):
        args = typing.get_args(kind)
        return f"a list of {describe_kind(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if origin is dict:
        return "a mapping"
    return {bool: "true or false", int: "a whole number", float: "a number", str: "text"}.get(kind, f"a {kind.__name__}")


def _shown(choice) -> str:
    return str(choice).lower() if isinstance(choice, bool) or choice is None else str(choice)


def allowed(field: dataclasses.Field, kind) -> str:
    """What ``field`` allows, in words: its choices, or its type and bounds."""
    meta = field.metadata
    if meta.get("choices"):
        names = [_shown(c) for c in meta["choices"]]
        return " | ".join(names)
    bounds = []
    if meta.get("minimum") is not None:
        bounds.append(f">= {meta['minimum']}")
    if meta.get("above") is not None:
        bounds.append(f"> {meta['above']}")
    if meta.get("maximum") is not None:
        bounds.append(f"<= {meta['maximum']}")
    if meta.get("below") is not None:
        bounds.append(f"< {meta['below']}")
    return ", ".join([describe_kind(kind).removeprefix("a ")] + bounds)


def check_value(cls, name: str, value, where: str | None, dotted: str):
    """``value`` for setting ``name`` of section ``cls`` (called ``dotted`` in messages) if its type, choices and
    bounds allow it, else a :class:`CaptionerError` ``"{where}: {dotted} must be ..., got ..."`` (without
    ``where``: from ``dotted`` on). A number written as text for a float setting (YAML reads ``1e-4`` as text) is
    read as the number."""
    where = f"{where}: " if where else ""
    field, kind = settings_of(cls)[name], kind_of(cls, name)
    meta = field.metadata
    if meta.get("choices"):
        choices = meta["choices"]
        if not any(value is c if isinstance(c, bool) or c is None else (value == c and not isinstance(value, bool))
                   for c in choices):
            names = [_shown(c) for c in choices]
            raise CaptionerError(f"{where}{dotted} must be {', '.join(names[:-1])} or {names[-1]}, got {value!r}")
        return value
    if isinstance(value, str) and matches_kind(0.5, kind) and not matches_kind(value, kind):
        try:
            value = float(value)
        except ValueError:
            pass
    if not matches_kind(value, kind):
        raise CaptionerError(f"{where}{dotted} must be {describe_kind(kind)}, got {value!r}")
    numbers = [v for v in (value if isinstance(value, (list, tuple)) else [value])
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for number in numbers:
        if meta.get("minimum") is not None and number < meta["minimum"]:
            raise CaptionerError(f"{where}{dotted} must be at least {meta['minimum']}, got {value!r}")
        if meta.get("above") is not None and number <= meta["above"]:
            raise CaptionerError(f"{where}{dotted} must be above {meta['above']}, got {value!r}")
        if meta.get("maximum") is not None and number > meta["maximum"]:
            raise CaptionerError(f"{where}{dotted} must be at most {meta['maximum']}, got {value!r}")
        if meta.get("below") is not None and number >= meta["below"]:
            raise CaptionerError(f"{where}{dotted} must be below {meta['below']}, got {value!r}")
    return value


def check_settings(section, prefix: str) -> None:
    """Every setting of the section instance ``section`` (called ``prefix.NAME`` in messages) against its type,
    choices and bounds: what a config file's values go through at load, for a section built in Python."""
    for name in settings_of(type(section)):
        check_value(type(section), name, getattr(section, name), None, f"{prefix}.{name}")
