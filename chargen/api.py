"""A trained run, loaded for use: ``chargen.load(RUN_DIR)``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch

from . import checkpoint
from .device import resolve_device
from .errors import ChargenError
from .model import CharLSTM, ModelConfig
from .sample import sample_text
from .tokenizer import CharTokenizer
from .train import LN2, eval_streams, evaluate


class TrainedModel:
    """A model with its tokenizer and run config, ready to sample from or evaluate."""

    def __init__(self, model: CharLSTM, tokenizer: CharTokenizer, config: dict, run_dir: Path) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config
        self.run_dir = run_dir
        self.default_prime: str = config.get("default_prime") or tokenizer.chars[0]

    @property
    def device(self) -> torch.device:
        return self.model.head.weight.device

    def stream_batch(
        self,
        prime: str = "",
        length: int = 500,
        *,
        num_samples: int = 1,
        temperature: float = 0.8,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Iterator[list[str]]:
        """Yields, for each step, the new character of each of ``num_samples`` samples,
        all drawn in parallel as one batch."""
        # An empty prime feeds the run's default (a newline for most texts), not shown.
        return sample_text(self.model, self.tokenizer, prime or self.default_prime, length, num_samples=num_samples,
                               temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

    def stream(self, prime: str = "", length: int = 500, **options) -> Iterator[str]:
        """Yields the continuation of ``prime`` a character at a time (for live display)."""
        return (pieces[0] for pieces in self.stream_batch(prime, length, num_samples=1, **options))

    def generate_batch(self, prime: str = "", length: int = 500, *, num_samples: int = 1, **options) -> list[str]:
        """``num_samples`` continuations of ``prime`` (the prime itself not included)."""
        texts = [[] for _ in range(num_samples)]
        for pieces in self.stream_batch(prime, length, num_samples=num_samples, **options):
            for text, piece in zip(texts, pieces, strict=True):
                text.append(piece)
        return ["".join(t) for t in texts]

    def generate(self, prime: str = "", length: int = 500, **options) -> str:
        """One continuation of ``prime`` (the prime itself not included)."""
        return self.generate_batch(prime, length, num_samples=1, **options)[0]

    def evaluate(self, text: str) -> dict:
        """Loss (nats/char) and bits per character of the model on ``text``."""
        ids = self.tokenizer.encode_known(text, "evaluation text")
        if len(ids) < 2:
            raise ChargenError("the evaluation text needs at least 2 characters")
        loss = evaluate(self.model, eval_streams(ids, self.device))
        return {"loss": loss, "bpc": loss / LN2, "chars": len(ids)}


def load(run_dir: str | os.PathLike, device: str = "auto", weights: str = "best") -> TrainedModel:
    """Load a run folder written by ``chargen train``. ``weights`` is ``best`` (by
    validation; the default) or ``latest``."""
    run_dir = Path(run_dir)
    config = checkpoint.read_config(run_dir)
    tokenizer = checkpoint.read_tokenizer(run_dir)
    try:
        model_config = ModelConfig.from_dict(config["model"])
    except (TypeError, ChargenError) as e:
        raise ChargenError(f"{run_dir / checkpoint.CONFIG} has a bad model section ({e})") from None
    if model_config.vocab_size != tokenizer.vocab_size:
        raise ChargenError(f"{run_dir}: config.json and tokenizer.json disagree on the vocabulary size")
    model = CharLSTM(model_config)
    checkpoint.load_weights(model, checkpoint.weights_path(run_dir, weights))
    return TrainedModel(model.to(resolve_device(device)), tokenizer, config, run_dir)
