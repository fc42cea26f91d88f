"""Sampling speed: the lean one-step path against the reference (nn.LSTM per character).

For the shipped default model and for randomly initialised models of other sizes, it draws
``--length`` characters per sample (a tenth of that for 3x1024) with 1, 8 and 64 samples in
parallel, on each path, and prints chars/s (all samples together) and the ratio lean /
reference. The two paths draw the same characters for a seed (checked here on every row,
and in the tests). ``Sampler`` takes the lean path for up to 8 samples at once.

    python benchmarks/sampling.py          # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import chargen  # noqa: E402
from chargen.model import CharLSTM, ModelConfig  # noqa: E402
from chargen.sample import LEAN_MAX_SAMPLES, Sampler  # noqa: E402


def speed(model, tokenizer, num_samples: int, length: int, lean: bool | None) -> tuple[float, list[str]]:
    sampler = Sampler(model, tokenizer, "\n", num_samples=num_samples, seed=0, lean=lean)
    list(sampler.pieces(20))  # warm up: the prime, the first steps
    start = time.perf_counter()
    steps = sum(1 for _ in sampler.pieces(length, temperature=0.8))
    return steps * num_samples / (time.perf_counter() - start), sampler.texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=2000, help="characters per sample (default 2000)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    shipped = chargen.load(ROOT / "models" / "shakespeare", device="cpu")
    models = [("shipped shakespeare (1x512)", shipped.model)]
    for hidden, layers in ((256, 1), (1024, 3)):
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=shipped.tokenizer.vocab_size, hidden=hidden, layers=layers)
        models.append((f"random init {layers}x{hidden}", CharLSTM(config).eval()))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.length} characters per sample\n")
    print("| model | samples | reference chars/s | lean chars/s | lean / reference | same text | default path |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for name, model in models:
        for n in (1, 8, 64):
            length = args.length if model.config.hidden < 1024 else args.length // 10
            reference, reference_texts = speed(model, shipped.tokenizer, n, length, lean=False)
            lean, lean_texts = speed(model, shipped.tokenizer, n, length, lean=True)
            print(f"| {name} | {n} | {reference:,.0f} | {lean:,.0f} | {lean / reference:.2f} | "
                  f"{'yes' if lean_texts == reference_texts else 'no'} | "
                  f"{'lean' if n <= LEAN_MAX_SAMPLES else 'reference'} |", flush=True)


if __name__ == "__main__":
    main()
