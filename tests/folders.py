"""A config.json changed field by field, and a folder used as the commands use it: for the
hostile-folder tests and benchmarks/folder_fuzz.py."""

from __future__ import annotations

import copy
from pathlib import Path

import chargen
from chargen.card import card_text
from chargen.web import page_files

REMOVED = object()  # with_field's value that removes the field


def field_paths(config: dict, prefix: tuple = ()) -> list[tuple[str, ...]]:
    """Every field of ``config``, sections and the fields inside them, as key paths."""
    paths = []
    for key, value in config.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths += field_paths(value, (*prefix, key))
    return paths


def with_field(config: dict, path: tuple[str, ...], value: object) -> dict:
    """A copy of ``config`` with the field at ``path`` set to ``value`` (or REMOVED)."""
    config = copy.deepcopy(config)
    where = config
    for key in path[:-1]:
        where = where[key]
    if value is REMOVED:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    return config


def use_folder(folder: Path) -> None:
    """What ``chargen sample``, ``export`` and ``export --web`` do with a folder: load it,
    sample, write its card and its page (in memory)."""
    model = chargen.load(folder, device="cpu")
    model.generate("", 5, seed=1)
    card_text(model, "x")
    page_files(model, "fp32", "x", card=False)
