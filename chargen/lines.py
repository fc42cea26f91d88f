"""Lines mode: a corpus of many short, independent items, one per line (names, titles, song
lines, product names). Each item is its own sequence, framed as ``<bos> item <eos>``, and
starts from a zero LSTM state: nothing is carried from one item to the next.

Batches are length-bucketed: a superbatch of ``bucket_factor`` batches of items is drawn
at random, sorted by length and cut into batches, so each batch holds items of about the
same length and is padded only to its own longest; the batches are then shuffled. Padding
never counts: its targets are ``IGNORE``, which the loss skips, and since the LSTM reads
left to right, pads after an item's end cannot change anything before it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ChargenError
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, CharTokenizer

IGNORE = -100  # the target at padded positions: cross_entropy's ignore_index
MODES = ("auto", "stream", "lines")
# What makes a file "a list of short items" (see detect_mode).
MIN_ITEMS = 50
MAX_BLANK_SHARE = 0.05
MAX_ITEM_P95 = 300
MAX_CONTINUED_SHARE = 0.2


def split_items(text: str) -> list[str]:
    """One item per line that is not blank; the line break (``\\n`` or ``\\r\\n``) is not
    part of the item."""
    return [line.removesuffix("\r") for line in text.split("\n") if line.strip()]


def runs_on(line: str, next_line: str) -> bool:
    """A sentence that goes on past the line break: the line ends in , ; or :, or it is a
    long line wrapped mid-sentence (the next starts in lower case). Items in a list do
    neither."""
    end = line.rstrip()[-1:]
    return end in (",", ";", ":") or (len(line) >= 40 and end.isalnum() and next_line[:1].islower())


def detect_mode(text: str) -> tuple[str, str]:
    """``("lines" | "stream", why)``: lines mode for a file that reads as a list of short
    items. Running text shows itself by blank lines between paragraphs or stanzas, by long
    lines (a paragraph per line), or by lines that run on into the next (verse, wrapped
    prose). A list has none of these."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final line break
    items = [line for line in lines if line.strip()]
    if len(items) < MIN_ITEMS:
        return "stream", f"only {len(items)} non-blank lines"
    blank_share = 1 - len(items) / len(lines)
    if blank_share > MAX_BLANK_SHARE:
        return "stream", f"{blank_share:.0%} of its lines are blank (paragraphs or stanzas)"
    lengths = np.array([len(item) for item in items])
    p95 = float(np.percentile(lengths, 95))
    if p95 > MAX_ITEM_P95:
        return "stream", f"long lines (5% over {p95:.0f} characters): running text"
    continued = sum(runs_on(a, b) for a, b in zip(items, items[1:], strict=False)) / (len(items) - 1)
    if continued > MAX_CONTINUED_SHARE:
        return "stream", f"{continued:.0%} of its lines run on into the next (verse or wrapped text)"
    return "lines", f"{len(items):,} lines, {lengths.mean():.0f} characters on average, no paragraphs: a list"


def split_train_val(items: list[str], val_fraction: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """A random ``val_fraction`` of the items held out (lists are often sorted, so the
    tail would be a biased sample); the same items for the same list and seed."""
    if not 0.0 < val_fraction < 0.5:
        raise ChargenError(f"--val-fraction must be between 0 and 0.5, not {val_fraction}")
    n_val = max(1, round(len(items) * val_fraction))
    if len(items) - n_val < 1:
        raise ChargenError(f"{len(items)} items are too few to hold some out for validation; give more lines")
    held = np.zeros(len(items), dtype=bool)
    held[np.random.default_rng(seed).permutation(len(items))[:n_val]] = True
    return [s for s, h in zip(items, held, strict=True) if not h], [s for s, h in zip(items, held, strict=True) if h]


class LineItems:
    """Items encoded once into one flat id array; a batch is gathered from it on demand."""

    def __init__(self, items: list[str], tokenizer: CharTokenizer) -> None:
        if not items:
            raise ChargenError("no items: every line is blank")
        self.n_chars = np.array([len(item) for item in items], dtype=np.int64)
        self.ids = tokenizer.encode("".join(items))  # compact: one byte a character for most texts
        self.starts = np.concatenate([[0], np.cumsum(self.n_chars)[:-1]])
        self.lengths = self.n_chars + 1  # targets per item: its characters and <eos>

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, index: np.ndarray, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs ``<bos> item`` and targets ``item <eos>`` of the items in ``index``, as
        (time, batch) tensors padded to the longest: inputs with ``<pad>``, targets with
        ``IGNORE``."""
        steps = int(self.lengths[index].max())
        x = np.full((steps, len(index)), PAD_ID, dtype=np.int64)
        y = np.full((steps, len(index)), IGNORE, dtype=np.int64)
        x[0] = BOS_ID
        for column, item in enumerate(index):
            n, start = self.n_chars[item], self.starts[item]
            chars = self.ids[start : start + n]
            x[1 : n + 1, column] = chars
            y[:n, column] = chars
            y[n, column] = EOS_ID
        return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def epoch_batches(
    lengths: np.ndarray, batch_size: int, bucket_factor: int, seed: int, epoch: int
) -> list[np.ndarray]:
    """The batches (arrays of item indices) of one epoch, a pure function of its arguments
    so a resumed run rebuilds the same epoch. Every item is in exactly one batch."""
    if batch_size < 1 or bucket_factor < 1:
        raise ChargenError("--batch-size and --bucket-factor must be at least 1")
    rng = np.random.default_rng((seed, epoch))
    order = rng.permutation(len(lengths))
    size = batch_size * bucket_factor
    batches: list[np.ndarray] = []
    for start in range(0, len(order), size):
        group = order[start : start + size]
        group = group[np.argsort(lengths[group], kind="stable")]
        batches += [group[i : i + batch_size] for i in range(0, len(group), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def padded_share(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """The share of a batch's (time x batch) positions that are padding, over all batches."""
    real = sum(int(lengths[b].sum()) for b in batches)
    total = sum(int(lengths[b].max()) * len(b) for b in batches)
    return 1 - real / total


def epoch_length(n_items: int, batch_size: int, bucket_factor: int) -> int:
    """Batches in one epoch (as ``epoch_batches`` cuts them)."""
    size = batch_size * bucket_factor
    full, rest = divmod(n_items, size)
    return full * bucket_factor + -(-rest // batch_size)


@torch.inference_mode()
def evaluate_items(model: torch.nn.Module, items: LineItems, max_positions: int = 65536) -> float:
    """Mean loss (nats) per real target (each character and each item's ``<eos>``), the
    items batched by length so little is padded."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = np.argsort(items.lengths, kind="stable")
    total, count, start = 0.0, 0, 0
    while start < len(order):
        # As many items as fit in max_positions at the length of the longest (the last).
        end = start + 1
        while end < len(order) and items.lengths[order[end]] * (end + 1 - start) <= max_positions:
            end += 1
        x, y = items.batch(order[start:end], device)
        logits, _ = model(x)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE, reduction="sum").item()
        count += int((y != IGNORE).sum())
        start = end
    model.train(was_training)
    return total / count
