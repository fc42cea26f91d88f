"""Text in, batches out: a corpus loaded as compact ids (a stream, or a list of items),
the train/validation split, and the contiguous streams that truncated BPTT walks through.

The core idea (as in PyTorch's word_language_model ``batchify``): cut the token ids into
``n_streams`` equal contiguous pieces, stack them as the rows of an (n_streams, length)
tensor, and walk along them ``bptt`` positions at a time. Position ``t`` of every stream
continues position ``t - 1``, so the LSTM state at the end of one chunk is the right start
for the next.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from .errors import ChargenError
from .lines import MODES, LineItems, detect_mode, file_items, held_out, item_tokenizer
from .modes import ModeName
from .textfile import encode_file, read_head, scan_text, tokenizer_for
from .tokenizer import CharTokenizer

PathLike = str | os.PathLike
# Validation is at most this much of a stream: enough to measure bpc to a few thousandths,
# and a validation of a huge corpus then costs seconds, not hours.
MAX_VAL_CHARS = 1_000_000
# --mode auto judges a file from (at most) its first this many characters.
DETECT_CHARS = 2_000_000


@dataclass
class Corpus:
    """Training and validation data, their vocabulary, and where they came from, held as
    ids (compact, memory-mapped when big; never as one string): a stream's train and
    validation parts, or a list's items (lines mode: spans of the ids, one per non-blank
    line)."""

    source: dict
    tokenizer: CharTokenizer
    mode: ModeName = "stream"
    train_ids: np.ndarray | None = None
    val_ids: np.ndarray | None = None
    train_items: LineItems | None = None
    val_items: LineItems | None = None


def choose_mode(path: PathLike, encoding: str, errors: str) -> tuple[str, str]:
    head, whole = read_head(path, DETECT_CHARS, encoding, errors)
    if not whole:  # judge whole lines only
        head = head[: head.rfind("\n") + 1] or head
    mode, reason = detect_mode(head)
    return mode, reason if whole else f"{reason} (judged from its first {len(head):,} characters)"


def load_corpus(
    path: PathLike,
    *,
    val_path: PathLike | None = None,
    val_fraction: float = 0.05,
    encoding: str = "utf-8",
    errors: str = "strict",
    mode: str = "stream",
) -> Corpus:
    """Read a corpus. ``mode`` is stream (one long text), lines (one item per line) or auto
    (lines when the file reads as a list of short items; ``source["mode_reason"]`` says why).
    Validation is ``val_path``, or else ``val_fraction`` of it: the tail of a stream (at
    most ``MAX_VAL_CHARS``), a random sample of the items of a list."""
    if mode not in MODES:
        raise ChargenError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if val_path is None and not 0.0 < val_fraction < 0.5:
        raise ChargenError(f"--val-fraction must be between 0 and 0.5, not {val_fraction}")
    source: dict = {"path": str(path)}
    if mode == "auto":
        mode, source["mode_reason"] = choose_mode(path, encoding, errors)
    if mode == "lines":
        return load_items(path, val_path, val_fraction, encoding, errors, source)
    return load_stream(path, val_path, val_fraction, encoding, errors, source)


def load_stream(path: PathLike, val_path: PathLike | None, val_fraction: float, encoding: str, errors: str,
                source: dict) -> Corpus:
    """The validation split of one long text: its tail, or ``val_path``."""
    tokenizer, ids, val_ids = encode_files(path, val_path, encoding, errors, source)
    if val_ids is not None:
        return Corpus(source, tokenizer, "stream", ids, val_ids)
    source["val_fraction"] = val_fraction
    n_val = min(MAX_VAL_CHARS, max(2, round(len(ids) * val_fraction)))
    if len(ids) - n_val < 2:
        raise ChargenError(f"{path} has only {len(ids)} characters; a corpus needs far more")
    return Corpus(source, tokenizer, "stream", ids[:-n_val], ids[-n_val:])


def load_items(path: PathLike, val_path: PathLike | None, val_fraction: float, encoding: str, errors: str,
               source: dict) -> Corpus:
    """The validation split of a list: random items, or the items of ``val_path``."""
    file_tokenizer, ids, val_ids = encode_files(path, val_path, encoding, errors, source)
    items = file_items(ids, file_tokenizer)
    if not len(items):
        raise ChargenError(f"{path} has no items: every line is blank")
    if val_ids is not None:
        train_items, val_items = items, file_items(val_ids, file_tokenizer)
        if not len(val_items):
            raise ChargenError(f"{val_path} has no items: every line is blank")
    else:
        source["val_fraction"] = val_fraction
        mean_chars = items.n_chars.mean() + 1
        held = held_out(len(items), val_fraction, max_items=max(1, int(MAX_VAL_CHARS / mean_chars)))
        train_items, val_items = items.subset(~held), items.subset(held)
    source["items"] = len(train_items) + len(val_items)
    tokenizer = item_tokenizer(file_tokenizer, train_items, val_items)
    return Corpus(source, tokenizer, "lines", train_items=train_items, val_items=val_items)


def encode_files(path: PathLike, val_path: PathLike | None, encoding: str, errors: str,
                 source: dict) -> tuple[CharTokenizer, np.ndarray, np.ndarray | None]:
    """Two passes over the file (and ``val_path``), never the whole text in memory: scan
    (count, hash, vocabulary), then encode chunk by chunk into one compact array each."""
    scan = scan_text(path, encoding, errors)
    source.update(chars=scan.n_chars, sha256=scan.sha256)
    if val_path is None:
        tokenizer = tokenizer_for(scan)
        return tokenizer, encode_file(path, tokenizer, scan.n_chars, encoding, errors), None
    val_scan = scan_text(val_path, encoding, errors)
    source.update(val_path=str(val_path), val_chars=val_scan.n_chars, val_sha256=val_scan.sha256)
    tokenizer = tokenizer_for(scan, val_scan)
    return (tokenizer, encode_file(path, tokenizer, scan.n_chars, encoding, errors),
            encode_file(val_path, tokenizer, val_scan.n_chars, encoding, errors))


def min_train_chars(batch_size: int, bptt: int) -> int:
    """The shortest training text that fills one batch: every stream needs bptt + 1."""
    return batch_size * (bptt + 1)


def epoch_steps(n_chars: int, batch_size: int, bptt: int) -> int:
    """Updates in one pass over ``n_chars`` cut into ``batch_size`` streams of ``bptt``-long
    chunks (the last chunk of a pass may be shorter)."""
    return max(1, math.ceil((n_chars // batch_size - 1) / bptt))


def batchify(ids: np.ndarray, n_streams: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Cut ``ids`` into ``n_streams`` contiguous streams: an (n_streams, length) tensor whose
    row ``j`` is the ``j``-th piece of the text. The ragged tail is dropped. On the CPU it is
    a view of ``ids`` (which may be memory-mapped): a big corpus is not copied."""
    length = len(ids) // n_streams
    if length < 2:
        raise ChargenError(f"{len(ids)} tokens are too few for {n_streams} streams")
    return torch.from_numpy(np.ascontiguousarray(ids[: length * n_streams])).view(n_streams, length).to(device)


