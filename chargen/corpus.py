"""Text in, batches out: reading a corpus safely, the train/validation split, and the
contiguous streams that truncated BPTT walks through.

The core idea (as in PyTorch's word_language_model ``batchify``): cut the token ids into
``n_streams`` equal contiguous pieces, stack them as columns of a (length, n_streams)
tensor, and walk down the rows ``bptt`` at a time. Row ``t`` of every column continues
row ``t - 1``, so the LSTM state at the end of one chunk is the right start for the next.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import ChargenError
from .lines import MODES, detect_mode, split_items, split_train_val

ERROR_POLICIES = ("strict", "replace", "ignore")


def read_text(path: str | os.PathLike, encoding: str = "utf-8", errors: str = "strict") -> str:
    """The whole file as text, with a clear error for every way that can fail."""
    path = Path(path)
    if errors not in ERROR_POLICIES:
        raise ChargenError(f"--errors must be one of {', '.join(ERROR_POLICIES)}, not {errors!r}")
    if not path.exists():
        raise ChargenError(f"{path}: no such file; check the path")
    if path.is_dir():
        raise ChargenError(f"{path} is a directory; give a text file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ChargenError(f"{path}: cannot read ({e.strerror}); check its permissions") from None
    if not data:
        raise ChargenError(f"{path} is empty; give a file with text in it")
    try:
        text = data.decode(encoding, errors)
    except LookupError:
        raise ChargenError(f"unknown encoding {encoding!r}; try utf-8 or latin-1") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ChargenError(
            f"{path} is not valid {encoding}: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"(line {line}); pass --encoding with the file's real encoding (e.g. latin-1) "
            "or --errors replace"
        ) from None
    if text.startswith("\ufeff"):  # a byte-order mark is not part of the text
        text = text[1:]
    if not text:
        raise ChargenError(f"{path} has no text; give a file with text in it")
    return text


def fingerprint(text: str) -> str:
    """A short content hash, so a resumed run can tell it is fed the same text."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass
class CorpusText:
    """Training and validation text, and where they came from. In lines mode the text is
    also kept as its items (one per non-blank line); ``train``/``val`` join them with
    line breaks."""

    train: str
    val: str
    source: dict
    mode: str = "stream"
    train_items: list[str] | None = None
    val_items: list[str] | None = None

    def vocabulary_text(self) -> str:
        """Every character the model must know: the line breaks between items are not."""
        if self.mode == "lines":
            return "".join(self.train_items + self.val_items)
        return self.train + self.val


def load_corpus(
    path: str | os.PathLike,
    *,
    val_path: str | os.PathLike | None = None,
    val_fraction: float = 0.05,
    encoding: str = "utf-8",
    errors: str = "strict",
    mode: str = "stream",
) -> CorpusText:
    """Read a corpus. ``mode`` is stream (one long text), lines (one item per line) or auto
    (lines when the file reads as a list of short items; ``source["mode_reason"]`` says why).
    Validation is ``val_path``, or else ``val_fraction`` of it: the tail of a stream, a
    random sample of the items of a list."""
    if mode not in MODES:
        raise ChargenError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    text = read_text(path, encoding, errors)
    source = {"path": str(path), "chars": len(text), "sha256": fingerprint(text)}
    if mode == "auto":
        mode, source["mode_reason"] = detect_mode(text)
    val = None
    if val_path is not None:
        val = read_text(val_path, encoding, errors)
        source.update(val_path=str(val_path), val_chars=len(val), val_sha256=fingerprint(val))
    elif not 0.0 < val_fraction < 0.5:
        raise ChargenError(f"--val-fraction must be between 0 and 0.5, not {val_fraction}")
    else:
        source["val_fraction"] = val_fraction
    if mode == "lines":
        items = split_items(text)
        if val is not None:
            train_items, val_items = items, split_items(val)
            if not train_items or not val_items:
                raise ChargenError("lines mode needs at least one non-blank line in the text and in --val-file")
        else:
            train_items, val_items = split_train_val(items, val_fraction)
        source["items"] = len(train_items) + len(val_items)
        return CorpusText("\n".join(train_items), "\n".join(val_items), source, mode, train_items, val_items)
    if val is not None:
        return CorpusText(text, val, source)
    n_val = max(2, round(len(text) * val_fraction))
    if len(text) - n_val < 2:
        raise ChargenError(f"{path} has only {len(text)} characters; a corpus needs far more")
    return CorpusText(text[:-n_val], text[-n_val:], source)


def min_train_chars(batch_size: int, bptt: int) -> int:
    """The shortest training text that fills one batch: every stream needs bptt + 1."""
    return batch_size * (bptt + 1)


def epoch_steps(n_chars: int, batch_size: int, bptt: int) -> int:
    """Updates in one pass over ``n_chars`` cut into ``batch_size`` streams of ``bptt``-long
    chunks (the last chunk of a pass may be shorter)."""
    return max(1, math.ceil((n_chars // batch_size - 1) / bptt))


def batchify(ids: np.ndarray, n_streams: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Cut ``ids`` into ``n_streams`` contiguous streams: a (length, n_streams) tensor whose
    column ``j`` is the ``j``-th piece of the text. The ragged tail is dropped."""
    length = len(ids) // n_streams
    if length < 2:
        raise ChargenError(f"{len(ids)} tokens are too few for {n_streams} streams")
    data = torch.from_numpy(np.ascontiguousarray(ids[: length * n_streams]))
    return data.view(n_streams, length).t().contiguous().to(device)


def chunk_length(rng: np.random.Generator, bptt: int, variable: bool) -> int:
    """The next chunk's length. AWD-LSTM's variable BPTT (Merity et al. 2017) draws it
    around ``bptt`` (and now and then around ``bptt / 2``) so that chunk boundaries move
    from epoch to epoch and every position is sometimes far from a boundary."""
    if not variable:
        return bptt
    centre = bptt if rng.random() < 0.95 else bptt / 2
    return int(np.clip(round(rng.normal(centre, 5)), max(5, bptt // 4), 2 * bptt))


class Streams:
    """The (length, n_streams) id tensor and how to take chunks from it."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.length, self.n_streams = data.shape

    def chunk(self, position: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs at rows [position, position + T) and targets one row later, for every
        stream; T is ``bptt`` or less at the end of the streams."""
        t = min(bptt, self.length - 1 - position)
        x = self.data[position : position + t].long()
        y = self.data[position + 1 : position + 1 + t].long()
        return x, y

    def finished(self, position: int) -> bool:
        """True once every target in the streams has been used."""
        return position >= self.length - 1
