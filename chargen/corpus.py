"""Text in, batches out: a corpus loaded as compact ids (a stream, or a list of items),
the train/validation split, and the contiguous streams that truncated BPTT walks through.

The core idea (as in PyTorch's word_language_model ``batchify``): cut the token ids into
``n_streams`` equal contiguous pieces, stack them as the rows of an (n_streams, length)
tensor, and walk along them ``bptt`` positions at a time. Position ``t`` of every stream
continues position ``t - 1``, so the LSTM state at the end of one chunk is the right start
for the next.
"""

from __future__ import annotations

import codecs
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import ChargenError
from .lines import MODES, LineItems, detect_mode, file_items, held_out, item_tokenizer
from .modes import ModeName
from .textfile import TextScan, check_file, empty_ids, encode_file, encode_into, read_head, scan_text, tokenizer_for
from .tokenizer import EOS_ID, CharTokenizer

PathLike = str | os.PathLike
# In stream mode, the end of each file of a corpus of many: a new document follows. Its own
# token rather than a reset of the state, which would have to fall mid-chunk
# (benchmarks/README.md, "Fine-tuning, documents").
DOCUMENT_END = EOS_ID
# A folder with more files than this is refused: it is a folder above the texts (a home, /).
MAX_FOLDER_FILES = 100_000
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
    path: PathLike | Sequence[PathLike],
    *,
    val_path: PathLike | None = None,
    val_fraction: float = 0.05,
    encoding: str = "utf-8",
    errors: str = "strict",
    mode: str = "stream",
) -> Corpus:
    """Read a corpus: a file, or several files and folders (``corpus_files``). ``mode`` is
    stream (one long text), lines (one item per line) or auto (lines when the (first) file
    reads as a list of short items; ``source["mode_reason"]`` says why). Validation is
    ``val_path``, or else ``val_fraction`` of the text: the tail of a stream (of every file's,
    at most ``MAX_VAL_CHARS`` in all), a random sample of the items of a list."""
    if mode not in MODES:
        raise ChargenError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if val_path is None and not 0.0 < val_fraction < 0.5:
        raise ChargenError(f"--val-fraction must be between 0 and 0.5, not {val_fraction}")
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    files, skipped = corpus_files(paths, encoding)
    source: dict = {"path": " ".join(map(str, paths))}
    if skipped:
        source["skipped"] = skipped
    if mode == "auto":
        mode, source["mode_reason"] = choose_mode(files[0], encoding, errors)
    if len(paths) > 1 or Path(paths[0]).is_dir():
        return load_documents(files, val_path, val_fraction, encoding, errors, source, mode)
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
    return items_corpus(file_tokenizer, ids, val_ids, path, val_path, val_fraction, source)


def items_corpus(file_tokenizer: CharTokenizer, ids: np.ndarray, val_ids: np.ndarray | None, path: PathLike,
                 val_path: PathLike | None, val_fraction: float, source: dict) -> Corpus:
    """A list's items, from its ids: the validation split, and the items' own vocabulary."""
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


def corpus_files(paths: Sequence[PathLike], encoding: str = "utf-8") -> tuple[list[Path], list[str]]:
    """The files to train on, in order: each file given, and each folder's files (sorted,
    its subfolders' too), each once; and a line for each thing a folder holds that is left
    out: hidden files and folders, and files that are not text."""
    files: dict[Path, Path] = {}
    skipped: list[str] = []
    for given in map(Path, paths):
        if not given.is_dir():
            files.setdefault(check_file(given).resolve(), given)
            continue
        for path in folder_files(given, skipped):
            why = "a hidden file" if path.name.startswith(".") else not_text(path, encoding)
            if why:
                skipped.append(f"skipped {path}: {why}")
            else:
                files.setdefault(path.resolve(), path)
    if not files:
        raise ChargenError(f"{' '.join(map(str, paths))}: no text files to train on"
                           + (f" ({len(skipped)} skipped: {skipped[0]})" if skipped else ""))
    return list(files.values()), skipped


def folder_files(folder: Path, skipped: list[str]) -> list[Path]:
    """The files in ``folder`` and its subfolders, sorted, hidden folders left out (and
    named in ``skipped``); refused past MAX_FOLDER_FILES before any is opened."""
    found: list[Path] = []
    for root, folders, names in os.walk(folder):
        for name in sorted(folders):
            if name.startswith("."):
                skipped.append(f"skipped {Path(root) / name}/: a hidden folder")
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        found += [Path(root) / name for name in sorted(names)]
        if len(found) > MAX_FOLDER_FILES:
            raise ChargenError(f"{folder} holds more than {MAX_FOLDER_FILES:,} files; give the folder of your "
                               "texts, not one above it")
    return found


