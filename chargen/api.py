"""A trained run, loaded for use: ``chargen.load(RUN_DIR)``."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from . import checkpoint
from .corpus import eval_streams
from .device import resolve_device
from .errors import ChargenError
from .evaluate import bpc, evaluate_items, evaluate_streams
from .lines import file_items, item_tokenizer, known_items, read_item_hashes
from .model import CharLSTM, LeanStep
from .modes import ModeName
from .portable import RNGS, PortableModel, PortableSampler
from .record import RunRecord
from .sample import DEFAULTS, LEAN_MAX_SAMPLES, Sampler, collect
from .textfile import encode_file, scan_text, tokenizer_for
from .tokenizer import CharTokenizer, recode, unknown_chars_error


class TrainedModel:
    """A model with its tokenizer and run config, ready to sample from or evaluate."""

    def __init__(self, model: CharLSTM, tokenizer: CharTokenizer, record: RunRecord, run_dir: Path) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.record = record
        self.run_dir = run_dir
        self.kind = record.mode
        self.mode: ModeName = self.kind.name
        # Lines mode starts every item from <bos>: no prime needed.
        self.default_prime: str = "" if self.kind.items else record.default_prime or tokenizer.chars[0]
        self._item_hashes: torch.Tensor | None = None
        self._step: LeanStep | None = None  # built once: every sampler shares it
        self._portable: PortableModel | None = None

    @property
    def device(self) -> torch.device:
        return self.model.head.weight.device

    def stream_batch(
        self,
        prime: str = "",
        length: int = DEFAULTS.length,
        *,
        num_samples: int = 1,
        temperature: float = DEFAULTS.temperature,
        top_k: int = DEFAULTS.top_k,
        top_p: float = DEFAULTS.top_p,
        seed: int | None = None,
        rng: str = "torch",
    ) -> Iterator[list[str]]:
        """Yields the prime of each of ``num_samples`` samples (where there is one), then
        for each step the new character of each, all drawn in parallel as one batch: a
        sample is its prime and then ``length`` characters drawn, as the CLI and the app show
        it. In lines mode ``prime`` starts each item and ``length`` caps what is drawn; a
        sample that has reached its end yields "". ``rng``: ``portable`` draws the text
        that the page of ``chargen export --web`` draws for the same seed
        (chargen.portable). The prime and options are checked now, not at the first step."""
        sampler = self.sampler(prime, num_samples=num_samples, seed=seed, rng=rng)
        steps = sampler.pieces(length, temperature, top_k, top_p)
        return itertools.chain([[prime] * num_samples], steps) if prime else steps

    def sampler(self, prime: str = "", *, num_samples: int = 1, seed: int | None = None, rng: str = "torch"
                ) -> Sampler | PortableSampler:
        """A ``Sampler`` started from ``prime``: call its ``pieces`` to draw text, and again
        to continue from where it stopped. Its pieces are only what it draws (the prime is
        not among them), so that Continue adds to a text without repeating it."""
        # An empty prime feeds the run's default (a newline for most texts; in lines mode
        # nothing: items start from <bos>), not shown.
        if rng not in RNGS:
            raise ChargenError(f"--rng is one of {', '.join(RNGS)}, not {rng!r}")
        if rng == "portable":
            return PortableSampler(self.portable(), self.tokenizer, prime or self.default_prime,
                                   num_samples=num_samples, seed=seed, items=self.kind.items)
        step = self.stepper() if num_samples <= LEAN_MAX_SAMPLES else None
        return Sampler(self.model, self.tokenizer, prime or self.default_prime, num_samples=num_samples, seed=seed,
                       items=self.kind.items, step=step)

    def stepper(self) -> LeanStep:
        """The model's one-step forward for sampling, built once and shared."""
        if self._step is None:
            self._step = self.model.stepper()
        return self._step

    def portable(self) -> PortableModel:
        """The model in the portable arithmetic, built once."""
        if self._portable is None:
            self._portable = PortableModel(self.model)
        return self._portable

    def stream(self, prime: str = "", length: int = DEFAULTS.length, **options) -> Iterator[str]:
        """Yields ``prime`` (where given), then ``length`` characters drawn one at a time (for live display)."""
        return (pieces[0] for pieces in self.stream_batch(prime, length, num_samples=1, **options))

    def generate_batch(self, prime: str = "", length: int = DEFAULTS.length, *, num_samples: int = 1,
                       **options) -> list[str]:
        """``num_samples`` samples, each ``prime`` followed by up to ``length`` characters drawn."""
        return collect(self.stream_batch(prime, length, num_samples=num_samples, **options), num_samples)

    def is_training_item(self, items: list[str]) -> list[bool]:
        """Lines mode: for each item, whether it is in the training list verbatim."""
        if self._item_hashes is None:
            self._item_hashes = read_item_hashes(self.run_dir / checkpoint.ITEMS, self.run_dir)
        return known_items(self._item_hashes, items)

    def generate(self, prime: str = "", length: int = DEFAULTS.length, **options) -> str:
        """One sample: ``prime`` followed by ``length`` characters drawn (fewer where an item ends)."""
        return self.generate_batch(prime, length, num_samples=1, **options)[0]

    def evaluate(self, text: str) -> dict:
        """Loss (nats/char) and bits per character of the model on ``text``; in lines mode
        on its items, counting each item's characters and its end."""
        text_tokenizer = CharTokenizer.from_text(text)
        return self._evaluate_ids(text_tokenizer.encode(text), text_tokenizer)

    def evaluate_file(self, path: str | os.PathLike, encoding: str = "utf-8", errors: str = "strict",
                      log: Callable[[str], None] | None = None) -> dict:
        """``evaluate`` on a file of any size: read in chunks, never held as one string.
        ``log`` hears, once the text is read and checked, what the (long) pass will score."""
        scan = scan_text(path, encoding, errors)
        file_tokenizer = tokenizer_for(scan)
        return self._evaluate_ids(encode_file(path, file_tokenizer, scan.n_chars, encoding, errors), file_tokenizer,
                                  log)

    def _evaluate_ids(self, ids: np.ndarray, text_tokenizer: CharTokenizer,
                      log: Callable[[str], None] | None = None) -> dict:
        """``ids`` are in the text's own vocabulary; they are recoded (in place) to the
        model's once every character is known to be in it."""
        items = None
        if self.kind.items:
            items = file_items(ids, text_tokenizer)
            if not len(items):
                raise ChargenError("the evaluation text has no non-blank lines")
            text_tokenizer = item_tokenizer(text_tokenizer, items)  # the items' characters only
        if unknown := [ch for ch in text_tokenizer.chars if ch not in self.tokenizer]:
            raise unknown_chars_error("evaluation text", unknown)
        recode(ids, text_tokenizer.recode_table(self.tokenizer))
        if items is None and len(ids) < 2:
            raise ChargenError("the evaluation text needs at least 2 characters")
        if log is not None:
            log(f"scoring {len(ids):,} characters in one pass of the model (about a minute for a few million on a "
                "CPU)")
        if items is not None:
            loss = evaluate_items(self.model, items)
            return {"loss": loss, "bpc": bpc(loss), "chars": int(items.lengths.sum()), "items": len(items)}
        loss = evaluate_streams(self.model, eval_streams(ids, self.device))
        return {"loss": loss, "bpc": bpc(loss), "chars": len(ids)}


def load(run_dir: str | os.PathLike, device: str = "auto", weights: str = "best") -> TrainedModel:
    """Load a run folder written by ``chargen train`` (or a model folder ``chargen export``
    wrote). ``weights`` is ``best`` (by validation; the default) or ``latest``. Every file
    is checked before it is used (chargen.checkpoint.read_folder)."""
    run_dir = Path(run_dir)
    target = resolve_device(device)
    folder = checkpoint.read_folder(run_dir, weights, target)
    model = CharLSTM(folder.record.model)
    checkpoint.load_weights(model, folder.weights, run_dir)
    return TrainedModel(model.to(target), folder.tokenizer, folder.record, run_dir)
