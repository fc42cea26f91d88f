"""The model card: a README.md for a model folder (``chargen export`` writes it), so that a
model pushed to a Hugging Face repository of its own shows a proper page: the Hub's front
matter (library, licence, tags, the corpus with its hash, the validation bits per character
as a metric), the command that trains it again, a sample, and how to load it.
``chargen.load`` reads only config.json, tokenizer.json and the weights: the card is for
people and the Hub.

    python -m chargen.card models/shakespeare     # (re)write a model folder's card
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import checkpoint
from .checkpoint import CARD
from .errors import ChargenError
from .storage import atomic_write

if TYPE_CHECKING:
    from .api import TrainedModel
    from .record import RunRecord

LICENSE = "mit"  # chargen's; the corpus's own terms are the corpus's
TAGS = ["char-level", "lstm", "text-generation"]


def training_command(record: RunRecord) -> str:
    """``chargen train`` with the settings config.json records: it trains the model again."""
    model, train = record.model, record.train
    flags = [f"--mode {record.mode.name}", f"--hidden {model.hidden}", f"--layers {model.layers}",
             f"--embedding {model.embedding}", f"--dropout {model.dropout or 0:g}",
             f"--weight-decay {train.weight_decay or 0:g}", f"--batch-size {train.batch_size}",
             f"--seed {train.seed}"]
    flags.insert(6, f"--bucket-factor {train.bucket_factor}" if record.mode.items else f"--bptt {train.bptt}")
    if train.base_lr is not None:  # (a record without one: chargen decides again, as it did)
        flags.insert(-1, f"--base-lr {train.base_lr:g}")
    if train.max_time:
        flags.append(f"--max-time {train.max_time:g}")
    for name in ("epochs", "steps"):
        if getattr(train, name):
            flags.append(f"--{name} {getattr(train, name):g}")
    if train.init_from:
        flags.append(f"--init-from {Path(train.init_from).name}")
    return f"chargen train {record.corpus.shown} " + " ".join(flags)


def sample_of(model: TrainedModel) -> str:
    if model.kind.items:
        return "\n".join(model.generate_batch("", 40, num_samples=8, seed=0))
    return model.generate("", 400, seed=0)


def card_text(model: TrainedModel, name: str) -> str:
    """The card of ``model``, to be the README.md of its folder, named ``name``."""
    record = model.record
    corpus, bpc = record.corpus, record.summary.best_val_bpc
    front = ["---", "library_name: chargen", f"license: {LICENSE}", "tags:", *[f"- {tag}" for tag in TAGS],
             "pipeline_tag: text-generation", f"corpus: {json.dumps(corpus.shown)}",
             f"corpus_sha256: {json.dumps(corpus.sha256)}"]
    if bpc is not None:
        front += ["model-index:", f"- name: {json.dumps(name)}", "  results:", "  - task:",
                  "      type: text-generation", "    dataset:", f"      name: {json.dumps(corpus.name)}",
                  "      type: text", "    metrics:", "    - type: bpc", f"      value: {bpc:.4f}",
                  "      name: validation bits per character"]
    front.append("---")
    use = [
        "## Use", "", "With chargen installed (from its repository: `pip install -e .`), and this folder as "
        f"`{name}/`:", "", "```sh", f"chargen sample {name} --length 300", "```", "",
        "```python", "import chargen", "", f'model = chargen.load("{name}")',
        'print(model.generate_batch("", length=40, num_samples=10))' if record.mode.items else
        'print(model.generate("", length=300))', "```", "",
        "`chargen.load` reads `config.json`, `tokenizer.json` and `model.safetensors`; this card is for people.", "",
    ]
    return "\n".join(front + [""] + about(model, name) + use)


def about(trained: TrainedModel, name: str) -> list[str]:
    """The card's title, description, training command and sample."""
    record = trained.record
    model, corpus, summary = record.model, record.corpus, record.summary
    bpc = summary.best_val_bpc
    shape = f"{model.layers}x{model.hidden}, embedding {model.embedding}, dropout {model.dropout or 0:g}"
    measured = f"**{bpc:.4f} bits per character** on its validation text" if bpc is not None else \
        "no validation loss recorded"
    return [
        f"# {name}", "",
        f"A character-level LSTM ({shape}; {record.parameters:,} parameters, vocabulary "
        f"{model.vocab_size}) trained with chargen in {record.mode.name} mode on `{corpus.shown}` "
        f"({corpus.chars:,} characters, SHA-256 `{corpus.sha256}`): {measured}"
        + (f", after {summary.step:,} steps." if summary.step else "."), "",
        "## Training", "", "```sh", training_command(record), "```", "",
        "## A sample", "", "Drawn with seed 0 at temperature 0.8 when this card was written:", "", "```",
        sample_of(trained), "```", "",
    ]


def web_card_text(model: TrainedModel, name: str, dtype: str) -> str:
    """The card of a page exported with ``--web``: a static Hugging Face Space's front
    matter, and how the page relates to chargen."""
    front = ["---", f"title: {json.dumps('chargen: ' + name)}", "emoji: 🔡", "colorFrom: gray", "colorTo: blue",
             "sdk: static", "app_file: index.html", f"license: {LICENSE}", "tags:", *[f"- {tag}" for tag in TAGS],
             f"short_description: {json.dumps('A character-level LSTM that runs in your browser')}", "---"]
    exact = "the same characters as" if dtype == "float32" else "(with these float16 weights) nearly always the " \
        "same characters as"
    page = [
        "## This page", "",
        "`index.html` samples the model in the visitor's browser (WebAssembly, or plain JavaScript where "
        "WebAssembly SIMD is missing): no server computes anything, and the page fetches nothing but "
        f"`model.json` and `weights.bin` ({dtype}) beside it. Serve the folder with any static host, or "
        "locally with `python -m http.server` in it.", "",
        f"For the same seed it draws {exact} `chargen sample MODEL_DIR --rng portable --seed SEED` on the "
        "model it was exported from (the page shows that command under each text).", "",
    ]
    return "\n".join(front + [""] + about(model, name) + page)


def write_card(model_dir: str | Path) -> Path:
    """Write (or replace) the card of a model folder (one whose record says it is an
    exported model: a run's folder gets none); its path."""
    from .api import load

    model_dir = Path(model_dir)
    if checkpoint.describe_folder(model_dir) != "model":
        raise ChargenError(f"{model_dir} is not an exported model folder; export one with 'chargen export RUN_DIR "
                           "MODEL_DIR', which writes its card")
    path = model_dir / CARD
    atomic_write(path, card_text(load(model_dir, device="cpu"), model_dir.resolve().name).encode("utf-8"))
    return path


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m chargen.card MODEL_DIR [MODEL_DIR ...]", file=sys.stderr)
        return 2
    try:
        for folder in argv:
            print(f"wrote {write_card(folder)}")
    except ChargenError as e:
        print(f"chargen: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
