"""Field types of the settings dataclasses, checked when one is made: from flags, from the
API or from a hand-edited config.json, a wrong type is one line naming the field, never a
TypeError deep inside torch."""

from __future__ import annotations

import functools
import math
import types
import typing
from dataclasses import fields

from .errors import ChargenError

MAX_SEED = 2**32 - 1  # one seed domain for training, sampling, the app and the page: what every generator takes
TYPE_NAMES = {int: "a whole number", float: "a number", bool: "true or false", str: "a string", type(None): "null"}


@functools.cache
def _hints(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field's accepted types: ``float | None`` -> (float, NoneType)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        hint = hints[f.name]
        out[f.name] = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return out


def fits(value: object, kind: type) -> bool:
    if kind is float:  # a whole number is a number; a bool is not (NaN and infinity: check_finite)
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in TYPE_NAMES:
        return isinstance(value, kind)
    return True  # (a field of another type is checked by its own class)


def check_field_types(obj: object) -> None:
    """Refuse a field of ``obj`` (a dataclass whose fields are int, float, bool, str or
    None, or unions of them) that holds a value of another type."""
    for name, kinds in _hints(type(obj)).items():
        value = getattr(obj, name)
        if not any(fits(value, kind) for kind in kinds):
            wanted = " or ".join(TYPE_NAMES.get(kind, kind.__name__) for kind in kinds)
            raise ChargenError(f"{name} must be {wanted}, not {short(value)}")


def check_finite(obj: object) -> None:
    """Refuse NaN or infinity in a number field of ``obj`` that its own range checks let
    through (run after them, so that a value out of range is named with its range)."""
    for name in _hints(type(obj)):
        value = getattr(obj, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ChargenError(f"{name} must be a finite number, not {value}")


def check_seed(seed: int | None) -> None:
    """A sampling seed: None (random), or a whole number that every generator takes as it
    is, so that two different seeds never draw the same text."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED):
        raise ChargenError(f"the seed must be a whole number from 0 to {MAX_SEED:,}, not {short(seed)}")


def short(value: object, limit: int = 40) -> str:
    """``value`` as JSON-ish text, cut to ``limit`` characters (a value may be huge)."""
    text = repr(value) if not isinstance(value, list | dict) else type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