def chunk_length(rng: np.random.Generator, bptt: int, variable: bool) -> int:
    """The next chunk's length. AWD-LSTM's variable BPTT (Merity et al. 2017) draws it
    around ``bptt`` (and now and then around ``bptt / 2``) so that chunk boundaries move
    from epoch to epoch and every position is sometimes far from a boundary."""
    if not variable:
        return bptt
    centre = bptt if rng.random() < 0.95 else bptt / 2
    return int(np.clip(round(rng.normal(centre, 5)), max(5, bptt // 4), 2 * bptt))


class Streams:
    """The (n_streams, length) id tensor and how to take (time, stream) chunks from it."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.n_streams, self.length = data.shape

    def chunk(self, position: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs at positions [position, position + T) and targets one later, for every
        stream, as (T, n_streams); T is ``bptt`` or less at the end of the streams."""
        t = min(bptt, self.length - 1 - position)
        x = self.data[:, position : position + t].t().to(torch.long, memory_format=torch.contiguous_format)
        y = self.data[:, position + 1 : position + 1 + t].t().to(torch.long, memory_format=torch.contiguous_format)
        return x, y

    def finished(self, position: int) -> bool:
        """True once every target in the streams has been used."""
        return position >= self.length - 1


def eval_streams(ids: np.ndarray, device: torch.device | str = "cpu") -> Streams:
    """Validation text as few, long streams: each starts from a zero state, which costs a
    little loss at its start, so keep them thousands of characters long."""
    return Streams(batchify(ids, max(1, min(32, len(ids) // 4096)), device))
