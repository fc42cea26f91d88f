"""Sampling: the LSTM state is carried, so each new character costs one step and the
growing text is never fed again."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .errors import ChargenError
from .model import CharLSTM, LeanStep, State
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, CharTokenizer


@dataclass(frozen=True)
class SamplingOptions:
    """How each next character is drawn, and how many. Its defaults are the defaults of the
    API, the CLI, the app and the samples shown during training: written here once."""

    temperature: float = 0.8  # 0 is greedy; higher is wilder
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    length: int = 500


DEFAULTS = SamplingOptions()

# Beyond these a request is a mistake, or a wait of hours: 10 M characters is about 20
# minutes of one sample on a small CPU, and a batch's texts are held in memory.
MAX_LENGTH = 10_000_000
MAX_SAMPLES = 10_000
MAX_BATCH_CHARS = 100_000_000


def check_sampling(temperature: float, top_k: int, top_p: float, length: int, num_samples: int) -> None:
    if not 0 <= temperature < math.inf:
        raise ChargenError(f"--temperature must be 0 or more (0 means greedy) and finite, not {temperature}")
    if top_k < 0:
        raise ChargenError(f"--top-k must be 0 (off) or more, not {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ChargenError(f"--top-p must be in (0, 1], not {top_p}")
    if not 0 <= length <= MAX_LENGTH:
        raise ChargenError(f"--length must be 0 to {MAX_LENGTH:,}, not {length}")
    if not 1 <= num_samples <= MAX_SAMPLES:
        raise ChargenError(f"--num-samples must be 1 to {MAX_SAMPLES:,}, not {num_samples}")
    if num_samples > 1 and length * num_samples > MAX_BATCH_CHARS:
        raise ChargenError(f"{num_samples:,} samples of {length:,} characters would hold "
                           f"{length * num_samples:,} characters; ask for at most {MAX_BATCH_CHARS:,} at once")


def pick_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Next ids (batch,) from logits (batch, vocab): greedy at temperature 0, otherwise
    a draw from the temperature-scaled distribution cut to the top k and top p."""
    logits = logits.float()
    if temperature < torch.finfo(logits.dtype).tiny:  # 0, or too small for float32 to tell from 0: greedy
        return logits.argmax(dim=-1)
    # Shifted so the likeliest is 0, and the temperature kept within float32: no temperature,
    # however small or large, makes an inf or a 0 x inf (and so a NaN softmax).
    temperature = min(temperature, torch.finfo(logits.dtype).max)
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the ones before it already cover top_p; the top one stays.
        drop = probs.cumsum(dim=-1) - probs >= top_p
        drop[:, 0] = False  # (a top_p below float32's smallest number compares as 0)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


LEAN_MAX_SAMPLES = 8  # up to this many samples at once, the lean step is the faster path


