"""Reading a text file in pieces, so that a corpus of any size is never one Python string.

A file is decoded chunk by chunk (an incremental decoder keeps a character that straddles
two chunks whole) and read twice: once to count its characters, hash it and find its
vocabulary, once to encode each chunk straight into a compact id array (one byte per
character for most texts). An array too big to keep in memory comfortably is
memory-mapped onto an unlinked temporary file, so the kernel can page it in and out.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ChargenError
from .tokenizer import MAX_CODE_POINT, CharTokenizer, check_vocabulary_size, code_points

ERROR_POLICIES = ("strict", "replace", "ignore")
CHUNK_BYTES = 1 << 24
# Ids bigger than this are memory-mapped onto a temporary file (in $TMPDIR) rather than held
# in memory: past a few hundred MB, letting the kernel page them beats pinning them.
MEMMAP_MIN_BYTES = 1 << 28


def check_file(path: str | os.PathLike) -> Path:
    """The path of a readable, non-empty file, or a clear error."""
    path = Path(path)
    try:
        if not path.exists():
            raise ChargenError(f"{path}: no such file; check the path")
        if path.is_dir():
            raise ChargenError(f"{path} is a directory; give a text file")
        if not os.access(path, os.R_OK):
            raise ChargenError(f"{path}: cannot read (permission denied); check its permissions")
        if path.stat().st_size == 0:
            raise ChargenError(f"{path} is empty; give a file with text in it")
    except OSError as e:  # a name too long, a loop of links...
        raise ChargenError(f"{path}: {e.strerror or e}; check the path") from None
    return path


def iter_text(
    path: str | os.PathLike, encoding: str = "utf-8", errors: str = "strict", chunk_bytes: int | None = None
) -> Iterator[str]:
    """The file's text in pieces of about ``chunk_bytes``, without a leading byte-order mark;
    every way the file can fail to read or decode becomes one clear error."""
    if errors not in ERROR_POLICIES:
        raise ChargenError(f"--errors must be one of {', '.join(ERROR_POLICIES)}, not {errors!r}")
    path = check_file(path)
    try:
        codec = codecs.lookup(encoding)
    except LookupError:
        raise ChargenError(f"unknown encoding {encoding!r}; try utf-8 or latin-1") from None
    if not codec._is_text_encoding:  # base64, hex, rot13...: codecs, but not for text
        raise ChargenError(f"{encoding!r} is not a text encoding; try utf-8 or latin-1")
    decoder = codec.incrementaldecoder(errors)
    offset = newlines = 0  # bytes read before the current chunk, and the line breaks in them
    at_start = True
    try:
        with open(path, "rb") as file:
            while True:
                data = file.read(chunk_bytes or CHUNK_BYTES)
                buffered = decoder.getstate()[0]
                try:
                    piece = decoder.decode(data, final=not data)
                except UnicodeDecodeError as e:
                    # The decoder saw its buffered bytes (the tail of the last chunk) and then
                    # this chunk: place the bad byte in the file from there.
                    raise decode_error(path, encoding, e, offset - len(buffered),
                                       newlines - buffered.count(b"\n")) from None
                except UnicodeError as e:  # e.g. UTF-16 without a byte-order mark
                    raise ChargenError(f"{path} cannot be read as {encoding} ({e}); pass --encoding with the "
                                       "file's real encoding") from None
                if at_start and piece:
                    at_start = False
                    piece = piece.removeprefix("\ufeff")  # a byte-order mark is not part of the text
                if piece:
                    yield piece
                if not data:
                    return
                offset += len(data)
                newlines += data.count(b"\n")
    except OSError as e:
        raise ChargenError(f"{path}: cannot read ({e.strerror}); check the file") from None


def decode_error(path: Path, encoding: str, e: UnicodeDecodeError, base: int, base_newlines: int) -> ChargenError:
    """Where in the file the undecodable byte is, given where the decoder's input began."""
    where = base + e.start
    line = base_newlines + e.object.count(b"\n", 0, e.start) + 1
    return ChargenError(
        f"{path} is not valid {encoding}: byte 0x{e.object[e.start]:02x} at offset {where} (line {line}); "
        "pass --encoding with the file's real encoding (e.g. latin-1) or --errors replace"
    )


def read_text(path: str | os.PathLike, encoding: str = "utf-8", errors: str = "strict") -> str:
    """The whole file as one string (for files that fit comfortably in memory)."""
    text = "".join(iter_text(path, encoding, errors))
    if not text:
        raise ChargenError(f"{path} has no text; give a file with text in it")
    return text


