"""Training speed of this tree against an earlier revision's, in one sitting: ``chargen train``
as a user runs it (set-up, the loop, logging, validation and checkpoints), the two
alternated round by round so that a machine that slows down slows both.

    python -m benchmarks.train_ab --against eacbb90 --rounds 4      # ~5 min on 2 cores
    ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks.train_ab --against eacbb90 --rounds 4

Each run trains the same fp32 model on the same text for the same steps; its figure is the
median chars/s of its log lines past the first (metrics.jsonl), and its wall time. The
result is the median over rounds of this tree's figure over the other's (1.00: the same).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, checkout, child_env, command_line, read_jsonl, remove_checkout


def one_run(tree: Path, text: Path, out: Path, args: argparse.Namespace) -> tuple[float, float]:
    """chars/s (median of the log lines past the first) and wall seconds of one training run."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "chargen", "train", str(text), "--out", str(out), "--steps", str(args.steps),
               "--hidden", str(args.hidden), "--layers", "1", "--embedding", "64", "--batch-size", "32",
               "--bptt", "128", "--eval-every", str(args.steps // 2), "--log-every", "10", "--sample-chars", "0",
               "--precision", "fp32", "--device", "cpu", "--quiet", "--seed", "1"]
    env = child_env(tree)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, cwd=tree, capture_output=True)
    wall = time.perf_counter() - start
    speeds = [e["chars_per_s"] for e in read_jsonl(out / "metrics.jsonl") if e["event"] == "train"][1:]
    return statistics.median(speeds), wall


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--against", required=True, help="the earlier revision (a commit)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--text", type=Path, default=ROOT / "corpora" / "shakespeare.txt")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chargen-train-ab-"))
    trees = {"before": checkout(args.against, work / "before"), "this": ROOT}
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    try:
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                figures[name].append(one_run(trees[name], args.text.resolve(), work / f"run-{name}", args))
                speed, wall = figures[name][-1]
                print(f"round {round_ + 1} {name:6s} {speed:9,.0f} chars/s  {wall:6.1f} s", flush=True)
    finally:
        remove_checkout(trees["before"])
        shutil.rmtree(work, ignore_errors=True)
    speed = statistics.median(t[0] / b[0] for t, b in zip(figures["this"], figures["before"], strict=True))
    wall = statistics.median(t[1] / b[1] for t, b in zip(figures["this"], figures["before"], strict=True))
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "native")
    print(f"\n1x{args.hidden}, batch 32 x 128, {args.steps} steps, fp32, {isa}: this tree / {args.against}: "
          f"chars/s {speed:.3f}x, wall time {wall:.3f}x (medians of {args.rounds} alternated rounds)")


if __name__ == "__main__":
    main()
