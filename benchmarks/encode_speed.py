"""Bulk encoding speed: chargen's numpy lookup table against Hugging Face ``tokenizers``
on the same text, and a check that both give the same ids.

    python -m benchmarks.encode_speed [TEXT_FILE]   # default corpora/shakespeare.txt; a few seconds
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from benchmarks.common import ROOT, command_line
from chargen.textfile import read_text
from chargen.tokenizer import CharTokenizer


def best_seconds(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("text", type=Path, nargs="?", default=ROOT / "corpora" / "shakespeare.txt",
                        help="the text to encode (default corpora/shakespeare.txt)")
    path = parser.parse_args().text
    text = read_text(path)
    mb = len(text.encode("utf-8")) / 1e6
    tok = CharTokenizer.from_text(text)
    hf = Tokenizer.from_str(tok.to_json())
    hf.encode_special_tokens = True  # ("<pad>" in a text is five characters, as chargen reads it)
    # tokenizers is slow per character: time it on a slice and scale, to keep the run short.
    piece = text[: min(len(text), 500_000)]
    piece_mb = len(piece.encode("utf-8")) / 1e6
    fast = best_seconds(lambda: tok.encode(text))
    slow = best_seconds(lambda: hf.encode(piece), repeats=1)
    same = np.array_equal(np.asarray(hf.encode(piece).ids), tok.encode(piece))
    print(f"text: {path} ({mb:.2f} MB, {len(text):,} chars, vocabulary {tok.vocab_size})\n")
    print("| encoder | seconds | MB/s |")
    print("|---|---|---|")
    print(f"| chargen numpy table (whole text) | {fast:.3f} | {mb / fast:,.0f} |")
    print(f"| tokenizers Tokenizer.encode ({piece_mb:.2f} MB slice) | {slow:.3f} | {piece_mb / slow:,.1f} |")
    print(f"\nspeedup: {(mb / fast) / (piece_mb / slow):,.0f}x; identical ids on the slice: {same}")


if __name__ == "__main__":
    main()