def not_text(path: Path, encoding: str) -> str | None:
    """Why a folder's file is left out (None: it is taken), judged from its first 8 KB."""
    try:
        if not path.is_file():  # (a pipe or a device would block, or never end)
            return "not a regular file"
        if path.stat().st_size == 0:  # (also what a kernel's files in /proc say: never read)
            return "empty"
        with path.open("rb") as f:
            head = f.read(8192)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if not head:
        return "empty"
    try:
        decoder = codecs.getincrementaldecoder(encoding)()
    except LookupError:
        return None  # (the unknown encoding is named when the first file is read)
    if b"\x00" in head and not codecs.lookup(encoding).name.startswith(("utf-16", "utf-32")):
        return "not text (it holds NUL bytes)"
    try:
        decoder.decode(head, final=False)
    except UnicodeDecodeError:
        return f"not text in {encoding} (--encoding to read it otherwise)"
    return None


def load_documents(files: list[Path], val_path: PathLike | None, val_fraction: float, encoding: str, errors: str,
                   source: dict, mode: str) -> Corpus:
    """Many files as one corpus, read in chunks like one big file. In stream mode each file
    is a document: its text, then DOCUMENT_END; validation is the tail of every file (or
    ``val_path``). In lines mode the items of all the files are pooled."""
    scans = [scan_text(f, encoding, errors) for f in files]
    source.update(files=[{"path": str(f), "chars": s.n_chars, "sha256": s.sha256} for f, s in zip(files, scans,
                                                                                                  strict=True)],
                  chars=sum(s.n_chars for s in scans),
                  sha256=hashlib.sha256(" ".join(s.sha256 for s in scans).encode()).hexdigest()[:16])
    val_scan = None
    if val_path is not None:
        val_scan = scan_text(val_path, encoding, errors)
        source.update(val_path=str(val_path), val_chars=val_scan.n_chars, val_sha256=val_scan.sha256)
    tokenizer = tokenizer_for(*scans, *([val_scan] if val_scan else []))
    if mode == "lines":
        if "\n" not in tokenizer:  # (the files' items are kept apart by a line break)
            tokenizer = CharTokenizer(sorted([*tokenizer.chars, "\n"]))
        ids = joined(files, scans, [0] * len(files), tokenizer, tokenizer.id_of("\n"), encoding, errors)[0]
        val_ids = None if val_scan is None else encode_file(val_path, tokenizer, val_scan.n_chars, encoding, errors)
        return items_corpus(tokenizer, ids, val_ids, source["path"], val_path, val_fraction, source)
    if val_scan is not None:
        tails = [0] * len(files)
    else:
        source["val_fraction"] = val_fraction
        scale = min(1.0, MAX_VAL_CHARS / (val_fraction * source["chars"]))
        tails = [min(s.n_chars - 1, round(s.n_chars * val_fraction * scale)) for s in scans]
    train_ids, val_ids = joined(files, scans, tails, tokenizer, DOCUMENT_END, encoding, errors)
    if val_scan is not None:
        val_ids = encode_file(val_path, tokenizer, val_scan.n_chars, encoding, errors)
    if len(val_ids) < 2:
        raise ChargenError("the files are too short to hold out a validation text; raise --val-fraction or give "
                           "--val-file")
    return Corpus(source, tokenizer, "stream", train_ids, val_ids)


def joined(files: list[Path], scans: list[TextScan], tails: list[int], tokenizer: CharTokenizer, end: int,
           encoding: str, errors: str) -> tuple[np.ndarray, np.ndarray]:
    """The files' ids, each followed by ``end``: their heads in one array, their last
    ``tails`` characters (where not 0) in another."""
    heads = [s.n_chars - t for s, t in zip(scans, tails, strict=True)]
    ids = empty_ids(sum(heads) + len(files), tokenizer.dtype)
    held = empty_ids(sum(tails) + sum(t > 0 for t in tails), tokenizer.dtype)
    at, held_at = 0, 0
    for path, head, tail in zip(files, heads, tails, strict=True):
        encode_into(path, tokenizer, [ids[at : at + head], held[held_at : held_at + tail]], encoding, errors)
        ids[at + head], at = end, at + head + 1
        if tail:
            held[held_at + tail], held_at = end, held_at + tail + 1
    return ids, held


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
