"""Hostile model folders (issue 29): a tiny model folder's config.json with one field set to
an arbitrary JSON value (or removed), then loaded, sampled, given a card and a web page, as
``chargen sample``, ``export`` and ``export --web`` would. A case passes if that works or
stops with a one-line ``ChargenError`` that names config.json; anything else is a crash.

    python -m benchmarks.folder_fuzz --cases 1000       # about 45 s on 2 cores

The tally groups the refusals by their message, with paths, numbers and quoted values as #.
The field walking and the folder's use here are also tests/test_hostile_folders.py's.
"""

from __future__ import annotations

import collections
import copy
import json
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path

import chargen
from benchmarks.common import ROOT, command_line
from chargen.card import card_text
from chargen.export import export_model
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


VALUES = [None, True, False, 0, -1, 1, 2**70, -(2**70), 0.5, 512.5, 1e308, float("nan"), float("inf"), "", "x",
          "stream", "lines", "fp32", [], ["x"], {}, {"a": 1}]


def any_value(rng: random.Random, depth: int = 0) -> object:
    """A JSON value: one of VALUES, a random number or string, or a small list or object."""
    kind = rng.randrange(5 if depth < 2 else 3)
    if kind == 0:
        return rng.choice(VALUES)
    if kind == 1:
        return rng.choice([rng.randint(-10**6, 10**6), rng.uniform(-1e6, 1e6)])
    if kind == 2:
        return "".join(rng.choice("ab\n\x00é🙂") for _ in range(rng.randrange(6)))
    if kind == 3:
        return [any_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice("abc"): any_value(rng, depth + 1) for _ in range(rng.randrange(3))}


def changed(config: dict, path: tuple, rng: random.Random) -> dict:
    return with_field(config, path, REMOVED if rng.random() < 0.2 else any_value(rng))


def try_folder(folder: Path) -> str | None:
    """None if the folder loads and serves; else the one-line refusal."""
    try:
        use_folder(folder)
    except chargen.ChargenError as e:
        if "\n" in str(e) or "config.json" not in str(e):
            raise
        return str(e)
    return None


def shape(message: str) -> str:
    message = re.sub(r"\S*config\.json", "#", message)
    message = re.sub(r"'[^']*'|\"[^\"]*\"|-?\d[\d,.e+-]*|\bnan\b|\binf\b", "#", message)
    return message[:100]


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, work = random.Random(args.seed), Path(tempfile.mkdtemp(prefix="chargen-folder-fuzz-"))
    try:
        text = work / "text.txt"
        text.write_text((ROOT / "corpora" / "shakespeare.txt").read_text(encoding="utf-8")[:60_000])
        chargen.train(chargen.load_corpus(text), work / "run", chargen.ModelConfig(embedding=8, hidden=24),
                      chargen.TrainConfig(steps=4, eval_every=4, batch_size=4, bptt=16, sample_chars=0,
                                          device="cpu"))
        source = export_model(work / "run", work / "model")
        original, folder = json.loads((source / "config.json").read_text()), work / "case"
        shutil.copytree(source, folder)
        outcomes, refusals, paths = collections.Counter(), collections.Counter(), field_paths(original)
        for _ in range(args.cases):
            config = changed(original, rng.choice(paths), rng)
            (folder / "config.json").write_text(json.dumps(config, allow_nan=True))
            try:
                refusal = try_folder(folder)
            except Exception as e:  # (what this counts)
                outcomes["crashed (any other exception)"] += 1
                print(f"crash: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            outcomes["loaded, sampled, card and page written" if refusal is None else
                     "refused with a one-line error naming config.json"] += 1
            if refusal is not None:
                refusals[shape(refusal)] += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.cases:,} cases over {len(paths)} fields (sections included), seed {args.seed}\n\n"
          "| outcome | cases |\n| --- | ---: |")
    for name in ("loaded, sampled, card and page written", "refused with a one-line error naming config.json",
                 "crashed (any other exception)"):
        print(f"| {name} | {outcomes[name]} |")
    print("\n| refusal (paths, numbers and values as #) | cases |\n| --- | ---: |")
    for message, count in refusals.most_common(15):
        print(f"| {message} | {count} |")


if __name__ == "__main__":
    main()
