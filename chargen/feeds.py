"""What the training loop eats: batches, epochs and validation, for each way of reading a
corpus. The loop asks a feed for the next batch and the feed keeps its place in
``progress.epoch`` / ``progress.position``, so a resumed run picks up the very next batch.

- ``StreamFeed`` (``--mode stream``): one long text cut into contiguous streams, walked
  ``bptt`` rows at a time; the LSTM state is carried from chunk to chunk.
- ``LinesFeed`` (``--mode lines``): independent items in length-bucketed batches, each
  item from a zero state; distributed, each rank takes every world-th item of a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .corpus import Streams, batchify, chunk_length, epoch_steps, eval_streams, min_train_chars
from .distributed import SINGLE, Ranks
from .errors import ChargenError
from .evaluate import evaluate_items, evaluate_streams
from .lines import LineItems, epoch_batches, epoch_length, padded_share

# Each training stream's state is reset now and then at a random place (once in about this
# many characters), so that the model learns to start from a zero state anywhere in a text,
# as it must to validate (streams from a zero state in mid-text) and to continue a prompt.
# A model that has only ever started at the epoch's fixed stream starts can fall, from a zero
# state elsewhere, into a saturated state it never leaves: a 2x512 prose model, trained 46
# epochs, scored 1.36 on its validation text from a carried state but 43 nats a character
# on one of its 20 validation streams, from the stream's first characters to its last.
RESET_CHARS = 8192


@dataclass
class Batch:
    x: torch.Tensor  # (time, batch) inputs
    y: torch.Tensor  # (time, batch) targets; IGNORE where padded
    targets: int  # real (unpadded) targets in the batch: the global batch, when distributed
    lr_scale: float  # a shorter chunk than bptt gets a proportionally smaller step
    new_epoch: bool  # the batch starts an epoch: no state carries into it
    loss_weight: float = 1.0  # the batch's mean loss is scaled by this for the gradient
    # Distributed lines: this rank's share of the global batch's targets, times the world
    # size. The rank's mean loss times it, averaged over the ranks (as DDP averages their
    # gradients), is the global batch's mean loss.
    rank_share: float = 1.0
    fresh: torch.Tensor | None = None  # (batch,) bool: streams whose state is reset before it


class StreamFeed:
    carries_state = True

    def __init__(self, train_ids: np.ndarray, val_ids: np.ndarray, batch_size: int, bptt: int,
                 variable_bptt: bool, device: torch.device, ranks: Ranks = SINGLE) -> None:
        need = min_train_chars(batch_size, bptt)
        if len(train_ids) < need:
            fits = len(train_ids) // (bptt + 1)
            hint = f"--batch-size {fits}" if fits else f"--batch-size 1 --bptt {max(1, len(train_ids) - 1)}"
            raise ChargenError(
                f"the training text has {len(train_ids):,} characters, but --batch-size {batch_size} "
                f"x --bptt {bptt} needs at least {need:,}; give more text or use e.g. {hint}"
            )
        if len(val_ids) < 2:
            raise ChargenError("the validation text needs at least 2 characters")
        # Distributed, each rank trains its own contiguous block of the streams (a contiguous
        # stretch of the text) and validates on every world-th validation stream.
        self.streams = Streams(batchify(train_ids, batch_size, device)[ranks.block(batch_size)])
        all_val = eval_streams(val_ids, device)
        self.val_streams, self.n_val_streams = Streams(all_val.data[ranks.rank :: ranks.world]), all_val.n_streams
        self.batch_size, self.ranks = batch_size, ranks
        self.bptt, self.variable_bptt = bptt, variable_bptt
        self.n_train, self.val_targets = len(train_ids), len(val_ids) - 1
        self.steps_per_epoch = self.steps_per_epoch_at(batch_size)

    def steps_per_epoch_at(self, batch_size: int) -> int:
        return epoch_steps(self.n_train, batch_size, self.bptt)

    def largest_batch(self) -> tuple[int, int]:
        """(time, batch) of the longest chunk this process trains on: a variable BPTT
        length reaches twice --bptt."""
        longest = 2 * self.bptt if self.variable_bptt else self.bptt
        return min(longest, self.streams.length - 1), self.streams.n_streams

    def typical_batch(self) -> tuple[int, int]:
        """(time, batch) of this process's usual chunk: what a speed probe should time."""
        return self.bptt, self.streams.n_streams

    @property
    def epoch_targets(self) -> int:
        return self.n_train

    def describe(self) -> str:
        return f"{self.n_train:,} training / {self.val_targets + 1:,} validation chars"

    def batch_description(self) -> str:
        split = f" ({self.streams.n_streams} on each of {self.ranks.world} processes)" if self.ranks.active else ""
        return f"{self.batch_size} streams{split} x {self.bptt} chars"

    def next(self, progress, rng: np.random.Generator) -> Batch:
        new_epoch = progress.position == 0
        if self.streams.finished(progress.position):
            progress.epoch, progress.position, new_epoch = progress.epoch + 1, 0, True
        x, y = self.streams.chunk(progress.position, chunk_length(rng, self.bptt, self.variable_bptt))
        progress.position += x.shape[0]
        return Batch(x, y, x.numel() * self.ranks.world, x.shape[0] / self.bptt, new_epoch,
                     fresh=self.fresh_streams(rng, x.shape[0]))

    def fresh_streams(self, rng: np.random.Generator, chars: int) -> torch.Tensor | None:
        """Which of this process's streams start the next ``chars`` from a zero state: each
        with chance chars / (chars + RESET_CHARS). Every rank draws for all the streams (the
        same draws: one seed) and takes its own block."""
        fresh = rng.random(self.batch_size) < chars / (chars + RESET_CHARS)
        fresh = fresh[self.ranks.block(self.batch_size)]
        if not fresh.any():
            return None
        mask, device = torch.from_numpy(fresh), self.streams.data.device
        if device.type == "cuda":  # (pinned and asynchronous: the loop makes no per-step sync on a GPU)
            return mask.pin_memory().to(device, non_blocking=True)
        return mask

    def epoch_fraction(self, position: int) -> float:
        return position / max(1, self.streams.length - 1)

    def evaluate(self, model: torch.nn.Module, sample: int | None = None) -> tuple[float, int]:
        """The validation loss and the targets it scored: all, or about ``sample`` of them,
        the same every time (the first positions of every validation stream)."""
        streams, n_streams = self.val_streams, self.n_val_streams
        positions = None if sample is None else max(1, math.ceil(sample / n_streams))
        loss = evaluate_streams(model, streams, ranks=self.ranks, positions=positions)
        scored = n_streams * (streams.length - 1 if positions is None else min(positions, streams.length - 1))
        return loss, scored


