"""Scoring a model on held-out text: mean loss in nats per character, and bits per character.

Two evaluators, one per way of reading a corpus:

- ``evaluate_streams``: a long text as a few long streams, the LSTM state carried through
  each from a zero start, as in training;
- ``evaluate_items``: independent items (lines mode), each from ``<bos>`` and a zero state,
  batched by length so little is padded; each item's characters and its ``<eos>`` count.

Both take any module with CharLSTM's call signature (``model(x, state) -> logits, state``),
so the data layer below never needs to know the model.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .corpus import Streams
from .device import wide_dtype
from .distributed import SINGLE, Ranks
from .lines import IGNORE, LineItems

LN2 = math.log(2)


def bpc(loss: float) -> float:
    """Bits per character from a loss in nats per character."""
    return loss / LN2


@torch.inference_mode()
def evaluate_streams(model: torch.nn.Module, streams: Streams, bptt: int = 256, ranks: Ranks = SINGLE,
                     positions: int | None = None) -> float:
    """Mean loss (nats per character) over every target in ``streams``, state carried, or
    over the first ``positions`` of each; distributed, each rank holds some of the streams
    and the sums are added up."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=wide_dtype(streams.data.device), device=streams.data.device)  # loss, targets
    end = streams.length - 1 if positions is None else min(positions, streams.length - 1)
    position, state = 0, None
    while streams.n_streams and position < end:
        x, y = streams.chunk(position, min(bptt, end - position))
        logits, state = model(x, state)
        sums[0] += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum")
        sums[1] += y.numel()
        position += x.shape[0]
    model.train(was_training)
    total, count = ranks.sum(sums).tolist()
    return total / count


@torch.inference_mode()
def evaluate_items(model: torch.nn.Module, items: LineItems, max_positions: int = 65536,
                   count: int | None = None, ranks: Ranks = SINGLE) -> float:
    """Mean loss (nats) per real target (each character and each item's ``<eos>``) of all
    the items, or of the first ``count``, batched by length so little is padded;
    distributed, each rank scores every world-th of them and the sums are added up."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = np.argsort(items.lengths[:count], kind="stable")[ranks.rank :: ranks.world]
    sums = torch.zeros(2, dtype=wide_dtype(device), device=device)  # loss, targets
    start = 0
    while start < len(order):
        # As many items as fit in max_positions at the length of the longest (the last).
        end = start + 1
        while end < len(order) and items.lengths[order[end]] * (end + 1 - start) <= max_positions:
            end += 1
        x, y = items.batch(order[start:end], device)
        logits, _ = model(x)
        sums[0] += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE, reduction="sum")
        sums[1] += int((y != IGNORE).sum())
        start = end
    model.train(was_training)
    total, count = ranks.sum(sums).tolist()
    return total / count
