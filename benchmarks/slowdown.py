"""Whether a ``--max-time`` run ends on its budget when the machine changes speed under it:
short timed runs slowed through chargen's fault seam (``chargen.faults``: every step and
validation made to take longer, busy, from a moment on), each try's wall time as a share of
its budget, and what its final validation scored (the whole validation text, or a sample).

    python -m benchmarks.slowdown                       # both cases, three tries each: ~1 minute
    python -m benchmarks.slowdown --cases sample --tries 5

``halving``: the machine halves its speed halfway, and the whole validation text costs
1.5% of the budget (the final validation should be whole). ``sample``: scoring the whole
validation text costs 12% of the budget, over what the run may keep for it, so the final
validation should be a sample. The run is a tiny 2x64 model on the head of the shipped
Shakespeare, on one thread, for 8 s (as tests/test_slowdown.py runs the same two cases, whose
``timed_try`` this is). A try within 2% of its budget is on time. Rows go to OUT/results.jsonl.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks.common import OUT, ROOT, append_jsonl, command_line, cpu_name
from chargen import faults, load_corpus, train
from chargen.config import TrainConfig
from chargen.feeds import StreamFeed
from chargen.model import CharLSTM, ModelConfig

BUDGET = 8.0
MODEL = ModelConfig(vocab_size=1, embedding=8, hidden=64, layers=2, dropout=0.1)
TRAINING = TrainConfig(batch_size=4, bptt=16, steps=None, max_time=BUDGET, eval_every=50, log_every=2,
                       sample_chars=0, warmup_steps=2, base_batch_size=4, device="cpu", seed=7)


@dataclass(frozen=True)
class Case:
    chars: int  # of the text
    val_fraction: float
    share: float  # of the budget that scoring the whole validation text takes
    factor: float  # how much slower every step and validation is from halfway


CASES = {"halving": Case(46_000, 0.3, share=0.015, factor=2.0), "sample": Case(62_000, 0.4, share=0.12, factor=1.0)}


class SlowMachine:
    """The slow fault: from ``after`` seconds on, every step and validation takes ``factor``
    times as long; validations take ``validation`` times as long throughout (so that
    scoring the validation text is a known share of the budget, on any machine).

    The extra time is spent busy, not asleep: a sleep between steps lets the cores' caches
    and threads go cold, and the step after it ran 1.4 times as long (1.9 ms, then 2.65,
    this tiny model on a 2-core Xeon), so a factor of 2 slowed steps 2.8 times and
    validations (one long call) 2 times. A run that scales a validation's cost with its
    steps then thought the whole text too dear for the time left, and scored a sample
    (most tries in CI's AVX2 pass, 2026-12-05)."""

    def __init__(self, after: float, factor: float, validation: float = 1.0) -> None:
        self.start, self.after, self.factor, self.validation = time.perf_counter(), after, factor, validation

    def __call__(self, what: str, seconds: float) -> None:
        late = time.perf_counter() - self.start >= self.after
        times = (self.factor if late else 1.0) * (self.validation if what == "validation" else 1.0)
        until = time.perf_counter() + seconds * (times - 1)
        while time.perf_counter() < until:
            pass


def scoring_seconds(corpus, model_config: ModelConfig) -> float:
    """What scoring the whole validation text takes here: the fastest of three after a first
    that pays for allocation. (One timing caught the host slow in CI on 2026-12-05: the fault
    then made validation too cheap, and the final validation fitted whole.)"""
    feed = StreamFeed(corpus.train_ids, corpus.val_ids, 4, 16, False, "cpu")
    model = CharLSTM(replace(model_config, vocab_size=corpus.tokenizer.vocab_size))
    feed.evaluate(model)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        feed.evaluate(model)
        times.append(time.perf_counter() - start)
    return min(times)


def timed_try(folder: Path, text: str, case: Case, model: ModelConfig = MODEL, training: TrainConfig = TRAINING):
    """One BUDGET-second run of ``text`` in ``folder`` (made here) on a machine slowed as ``case``
    says: (result, log lines, wall seconds). The wall time counts what ``train`` does, from
    reading nothing (the corpus is loaded before) to its last checkpoint."""
    folder.mkdir()
    (folder / "text.txt").write_text(text, encoding="utf-8")
    corpus = load_corpus(folder / "text.txt", val_fraction=case.val_fraction)
    validation = max(1.0, case.share * BUDGET / scoring_seconds(corpus, model))
    import torch._dynamo  # noqa: F401  (imported by train before its clock starts: not in the wall time either)
    lines: list[str] = []
    with faults.injected(faults.Faults(slow=SlowMachine(BUDGET / 2, case.factor, validation))):
        start = time.perf_counter()
        result = train(corpus, folder / "run", model, training, log=lines.append)
        wall = time.perf_counter() - start
    return result, lines, wall


def final_validation(result) -> str:
    """How the run's last validation scored: ``whole``, ``sample of N`` or ``none``."""
    vals = [e for e in result.history if e["event"] == "val" and e["step"] == result.step]
    if not vals:
        return "none"
    return "whole" if vals[-1]["whole"] else f"sample of {vals[-1]['chars']:,}"


def main() -> None:
    parser = command_line(__doc__, "benchmarks.slowdown")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT / "slowdown")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the tests run, and a tiny model runs fastest
    shakespeare = (ROOT / "corpora" / "shakespeare.txt").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.cases:
            case = CASES[name]
            for attempt in range(1, args.tries + 1):
                result, _, wall = timed_try(Path(scratch) / f"{name}-{attempt}", shakespeare[:case.chars], case)
                row = {"case": name, "try": attempt, "budget": BUDGET, "wall": round(wall, 3),
                       "percent": round(100 * wall / BUDGET, 1), "final": final_validation(result),
                       "steps": result.step, "cpu": cpu_name(), "isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "native")}
                append_jsonl(args.out / "results.jsonl", row)
                print(f"{name} try {attempt}: {row['percent']}% of {BUDGET:g} s, {result.step:,} steps, "
                      f"final validation {row['final']}", flush=True)


if __name__ == "__main__":
    main()
