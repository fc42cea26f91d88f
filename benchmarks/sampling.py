"""Sampling, in-process: the lean path's speed against the reference, and where a step's time
goes in the app's shared loop (issue 17).

``--only speed``: for the shipped default model and for randomly initialised models of other
sizes, it draws ``--length`` characters per sample (a tenth of that for 3x1024) with 1, 8
and 64 samples in parallel, on the lean one-step path and on the reference (nn.LSTM per
character), and prints chars/s (all samples together) and the ratio lean / reference. The
two paths draw the same characters for a seed (checked here on every row, and in the
tests). ``Sampler`` takes the lean path for up to 8 samples at once.

``--only parts``: for the shipped Shakespeare model (1x512), best of ``--repeats``:
- the step's products at 1 and 32 rows: oneDNN's inner product on packed weights (what the
  loop uses: a row's numbers do not depend on the batch) against MKL's ``addmm``;
- a pick (``prepare`` of the per-row options, then ``pick_prepared``'s draw) and the whole
  lean step at 1 and 32 rows;
- one sample drawn by ``Sampler`` in a new thread, with torch's default intra-op threads and
  with one (the loop's thread takes ``LOOP_THREADS``);
- the shared loop (``SharedLoop``) stepping 1, 8, 32 and 128 texts at once: chars/s in all,
  and at 32 texts the share of a tick the products take.

    python -m benchmarks.sampling                  # both parts: about 2 minutes on 2 cores
    python -m benchmarks.sampling --only speed     # about a minute
    python -m benchmarks.sampling --only parts     # about a minute
"""

from __future__ import annotations

import threading
import time
from functools import partial

import torch

import chargen
from benchmarks.common import ROOT, command_line
from chargen.batching import LOOP_THREADS, Generation, SharedLoop
from chargen.model import CharLSTM, ModelConfig
from chargen.sample import LEAN_MAX_SAMPLES, Sampler, SamplingOptions, draw_race, pick_prepared, prepare, row_options

PARTS = ("speed", "parts")


# --- speed: lean against the reference -----------------------------------------------------
def speed(model, tokenizer, num_samples: int, length: int, lean: bool | None) -> tuple[float, list[str]]:
    sampler = Sampler(model, tokenizer, "\n", num_samples=num_samples, seed=0, lean=lean)
    list(sampler.pieces(20))  # warm up: the prime, the first steps
    start = time.perf_counter()
    steps = sum(1 for _ in sampler.pieces(length, temperature=0.8))
    return steps * num_samples / (time.perf_counter() - start), sampler.texts


def speed_table(shipped, length: int, threads: int) -> None:
    torch.set_num_threads(threads)
    models = [("shipped shakespeare (1x512)", shipped.model)]
    for hidden, layers in ((256, 1), (1024, 3)):
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=shipped.tokenizer.vocab_size, hidden=hidden, layers=layers)
        models.append((f"random init {layers}x{hidden}", CharLSTM(config).eval()))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {length} characters per sample\n")
    print("| model | samples | reference chars/s | lean chars/s | lean / reference | same text | default path |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for name, model in models:
        for n in (1, 8, 64):
            chars = length if model.config.hidden < 1024 else length // 10
            reference, reference_texts = speed(model, shipped.tokenizer, n, chars, lean=False)
            lean, lean_texts = speed(model, shipped.tokenizer, n, chars, lean=True)
            print(f"| {name} | {n} | {reference:,.0f} | {lean:,.0f} | {lean / reference:.2f} | "
                  f"{'yes' if lean_texts == reference_texts else 'no'} | "
                  f"{'lean' if n <= LEAN_MAX_SAMPLES else 'reference'} |", flush=True)


# --- parts: where a step's time goes ---------------------------------------------------------
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


def parts_tables(shipped, repeats: int) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; the loop's thread takes {LOOP_THREADS}\n")
    print("| part | oneDNN, packed | MKL addmm |\n| --- | ---: | ---: |")
    with torch.inference_mode():
        products(shipped.model, repeats)
        picks(shipped.tokenizer.vocab_size, repeats)
        lean_steps(shipped, repeats)
    default = sampler_in_a_thread(shipped, None, repeats)
    one = sampler_in_a_thread(shipped, 1, repeats)
    print(f"\none sample in a new thread: {default:,.0f} chars/s with torch's default intra-op threads, "
          f"{one:,.0f} with one\n")
    loop = SharedLoop(shipped.model.stepper())
    print("| texts in the loop | chars/s in all |\n| ---: | ---: |")
    for texts in (1, 8, 32, 128):
        speeds = [loop_speed(shipped, loop, texts, 2000 if texts < 32 else 500) for _ in range(repeats)]
        print(f"| {texts} | {max(speeds):,.0f} |")
    loop.close()
    tick, products_only = tick_share(shipped, loop, repeats)
    print(f"\na tick of 32 texts: {tick:,.0f} µs, of which the step's products {products_only:,.0f} µs")


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--only", choices=PARTS, help="one part (default: speed, then parts)")
    parser.add_argument("--length", type=int, default=2000, help="speed: characters per sample (default 2000)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="speed: torch's intra-op threads (default: torch's own, %(default)s here)")
    parser.add_argument("--repeats", type=int, default=3, help="parts: timings of each, the best kept (default 3)")
    args = parser.parse_args()
    shipped = chargen.load(ROOT / "models" / "shakespeare", device="cpu")
    if args.only in (None, "speed"):
        speed_table(shipped, args.length, args.threads)
    if args.only is None:
        print()
    if args.only in (None, "parts"):
        # (torch's own threads again: the parts compare its default with the loop's one thread)
        torch.set_num_threads(parser.get_default("threads"))
        parts_tables(shipped, args.repeats)


if __name__ == "__main__":
    main()
