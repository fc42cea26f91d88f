"""Text in, batches out: reading a corpus safely, the train/validation split, and the
contiguous streams that truncated BPTT walks through.

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
from .lines import MODES, detect_mode, split_items, split_train_val
from .textfile import encode_file, fingerprint, read_head, read_text, scan_text, tokenizer_for
from .tokenizer import CharTokenizer

# Validation is at most this much of a stream: enough to measure bpc to a few thousandths,
# and a validation of a huge corpus then costs seconds, not hours.
MAX_VAL_CHARS = 1_000_000
# --mode auto judges a file from (at most) its first this many characters.
DETECT_CHARS = 2_000_000


@dataclass
class Corpus:
    """Training and validation data, their vocabulary, and where they came from. A stream
    is held as ids (compact, memory-mapped when big; never as one string); a list (lines
    mode) as its items, one per non-blank line."""

    source: dict
    tokenizer: CharTokenizer
    mode: str = "stream"
    train_ids: np.ndarray | None = None
    val_ids: np.ndarray | None = None
    train_items: list[str] | None = None
    val_items: list[str] | None = None

    @property
    def first_char(self) -> str:
        return self.tokenizer.decode(self.train_ids[:1]) if self.mode == "stream" else self.train_items[0][:1]


def choose_mode(path: str | os.PathLike, encoding: str, errors: str) -> tuple[str, str]:
    head, whole = read_head(path, DETECT_CHARS, encoding, errors)
    if not whole:  # judge whole lines only
        head = head[: head.rfind("\n") + 1] or head
    mode, reason = detect_mode(head)
    return mode, reason if whole else f"{reason} (judged from its first {len(head):,} characters)"


def load_corpus(
    path: str | os.PathLike,
    *,
    val_path: str | os.PathLike | None = None,
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


def load_stream(path, val_path, val_fraction: float, encoding: str, errors: str, source: dict) -> Corpus:
    """Two passes over the file(s), never the whole text in memory: scan (count, hash,
    vocabulary), then encode chunk by chunk into one compact array."""
    scan = scan_text(path, encoding, errors)
    source.update(chars=scan.n_chars, sha256=scan.sha256)
    if val_path is not None:
        val_scan = scan_text(val_path, encoding, errors)
        source.update(val_path=str(val_path), val_chars=val_scan.n_chars, val_sha256=val_scan.sha256)
        tokenizer = tokenizer_for(scan, val_scan)
        ids = encode_file(path, tokenizer, scan.n_chars, encoding, errors)
        return Corpus(source, tokenizer, "stream", ids, encode_file(val_path, tokenizer, val_scan.n_chars,
                                                                    encoding, errors))
    source["val_fraction"] = val_fraction
    n_val = min(MAX_VAL_CHARS, max(2, round(scan.n_chars * val_fraction)))
    if scan.n_chars - n_val < 2:
        raise ChargenError(f"{path} has only {scan.n_chars} characters; a corpus needs far more")
    tokenizer = tokenizer_for(scan)
    ids = encode_file(path, tokenizer, scan.n_chars, encoding, errors)
    return Corpus(source, tokenizer, "stream", ids[:-n_val], ids[-n_val:])


def load_items(path, val_path, val_fraction: float, encoding: str, errors: str, source: dict) -> Corpus:
    text = read_text(path, encoding, errors)
    source.update(chars=len(text), sha256=fingerprint(text))
    items = split_items(text)
    del text
    if val_path is not None:
        val = read_text(val_path, encoding, errors)
        source.update(val_path=str(val_path), val_chars=len(val), val_sha256=fingerprint(val))
        train_items, val_items = items, split_items(val)
        if not train_items or not val_items:
            raise ChargenError("lines mode needs at least one non-blank line in the text and in --val-file")
    else:
        source["val_fraction"] = val_fraction
        train_items, val_items = split_train_val(items, val_fraction)
    source["items"] = len(train_items) + len(val_items)
    # The line breaks between items are not characters of the vocabulary.
    tokenizer = CharTokenizer.from_text("".join(train_items) + "".join(val_items))
    return Corpus(source, tokenizer, "lines", train_items=train_items, val_items=val_items)


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
