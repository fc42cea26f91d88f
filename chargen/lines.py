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

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from .errors import ChargenError
from .storage import load_tensors, save_tensors
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, CharTokenizer, recode

IGNORE = -100  # the target at padded positions: cross_entropy's ignore_index
MODES = ("auto", "stream", "lines")
# What makes a file "a list of short items" (see detect_mode).
MIN_ITEMS = 50
MAX_BLANK_SHARE = 0.05
MAX_ITEM_P95 = 300
MAX_CONTINUED_SHARE = 0.2
# Items are found in the ids this many at a time: the temporary arrays stay this size.
ID_WINDOW = 1 << 24


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


def held_out(n_items: int, val_fraction: float, max_items: int | None = None, seed: int = 0) -> np.ndarray:
    """Which items validation takes (a bool mask): a random ``val_fraction`` of them, at most
    ``max_items`` (lists are often sorted, so the tail would be a biased sample); the same
    items for the same count and seed."""
    if not 0.0 < val_fraction < 0.5:
        raise ChargenError(f"--val-fraction must be between 0 and 0.5, not {val_fraction}")
    n_val = min(max(1, round(n_items * val_fraction)), max_items or n_items)
    if n_items - n_val < 1:
        raise ChargenError(f"{n_items} items are too few to hold some out for validation; give more lines")
    held = np.zeros(n_items, dtype=bool)
    held[np.random.default_rng(seed).permutation(n_items)[:n_val]] = True
    return held


class LineItems:
    """Items as spans (in order) of one flat id array: compact, perhaps memory-mapped, and
    shared by the training and validation items of a file. A batch is gathered on demand."""

    def __init__(self, ids: np.ndarray, starts: np.ndarray, n_chars: np.ndarray) -> None:
        self.ids, self.starts, self.n_chars = ids, starts.astype(np.int64), n_chars.astype(np.int64)
        self.lengths = self.n_chars + 1  # targets per item: its characters and <eos>

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, mask: np.ndarray) -> LineItems:
        return LineItems(self.ids, self.starts[mask], self.n_chars[mask])

    def strings(self, tokenizer: CharTokenizer, block_chars: int = 1 << 22) -> Iterator[str]:
        """The items as text, decoded a block of the id array at a time."""
        ends = self.starts + self.n_chars
        i = 0
        while i < len(self):
            j = max(i + 1, int(np.searchsorted(ends, self.starts[i] + block_chars, side="right")))
            base = int(self.starts[i])
            text = tokenizer.decode_aligned(self.ids[base : int(ends[j - 1])])
            spans = zip(self.starts[i:j].tolist(), ends[i:j].tolist(), strict=True)
            yield from (text[start - base : end - base] for start, end in spans)
            i = j

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


def line_windows(ids: np.ndarray, newline: int | None, window: int) -> Iterator[tuple[int, int]]:
    """(start, end) pieces of ``ids`` of about ``window`` ids that end just after a line
    break (or at the end), so that no line is cut."""
    start = 0
    while start < len(ids):
        end = min(len(ids), start + window)
        while end < len(ids):
            breaks = np.flatnonzero(ids[start:end] == newline) if newline is not None else []
            if len(breaks):
                end = start + int(breaks[-1]) + 1
                break
            end = min(len(ids), end + window)  # a line longer than the window
        yield start, end
        start = end