class LinesFeed:
    carries_state = False

    def __init__(self, train_items: LineItems, val_items: LineItems, batch_size: int, bucket_factor: int,
                 seed: int, device: torch.device, ranks: Ranks = SINGLE) -> None:
        self.items, self.val_items, self.ranks = train_items, val_items, ranks
        self.batch_size, self.bucket_factor, self.seed, self.device = batch_size, bucket_factor, seed, device
        self.steps_per_epoch = self.steps_per_epoch_at(batch_size)
        self.val_targets = int(val_items.lengths.sum())
        self.mean_targets = train_items.lengths.sum() / self.steps_per_epoch
        self._epoch: int | None = None
        self._batches: list[np.ndarray] = []

    def steps_per_epoch_at(self, batch_size: int) -> int:
        return epoch_length(len(self.items), batch_size, self.bucket_factor)

    def largest_batch(self) -> tuple[int, int]:
        """(time, batch) of this process's widest batch: the longest item (and its <eos>) sets
        the time."""
        return int(self.items.lengths.max()), self.rank_batch()

    def typical_batch(self) -> tuple[int, int]:
        """(time, batch) of a batch of items of the mean length (with its <eos>)."""
        return max(1, round(float(self.items.lengths.mean()))), self.rank_batch()

    def rank_batch(self) -> int:
        """Items of a full batch this process trains on."""
        return min(math.ceil(self.batch_size / self.ranks.world), len(self.items))

    @property
    def epoch_targets(self) -> int:
        return int(self.items.lengths.sum())

    def describe(self) -> str:
        chars = int(self.items.n_chars.sum())
        return (f"{len(self.items):,} training items ({chars:,} chars, {chars / len(self.items):.1f} on average, "
                f"longest {int(self.items.n_chars.max()):,}) / {len(self.val_items):,} validation items")

    def batch_description(self) -> str:
        share = padded_share(self.items.lengths, self.batches(0))
        split = f", about {self.rank_batch()} on each of {self.ranks.world} processes" if self.ranks.active else ""
        return (f"{self.batch_size} items{split} (superbatches of {self.bucket_factor} batches sorted by length; "
                f"{share:.1%} of positions are padding)")

    def batches(self, epoch: int) -> list[np.ndarray]:
        if epoch != self._epoch:
            self._epoch = epoch
            self._batches = epoch_batches(self.items.lengths, self.batch_size, self.bucket_factor, self.seed, epoch)
        return self._batches

    def next(self, progress, rng: np.random.Generator) -> Batch:
        if progress.position >= self.steps_per_epoch:
            progress.epoch, progress.position = progress.epoch + 1, 0
        index = self.batches(progress.epoch)[progress.position]
        progress.position += 1
        targets = int(self.items.lengths[index].sum())
        mine, share = index, 1.0
        if self.ranks.active:  # every world-th item of the length-sorted batch: alike lengths on every rank
            mine = index[self.ranks.rank :: self.ranks.world]
            share = float(self.items.lengths[mine].sum()) * self.ranks.world / targets
            mine = mine if len(mine) else index[:1]  # (every rank must step: on one item, weighed 0)
        x, y = self.items.batch(mine, self.device)
        # Bucketing puts short items and long ones in different batches; weighting each
        # batch's mean loss by its share of characters makes every character count the
        # same, as with random batches. (Scaling the lr instead measured worse.)
        return Batch(x, y, targets, 1.0, True, targets / self.mean_targets, share)

    def epoch_fraction(self, position: int) -> float:
        return position / self.steps_per_epoch

    def evaluate(self, model: torch.nn.Module, sample: int | None = None) -> tuple[float, int]:
        """The validation loss and the targets it scored: all, or the first items that hold
        about ``sample`` (the same every time)."""
        cumulative = np.cumsum(self.val_items.lengths)
        count = None if sample is None else int(min(len(cumulative), np.searchsorted(cumulative, sample) + 1))
        scored = int(cumulative[-1] if count is None else cumulative[count - 1])
        return evaluate_items(model, self.val_items, count=count, ranks=self.ranks), scored

