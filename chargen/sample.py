"""Sampling: the LSTM state is carried, so each new character costs one step and the
growing text is never fed again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .errors import ChargenError
from .model import CharLSTM, State
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, CharTokenizer


def check_sampling(temperature: float, top_k: int, top_p: float, length: int, num_samples: int) -> None:
    if temperature < 0:
        raise ChargenError(f"--temperature must be 0 or more (0 means greedy), not {temperature}")
    if top_k < 0:
        raise ChargenError(f"--top-k must be 0 (off) or more, not {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ChargenError(f"--top-p must be in (0, 1], not {top_p}")
    if length < 0:
        raise ChargenError(f"--length must be 0 or more, not {length}")
    if num_samples < 1:
        raise ChargenError(f"--num-samples must be at least 1, not {num_samples}")


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
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the ones before it already cover top_p; the top one stays.
        drop = probs.cumsum(dim=-1) - probs >= top_p
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


@torch.inference_mode()
def sample_ids(
    model: CharLSTM,
    prime_ids: Sequence[int],
    length: int,
    *,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    banned_ids: Sequence[int] = tuple(range(len(SPECIALS))),
    state: State | None = None,
) -> Iterator[torch.Tensor]:
    """Yields ``length`` steps of new ids, each (num_samples,). The prime (at least one
    id) is fed in one call; after that every step feeds only the id just drawn."""
    if len(prime_ids) == 0:
        raise ChargenError("sampling needs at least one prime character")
    model.eval()
    device = model.head.weight.device
    generator = make_generator(seed, device)
    x = torch.tensor(list(prime_ids), dtype=torch.long, device=device)
    x = x.unsqueeze(1).expand(-1, num_samples).contiguous()
    logits, state = model(x, state)
    logits = logits[-1]
    banned = torch.tensor(list(banned_ids), dtype=torch.long, device=device)
    for i in range(length):
        logits = logits.index_fill(-1, banned, float("-inf"))
        ids = pick_next(logits, temperature, top_k, top_p, generator)
        yield ids
        if i + 1 < length:
            step_logits, state = model(ids.unsqueeze(0), state)
            logits = step_logits[0]


def sample_text(
    model: CharLSTM,
    tokenizer: CharTokenizer,
    prime: str,
    length: int,
    *,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    items: bool = False,
) -> Iterator[list[str]]:
    """One list per step: the new character of every sample. The options and the prime are
    checked now, not when the first character is asked for, so a bad prime fails before
    anything is shown.

    With ``items`` (lines mode) every sample is an item started from ``<bos>`` and
    ``prime``, and ends at its ``<eos>`` (or after ``length`` characters): "" from then
    on, and the steps stop once every sample has ended."""
    check_sampling(temperature, top_k, top_p, length, num_samples)
    prime_ids = tokenizer.encode_known(prime, "prefix" if items else "prime text").tolist()
    banned = (PAD_ID, UNK_ID, BOS_ID) if items else tuple(range(len(SPECIALS)))
    steps = sample_ids(model, [BOS_ID, *prime_ids] if items else prime_ids, length, num_samples=num_samples,
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, banned_ids=banned)
    chars = [""] * len(SPECIALS) + tokenizer.chars
    if not items:
        return ([chars[i] for i in ids.tolist()] for ids in steps)

    def until_end() -> Iterator[list[str]]:
        ended = [False] * num_samples
        for ids in steps:
            out = []
            for j, i in enumerate(ids.tolist()):
                ended[j] = ended[j] or i == EOS_ID
                out.append("" if ended[j] else chars[i])
            yield out
            if all(ended):
                return

    return until_end()


def collect(pieces: Iterator[list[str]], num_samples: int) -> list[str]:
    """The texts that a stream of per-step pieces spells out, one per sample."""
    texts: list[list[str]] = [[] for _ in range(num_samples)]
    for step in pieces:
        for text, piece in zip(texts, step, strict=True):
            text.append(piece)
    return ["".join(t) for t in texts]
