"""Where a sampling step's time goes, for the app's shared loop (issue 17), in-process.

For the shipped Shakespeare model (1x512) it prints, best of ``--repeats``:
- the step's products at 1 and 32 rows: oneDNN's inner product on packed weights (what the
  loop uses: a row's numbers do not depend on the batch) against MKL's ``addmm``;
- a pick (``prepare`` of the per-row options, then ``pick_prepared``'s draw) and the whole lean step at 1 and 32 rows;
- one sample drawn by ``Sampler`` in a new thread, with torch's default intra-op threads and
  with one (the loop's thread takes ``LOOP_THREADS``);
- the shared loop (``SharedLoop``) stepping 1, 8, 32 and 128 texts at once: chars/s in all,
  and at 32 texts the share of a tick the products take.

    python benchmarks/sampling_parts.py          # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import chargen  # noqa: E402
from chargen.batching import LOOP_THREADS, Generation, SharedLoop  # noqa: E402
from chargen.sample import Sampler, SamplingOptions, draw_race, pick_prepared, prepare, row_options  # noqa: E402


def best_microseconds(call, repeats: int, n: int = 1000) -> float:
    """The fastest of ``repeats`` timings of ``n`` calls, per call (machines are noisy)."""
    best = float("inf")
    for _ in range(repeats):
        for _ in range(n // 10):
            call()
        start = time.perf_counter()
        for _ in range(n):
            call()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def products(model, repeats: int) -> None:
    weights = {"recurrent 512->2048": model.lstm.weight_hh_l0.detach(), "head 512->vocab": model.head.weight.detach()}
    for name, weight in weights.items():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        weight_t = weight.t().contiguous()
        for rows in (1, 32):
            x = torch.randn(rows, weight.shape[1])
            one = best_microseconds(partial(torch.ops.mkldnn._linear_pointwise, x, packed, None, "none", [], ""),
                                    repeats)
            mkl = best_microseconds(partial(torch.mm, x, weight_t), repeats)
            print(f"| {name}, {rows} row{'s' * (rows > 1)} | {one:,.0f} µs | {mkl:,.0f} µs |")


def picks(vocab: int, repeats: int) -> None:
    for rows in (1, 32):
        logits = torch.randn(rows, vocab)
        options = row_options(SamplingOptions(0.8, 0, 1.0), rows)
        race = draw_race(rows, vocab, torch.Generator().manual_seed(0))
        took = best_microseconds(lambda: pick_prepared(logits, prepare(*options, vocab), race), repeats)  # noqa: B023
        print(f"| pick, {rows} row{'s' * (rows > 1)} | {took:,.0f} µs | |")


def sampler_in_a_thread(shipped, threads: int | None, repeats: int) -> float:
    speeds: list[float] = []

    def run() -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        sampler = Sampler(shipped.model, shipped.tokenizer, "\n", num_samples=1, seed=0, lean=True)
        list(sampler.pieces(20))
        start = time.perf_counter()
        steps = sum(1 for _ in sampler.pieces(1000, temperature=0.8))
        speeds.append(steps / (time.perf_counter() - start))

    for _ in range(repeats):
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    return max(speeds)


def loop_speed(shipped, loop: SharedLoop, texts: int, length: int) -> float:
    generations = [Generation(Sampler(shipped.model, shipped.tokenizer, "\n", num_samples=1, seed=i, lean=True),
                              SamplingOptions(0.8, 0, 1.0, length)) for i in range(texts)]
    start = time.perf_counter()
    for g in generations:
        loop.submit(g)
    for g in generations:
        g.wait_done(600)
    return texts * length / (time.perf_counter() - start)


def tick_share(shipped, loop: SharedLoop, repeats: int) -> tuple[float, float]:
    """(µs a tick at 32 texts, µs of it in the step's products), in this thread at LOOP_THREADS."""
    torch.set_num_threads(LOOP_THREADS)
    generations = []
    for i in range(32):
        sampler = Sampler(shipped.model, shipped.tokenizer, "\n", num_samples=1, seed=i, lean=True)
        sampler.start()
        generations.append(Generation(sampler, SamplingOptions(0.8, 0, 1.0, 10**9), status="running"))
    tick = best_microseconds(lambda: loop._tick(generations), repeats, n=200)
    h = torch.zeros(32, generations[0].sampler.state[0].shape[-1])
    with torch.inference_mode():
        products_only = sum(best_microseconds(partial(product, h), repeats, n=200) for product in loop.step.products)
    return tick, products_only


def lean_steps(shipped, repeats: int) -> None:
    """The lean step alone (LeanStep: the cell and one product per layer) at 1 and 32 rows."""
    step = shipped.model.stepper()
    for rows in (1, 32):
        ids = torch.zeros(rows, dtype=torch.long)
        state = step.begin(shipped.model.initial_state(rows))
        took = best_microseconds(partial(step, ids, state), repeats)
        print(f"| the lean step, {rows} row{'s' * (rows > 1)} | {took:,.0f} µs | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shipped = chargen.load(ROOT / "models" / "shakespeare", device="cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; the loop's thread takes {LOOP_THREADS}\n")
    print("| part | oneDNN, packed | MKL addmm |\n| --- | ---: | ---: |")
    with torch.inference_mode():
        products(shipped.model, args.repeats)
        picks(shipped.tokenizer.vocab_size, args.repeats)
        lean_steps(shipped, args.repeats)
    default = sampler_in_a_thread(shipped, None, args.repeats)
    one = sampler_in_a_thread(shipped, 1, args.repeats)
    print(f"\none sample in a new thread: {default:,.0f} chars/s with torch's default intra-op threads, "
          f"{one:,.0f} with one\n")
    loop = SharedLoop(shipped.model.stepper())
    print("| texts in the loop | chars/s in all |\n| ---: | ---: |")
    for texts in (1, 8, 32, 128):
        speeds = [loop_speed(shipped, loop, texts, 2000 if texts < 32 else 500) for _ in range(args.repeats)]
        print(f"| {texts} | {max(speeds):,.0f} |")
    loop.close()
    tick, products_only = tick_share(shipped, loop, args.repeats)
    print(f"\na tick of 32 texts: {tick:,.0f} µs, of which the step's products {products_only:,.0f} µs")


if __name__ == "__main__":
    main()
