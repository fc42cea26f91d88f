"""Character vocabulary: one token per Unicode code point.

The vocabulary is saved as a Hugging Face ``tokenizers`` file (``tokenizer.json``) so that
other tools can read it, but bulk encoding goes through a numpy lookup table indexed by
code point: ``tokenizers`` pays a per-token cost that makes a 5 MB corpus take seconds,
while the table does hundreds of MB/s. Both paths give the same ids (tested).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from .errors import ChargenError

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(len(SPECIALS))
MAX_CODE_POINT = 0x10FFFF
# Distinct characters a model may have. Chinese or Japanese text needs a few thousand; far
# more means the file is not text (or a character model is the wrong tool for it), and the
# embedding and output layers would grow with it.
MAX_VOCAB = 20_000


def compact_dtype(vocab_size: int) -> np.dtype:
    """The smallest integer type that holds every id (uint8 for most texts)."""
    if vocab_size <= 256:
        return np.dtype(np.uint8)
    if vocab_size <= 32768:
        return np.dtype(np.int16)
    return np.dtype(np.int32)


def check_vocabulary_size(n_chars: int) -> None:
    if n_chars > MAX_VOCAB:
        raise ChargenError(
            f"the text has {n_chars:,} distinct characters; a character model takes at most "
            f"{MAX_VOCAB:,}. Is it really text? If it is, train on a part in fewer scripts"
        )


def unknown_chars_error(what: str, unknown: Sequence[str]) -> ChargenError:
    shown = ", ".join(repr(c) for c in unknown[:10])
    more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
    return ChargenError(f"the {what} has characters the model never saw in training: {shown}{more}; "
                        "remove or replace them")


def recode(ids: np.ndarray, table: np.ndarray, window: int = 1 << 24) -> None:
    """Map every id through ``table``, in place, ``window`` ids at a time (the array may be
    memory-mapped and bigger than memory)."""
    for start in range(0, len(ids), window):
        ids[start : start + window] = table[ids[start : start + window]]


def code_points(text: str) -> np.ndarray:
    """The text's code points as uint32, without a Python-level loop."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class CharTokenizer:
    """Ids 0-3 are the specials (pad, unk, bos, eos); then one id per character."""

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        for ch in chars:
            if len(ch) != 1:
                raise ChargenError(f"tokenizer vocabulary entry {ch!r} is not a single character")
        if len(set(chars)) != len(chars):
            raise ChargenError("tokenizer vocabulary has a character twice")
        self.chars: list[str] = chars
        self.vocab_size: int = len(SPECIALS) + len(chars)
        self.dtype: np.dtype = compact_dtype(self.vocab_size)
        self._id_of = {ch: i + len(SPECIALS) for i, ch in enumerate(chars)}
        self._lookup: np.ndarray | None = None
        # Decoding maps ids back to code points; specials decode to nothing.
        self._decode_table = np.array([0] * len(SPECIALS) + [ord(c) for c in chars], dtype=np.uint32)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The vocabulary of every distinct character in ``text``, in code-point order."""
        unique = np.unique(code_points(text))
        check_vocabulary_size(len(unique))
        return cls([chr(c) for c in unique])

    def __contains__(self, ch: str) -> bool:
        return ch in self._id_of

    def id_of(self, ch: str) -> int:
        return self._id_of.get(ch, UNK_ID)

    def _table(self) -> np.ndarray:
        if self._lookup is None:
            table = np.full(MAX_CODE_POINT + 1, UNK_ID, dtype=self.dtype)
            table[self._decode_table[len(SPECIALS):]] = np.arange(len(SPECIALS), self.vocab_size)
            self._lookup = table
        return self._lookup

    def encode(self, text: str) -> np.ndarray:
        """Ids for every character; unseen characters become ``<unk>``."""
        return self._table()[code_points(text)]

    def unknown_chars(self, text: str) -> list[str]:
        """Distinct characters of ``text`` that are not in the vocabulary, in order seen."""
        cps = code_points(text)
        unknown = cps[self._table()[cps] == UNK_ID]
        values, first = np.unique(unknown, return_index=True)
        return [chr(c) for c in values[np.argsort(first)]]

    def encode_known(self, text: str, what: str = "text") -> np.ndarray:
        """Like ``encode`` but refuses characters the model never saw, naming them."""
        ids = self.encode(text)
        if (ids == UNK_ID).any():
            raise unknown_chars_error(what, self.unknown_chars(text))
        return ids

    def recode_table(self, target: CharTokenizer) -> np.ndarray:
        """Indexed by this vocabulary's ids: the ``target``'s id of the same character
        (``<unk>`` where it has none); specials stay."""
        table = np.array([target.id_of(ch) for ch in self.chars], dtype=target.dtype)
        return np.concatenate([np.arange(len(SPECIALS), dtype=target.dtype), table])

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text for the ids; special tokens are dropped."""
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        arr = arr[arr >= len(SPECIALS)]
        return self._decode_table[arr].tobytes().decode("utf-32-le", "surrogatepass")

    def decode_aligned(self, ids: np.ndarray) -> str:
        """One character per id, specials as U+FFFD, so that string positions are id
        positions (for slicing many items out of one decoded block)."""
        table = self._decode_table.copy()
        table[: len(SPECIALS)] = 0xFFFD
        return table[np.asarray(ids)].tobytes().decode("utf-32-le", "surrogatepass")

    # --- tokenizer.json -------------------------------------------------------------
    def to_hf(self) -> Tokenizer:
        """The equivalent Hugging Face tokenizer (WordLevel over single code points)."""
        vocab = {tok: i for i, tok in enumerate(SPECIALS)}
        vocab.update(self._id_of)
        hf = Tokenizer(models.WordLevel(vocab, unk_token=SPECIALS[UNK_ID]))
        # In Oniguruma syntax (?m) makes "." match newlines too: one piece per code point.
        hf.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
        hf.decoder = decoders.Fuse()
        hf.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
        hf.encode_special_tokens = True
        return hf

    def to_json(self) -> str:
        return self.to_hf().to_str(pretty=True)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        """Rebuild from ``tokenizer.json`` text, checking it is a chargen vocabulary."""
        try:
            data = json.loads(text)
            vocab = data["model"]["vocab"]
            if data["model"]["type"] != "WordLevel" or not isinstance(vocab, dict):
                raise ValueError("not a WordLevel vocabulary")
            by_id = sorted(vocab.items(), key=lambda kv: kv[1])
            if [i for _, i in by_id] != list(range(len(by_id))):
                raise ValueError("ids are not 0..n-1")
            if tuple(tok for tok, _ in by_id[: len(SPECIALS)]) != SPECIALS:
                raise ValueError("special tokens are not <pad> <unk> <bos> <eos>")
            if len(by_id) - len(SPECIALS) > MAX_VOCAB:
                raise ValueError(f"{len(by_id) - len(SPECIALS):,} characters, more than a model takes")
            return cls([tok for tok, _ in by_id[len(SPECIALS):]])
        except RecursionError:
            raise ChargenError("tokenizer.json is not a chargen character vocabulary (nested too deep)") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ChargenError(f"tokenizer.json is not a chargen character vocabulary ({e})") from None