def file_items(ids: np.ndarray, tokenizer: CharTokenizer, window: int | None = None) -> LineItems:
    """The items of an encoded file: one per line that is not blank (white space only),
    without its line break (``\\n`` or ``\\r\\n``); worked out on the ids a window at a
    time, never as strings."""
    newline = tokenizer.id_of("\n") if "\n" in tokenizer else None
    cr = tokenizer.id_of("\r") if "\r" in tokenizer else -1
    not_space = np.array([False] * len(SPECIALS) + [not ch.isspace() for ch in tokenizer.chars])
    all_starts, all_n = [], []
    for w0, w1 in line_windows(ids, newline, window or ID_WINDOW):
        piece = np.asarray(ids[w0:w1])
        breaks = np.flatnonzero(piece == newline) if newline is not None else np.zeros(0, dtype=np.int64)
        starts = np.concatenate([[0], breaks + 1])
        ends = np.concatenate([breaks, [len(piece)]])
        real = starts < len(piece)  # not the empty line after a final line break
        starts, ends = starts[real], ends[real]
        # A line is blank unless some character of it is not white space. Each segment here
        # runs on to the line break, which is white space.
        keep = np.logical_or.reduceat(not_space[piece], starts)
        n = ends - starts
        n -= (n > 0) & (piece[np.maximum(ends - 1, 0)] == cr)  # the \r of a \r\n line end
        all_starts.append(starts[keep] + w0)
        all_n.append(n[keep])
    return LineItems(ids, np.concatenate(all_starts), np.concatenate(all_n))


def item_tokenizer(tokenizer: CharTokenizer, *item_lists: LineItems, window: int | None = None) -> CharTokenizer:
    """The vocabulary of the characters inside the items (not the line breaks between them,
    nor white space found only in blank lines); every id array is recoded to it in place."""
    window = window or ID_WINDOW
    in_items = np.zeros(tokenizer.vocab_size, dtype=bool)
    arrays = list({id(items.ids): items.ids for items in item_lists}.values())
    for ids in arrays:
        for w0 in range(0, len(ids), window):
            in_items |= np.bincount(ids[w0 : w0 + window], minlength=tokenizer.vocab_size) > 0
    in_items[: len(SPECIALS)] = False
    # Every character that is not white space lies in an item; white space may lie only
    # between items, so each white-space character is looked for inside them.
    for char_id in np.flatnonzero(in_items):
        if tokenizer.chars[char_id - len(SPECIALS)].isspace():
            in_items[char_id] = any(occurs_in_items(items, int(char_id), window) for items in item_lists)
    recoded = CharTokenizer([ch for ch, used in zip(tokenizer.chars, in_items[len(SPECIALS):], strict=True) if used])
    table = tokenizer.recode_table(recoded)  # (what has no id in it lies between items)
    for ids in arrays:
        recode(ids, table, window)
    return recoded


def occurs_in_items(items: LineItems, char_id: int, window: int) -> bool:
    ends = items.starts + items.n_chars
    for w0 in range(0, len(items.ids), window):
        where = np.flatnonzero(items.ids[w0 : w0 + window] == char_id) + w0
        item = np.searchsorted(items.starts, where, side="right") - 1
        if ((item >= 0) & (where < ends[np.maximum(item, 0)])).any():
            return True
    return False


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


# --- the training items, as hashes (for --new-only) ----------------------------------------
def _hashes(items: Iterable[str]) -> np.ndarray:
    # (fromiter fills the array as the items come: a list of millions of digests is not kept)
    return np.fromiter((int.from_bytes(hashlib.blake2b(item.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                       "little", signed=True) for item in items), dtype=np.int64)


def write_item_hashes(path: Path, items: Iterable[str]) -> None:
    """A sorted 64-bit hash of every training item: enough to tell whether a sample is one
    of them, at 8 bytes an item, without keeping the list."""
    hashes = np.sort(_hashes(items))
    save_tensors(path, {"hashes": torch.from_numpy(hashes)}, {"items": len(hashes)})


def read_item_hashes(path: Path, folder: Path | None = None) -> torch.Tensor:
    tensors, _ = load_tensors(path, folder, f"{path} is missing: only a run trained in lines mode knows its training "
                              "items")
    if "hashes" not in tensors or tensors["hashes"].dtype != torch.int64:
        raise ChargenError(f"{path} holds no item hashes; retrain or restore it")
    return tensors["hashes"]


def known_items(hashes: torch.Tensor, items: list[str]) -> list[bool]:
    """For each item, whether it is one of the hashed ones."""
    if not items:
        return []
    return torch.isin(torch.from_numpy(_hashes(items).copy()), hashes).tolist()