def read_head(path: str | os.PathLike, n_chars: int, encoding: str = "utf-8",
              errors: str = "strict") -> tuple[str, bool]:
    """The file's first ``n_chars`` characters (or fewer), and whether that is all of it."""
    pieces, count = [], 0
    for piece in iter_text(path, encoding, errors, chunk_bytes=min(CHUNK_BYTES, 4 * n_chars + 4)):
        pieces.append(piece)
        count += len(piece)
        if count > n_chars:
            return "".join(pieces)[:n_chars], False
    return "".join(pieces), True


@dataclass
class TextScan:
    """What a first pass over a file finds."""

    n_chars: int
    sha256: str  # of the text as UTF-8, first 16 hex digits: a resumed run checks it is fed the same text
    present: np.ndarray  # bool per code point: which characters occur


def scan_text(path: str | os.PathLike, encoding: str = "utf-8", errors: str = "strict") -> TextScan:
    """Count, hash and collect the characters of the file, one chunk at a time. A file with
    more distinct characters than a model may have is refused as soon as that shows."""
    present = np.zeros(MAX_CODE_POINT + 1, dtype=bool)
    digest, n_chars = hashlib.sha256(), 0
    for piece in iter_text(path, encoding, errors):
        n_chars += len(piece)
        if piece.isascii():  # most chunks of most texts: bytes are the code points
            data = piece.encode("ascii")
            present[:128] |= np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=128) > 0
        else:
            data = piece.encode("utf-8", "surrogatepass")
            present[code_points(piece)] = True
            check_vocabulary_size(int(np.count_nonzero(present)))
        digest.update(data)
    if not n_chars:
        raise ChargenError(f"{path} has no text; give a file with text in it")
    return TextScan(n_chars, digest.hexdigest()[:16], present)


def tokenizer_for(*scans: TextScan) -> CharTokenizer:
    """The vocabulary of every character the scanned files hold, in code-point order."""
    present = np.logical_or.reduce([scan.present for scan in scans])
    check_vocabulary_size(int(np.count_nonzero(present)))
    return CharTokenizer([chr(c) for c in np.flatnonzero(present)])


def empty_ids(n: int, dtype: np.dtype) -> np.ndarray:
    """An array for ``n`` ids: in memory, or memory-mapped when it is big."""
    if n * np.dtype(dtype).itemsize < MEMMAP_MIN_BYTES:
        return np.empty(n, dtype=dtype)
    try:
        with tempfile.TemporaryFile(prefix="chargen-ids-") as file:  # unlinked: gone when unmapped
            # Reserve the blocks now: a full disk is then this clear error, not a SIGBUS
            # when a page of a sparse file is first written.
            if hasattr(os, "posix_fallocate"):  # (not on macOS)
                os.posix_fallocate(file.fileno(), 0, n * np.dtype(dtype).itemsize)
            return np.memmap(file, dtype=dtype, mode="w+", shape=(n,))
    except OSError as e:
        raise ChargenError(
            f"cannot make a {n * np.dtype(dtype).itemsize / 2**20:,.0f} MB temporary file for the encoded text in "
            f"{tempfile.gettempdir()} ({e.strerror}); set TMPDIR to a folder with room"
        ) from None


def encode_file(path: str | os.PathLike, tokenizer: CharTokenizer, n_chars: int,
                encoding: str = "utf-8", errors: str = "strict") -> np.ndarray:
    """The file's ids, encoded chunk by chunk into one compact array of ``n_chars``."""
    ids = empty_ids(n_chars, tokenizer.dtype)
    encode_into(path, tokenizer, [ids], encoding, errors)
    return ids


def encode_into(path: str | os.PathLike, tokenizer: CharTokenizer, parts: list[np.ndarray],
                encoding: str = "utf-8", errors: str = "strict") -> None:
    """The file's ids, encoded chunk by chunk into ``parts`` one after the other (slices of
    bigger arrays, say its training head and its validation tail), whose lengths add up to
    the file's characters."""
    ascii_table = tokenizer.encode("".join(map(chr, range(128))))
    total, filled, k, at = sum(len(part) for part in parts), 0, 0, 0  # (the part being filled, and where)
    for piece in iter_text(path, encoding, errors):
        if filled + len(piece) > total:
            filled += len(piece)
            break
        if piece.isascii():
            ids = ascii_table[np.frombuffer(piece.encode("ascii"), dtype=np.uint8)]
        else:
            ids = tokenizer.encode(piece)
        filled += len(ids)
        while len(ids):
            while at == len(parts[k]):
                k, at = k + 1, 0
            take = min(len(ids), len(parts[k]) - at)
            parts[k][at : at + take] = ids[:take]
            ids, at = ids[take:], at + take
    if filled != total:
        raise ChargenError(f"{path} changed while it was being read; train on a copy that stays put")
