"""Fine-tuning: a new run that starts from the weights of an earlier run or model folder
(``--init-from``), on a text of its own, with a fresh optimizer and schedule.

The source's vocabulary is kept as it is, ids and all, so that its prompts still encode the
same; characters of the new text that it lacks are appended (in code-point order), with
new embedding and head rows: the mean of the existing characters' rows, and a head bias of
the rarest existing character's, so that a new character starts rare, not unknown or sure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from . import checkpoint
from .corpus import Corpus
from .errors import ChargenError
from .lines import LineItems
from .model import CharLSTM, ModelConfig
from .record import InitFrom
from .storage import load_tensors
from .tokenizer import SPECIALS, CharTokenizer, recode


@dataclass
class Source:
    """The run or model folder a fine-tuning starts from."""

    path: Path
    weights: Path
    model: ModelConfig
    tokenizer: CharTokenizer
    mode: str
    default_prime: str

    def record(self, new_chars: list[str]) -> InitFrom:
        """What ``config.json`` keeps of where the weights came from."""
        digest = hashlib.sha256(self.weights.read_bytes()).hexdigest()
        return InitFrom(str(self.path), self.weights.name, digest, "".join(new_chars))


def describe(record: InitFrom, model: ModelConfig, mode: str, resume: bool) -> str:
    """The start-up line of a fine-tuning run."""
    new = record.new_chars
    chars = f"{len(new)} new character{'s' * (len(new) != 1)} given rows of their own: {new!r}" if new else \
        "no new characters"
    if resume:
        return f"fine-tuned from {record.path} ({record.weights}); {chars}"
    return (f"starting from {record.path} ({record.weights}): its {model.layers}x{model.hidden} weights in "
            f"{mode} mode, a fresh optimizer and schedule; {chars}")


def read_source(path: str | Path) -> Source:
    """The source folder's settings, vocabulary and best weights (the latest before any
    validation), checked as ``chargen sample`` would."""
    path = Path(path)
    if not path.is_dir():
        raise ChargenError(f"--init-from {path}: no such run or model folder; give a folder 'chargen train' "
                           "or 'chargen export' wrote (for example models/shakespeare)")
    folder = checkpoint.read_folder(path)
    return Source(path, folder.weights, folder.record.model, folder.tokenizer, folder.record.mode.name,
                  folder.record.default_prime)


def model_for(source: Source, asked: ModelConfig | None, mode: str, vocab_size: int) -> ModelConfig:
    """The new run's model: the source's shape, with the merged vocabulary and the dropout
    asked for (None: chosen for the run); a different mode or shape is refused."""
    if mode != source.mode:
        raise ChargenError(f"--init-from {source.path} was trained in {source.mode} mode and this text is read "
                           f"in {mode} mode; pass --mode {source.mode}, or train this text from scratch")
    if asked is not None:
        for name in ("hidden", "layers", "embedding"):
            if getattr(asked, name) != getattr(source.model, name):
                raise ChargenError(f"--{name} {getattr(asked, name)} differs from --init-from {source.path}'s "
                                   f"{getattr(source.model, name)}; drop --{name} to fine-tune it")
    return replace(source.model, vocab_size=vocab_size, dropout=asked.dropout if asked else None)


def merged_tokenizer(source: CharTokenizer, text: CharTokenizer) -> tuple[CharTokenizer, list[str]]:
    """The source's vocabulary with the text's new characters appended; and those."""
    new = sorted(set(text.chars) - set(source.chars))
    return CharTokenizer([*source.chars, *new]), new


def adopt_vocabulary(corpus: Corpus, tokenizer: CharTokenizer) -> Corpus:
    """``corpus`` with its ids recoded, in place where the id type allows, to ``tokenizer``,
    which must hold every character of the corpus (a fine-tuned run's vocabulary)."""
    missing = set(corpus.tokenizer.chars) - set(tokenizer.chars)
    if missing:
        raise ChargenError(f"the run's vocabulary lacks {len(missing)} characters of this text "
                           f"({''.join(sorted(missing))[:20]!r}); resume with the run's own text")
    if corpus.tokenizer.chars == tokenizer.chars:
        return corpus
    table = corpus.tokenizer.recode_table(tokenizer)
    arrays: dict[int, np.ndarray] = {}  # (train and validation items may share one array)

    def recoded(ids: np.ndarray | None) -> np.ndarray | None:
        if ids is None:
            return None
        if id(ids) not in arrays:
            if ids.dtype.itemsize < tokenizer.dtype.itemsize:
                arrays[id(ids)] = table[ids]  # (a wider id type: a new array)
            else:
                recode(ids, table)
                arrays[id(ids)] = ids
        return arrays[id(ids)]

    def items(line_items: LineItems | None) -> LineItems | None:
        if line_items is None:
            return None
        return LineItems(recoded(line_items.ids), line_items.starts, line_items.n_chars)

    return replace(corpus, tokenizer=tokenizer, train_ids=recoded(corpus.train_ids), val_ids=recoded(corpus.val_ids),
                   train_items=items(corpus.train_items), val_items=items(corpus.val_items))


@torch.no_grad()
def load_source_weights(model: CharLSTM, source: Source) -> None:
    """The source's weights into ``model``, whose vocabulary extends the source's: the old
    ids' rows as they are, each new one the mean of the old characters' rows, with the
    rarest old character's head bias."""
    tensors, _ = load_tensors(source.weights, source.path)
    checkpoint.check_finite(tensors, source.weights)
    old, chars = source.model.vocab_size, slice(len(SPECIALS), source.model.vocab_size)
    current = model.state_dict()
    if set(tensors) != set(current):
        raise ChargenError(f"{source.weights} does not fit its own config.json; retrain or restore that run")
    state = {}
    for name, value in tensors.items():
        if name in VOCAB_ROWS:
            grown = current[name].detach().cpu().clone()
            grown[:old] = value
            grown[old:] = value[chars].min() if name == "head.bias" else value[chars].mean(dim=0)
            value = grown
        state[name] = value
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError:
        raise ChargenError(f"{source.weights} does not fit its own config.json; retrain or restore that run") from None


VOCAB_ROWS = ("embed.weight", "head.weight", "head.bias")  # a row per id