class Sampler:
    """``num_samples`` samples drawn in parallel as one batch. The LSTM state is carried
    from call to call, so ``pieces`` can be called again to continue every sample from
    where it stopped: the state is kept, the text is never fed again.

    With ``items`` (lines mode) every sample is an item started from ``<bos>`` and
    ``prime``; it ends at its ``<eos>`` and yields "" from then on."""

    def __init__(
        self,
        model: CharLSTM,
        tokenizer: CharTokenizer,
        prime: str,
        *,
        num_samples: int = 1,
        seed: int | None = None,
        items: bool = False,
        lean: bool | None = None,
        step: LeanStep | None = None,
    ) -> None:
        if num_samples < 1:
            raise ChargenError(f"--num-samples must be at least 1, not {num_samples}")
        prime_ids = tokenizer.encode_known(prime, "prefix" if items else "prime text").tolist()
        if items:
            prime_ids = [BOS_ID, *prime_ids]
        if not prime_ids:
            raise ChargenError("sampling needs at least one prime character")
        self.model = model.eval()
        # After the prime, each character is one step. For a few samples a LeanStep draws the
        # same characters at up to 3x the speed of nn.LSTM (per-call overhead dominates);
        # from about 16 samples nn.LSTM's fused kernel is faster (benchmarks/sampling.py).
        # ``lean``: None chooses by that, True or False forces; ``step``: one built before
        # (it holds a copy of the weights).
        if lean is None:
            lean = num_samples <= LEAN_MAX_SAMPLES
        self._step = (step or model.stepper()) if lean else None
        self.num_samples = num_samples
        self.items = items
        self._drawn: list[list[str]] = [[] for _ in range(num_samples)]
        self.ended = [False] * num_samples
        self._chars = [""] * len(SPECIALS) + tokenizer.chars
        device = model.head.weight.device
        self._generator = make_generator(seed, device)
        banned = (PAD_ID, UNK_ID, BOS_ID) if items else tuple(range(len(SPECIALS)))
        self._banned = torch.tensor(banned, dtype=torch.long, device=device)
        self._state: State | None = None
        # The ids drawn last and not yet fed: fed when the next character is asked for,
        # so a sample that stops costs no step it does not use.
        self._pending = torch.tensor(prime_ids, dtype=torch.long, device=device).unsqueeze(1).expand(
            -1, num_samples).contiguous()

    @property
    def texts(self) -> list[str]:
        """What each sample has drawn so far, the prime not included."""
        return ["".join(drawn) for drawn in self._drawn]

    def pieces(self, length: int, temperature: float = DEFAULTS.temperature, top_k: int = DEFAULTS.top_k,
               top_p: float = DEFAULTS.top_p
               ) -> Iterator[list[str]]:
        """Yields up to ``length`` steps, each the new character of every sample ("" for an
        item that has ended); the steps stop early once every item has ended. The options
        are checked now, not when the first character is asked for."""
        check_sampling(temperature, top_k, top_p, length, self.num_samples)
        return self._steps(length, temperature, top_k, top_p)

    @torch.inference_mode()
    def _steps(self, length: int, temperature: float, top_k: int, top_p: float) -> Iterator[list[str]]:
        for _ in range(length):
            if all(self.ended):
                return
            if self._step is not None and self._state is not None:
                logits, self._state = self._step(self._pending[0], self._state)
            else:
                logits, self._state = self.model(self._pending, self._state)
                logits = logits[-1]
            logits = logits.index_fill(-1, self._banned, float("-inf"))
            ids = pick_next(logits, temperature, top_k, top_p, self._generator)
            self._pending = ids.unsqueeze(0)
            out = []
            for j, i in enumerate(ids.tolist()):
                self.ended[j] = self.ended[j] or (self.items and i == EOS_ID)
                piece = "" if self.ended[j] else self._chars[i]
                self._drawn[j].append(piece)
                out.append(piece)
            yield out


def sample_text(
    model: CharLSTM,
    tokenizer: CharTokenizer,
    prime: str,
    length: int,
    *,
    num_samples: int = 1,
    temperature: float = DEFAULTS.temperature,
    top_k: int = DEFAULTS.top_k,
    top_p: float = DEFAULTS.top_p,
    seed: int | None = None,
    items: bool = False,
) -> Iterator[list[str]]:
    """One list per step: the new character of every sample (see ``Sampler``). The options
    and the prime are checked now, so a bad prime fails before anything is shown."""
    sampler = Sampler(model, tokenizer, prime, num_samples=num_samples, seed=seed, items=items)
    return sampler.pieces(length, temperature, top_k, top_p)


def collect(pieces: Iterator[list[str]], num_samples: int) -> list[str]:
    """The texts that a stream of per-step pieces spells out, one per sample."""
    texts: list[list[str]] = [[] for _ in range(num_samples)]
    for step in pieces:
        for text, piece in zip(texts, step, strict=True):
            text.append(piece)
    return ["".join(t) for t in texts]
