"""What ``--save-every 1`` costs: the same run with and without a checkpoint every minute.

Trains one model on Shakespeare twice in this process, alternately without and with
``--save-every 1 --keep 3`` (a resume point every minute of training, the last four kept),
for the same number of steps (fitted to about ``--minutes`` from a short probe), with rare
validations so that the clock's checkpoints are nearly all there is. Every checkpoint is
timed where it is written (``TrainerState.save``, the resume point, its kept name and the
latest weights). Prints the time a checkpoint takes, their share of the training time, and
the training time of the run that saves against the one that does not.

    python -m benchmarks.save_every                  # ~8 min on 2 cores (2x512, 3.2M parameters)
    python -m benchmarks.save_every --hidden 1024    # a 50 MB resume point
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import chargen
from benchmarks.common import ROOT, command_line, cpu_name
from chargen import trainer_state
from chargen.record import read_record


def timed_saves() -> list[float]:
    """Time every ``TrainerState.save`` from now on; the list the times go to."""
    times, save = [], trainer_state.TrainerState.save

    def timed(self, *args, **kwargs) -> None:
        start = time.perf_counter()
        save(self, *args, **kwargs)
        times.append(time.perf_counter() - start)

    trainer_state.TrainerState.save = timed
    return times


def train(corpus: chargen.Corpus, out: Path, model: chargen.ModelConfig, steps: int, save_every: float | None
          ) -> float:
    config = chargen.TrainConfig(steps=steps, eval_every=10**9, sample_chars=0, precision="fp32", device="cpu",
                                 save_every=save_every, keep=3 if save_every else 0)
    result = chargen.train(corpus, out, model, config)
    return read_record(out).summary.train_seconds if result else 0.0


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=3.5, help="training time of each run (default 3.5)")
    args = parser.parse_args()
    corpus = chargen.load_corpus(ROOT / "corpora" / "shakespeare.txt", val_fraction=0.01)
    model = chargen.ModelConfig(hidden=args.hidden, layers=args.layers, dropout=0.0)
    times = timed_saves()
    with tempfile.TemporaryDirectory() as tmp:
        probe = train(corpus, Path(tmp) / "probe", model, 20, None)
        steps = max(20, round(args.minutes * 60 / (probe / 20)))
        plain = train(corpus, Path(tmp) / "plain", model, steps, None)
        times.clear()
        saving = train(corpus, Path(tmp) / "saving", model, steps, 1.0)
        state_mb = (Path(tmp) / "saving" / "trainer" / "state.safetensors").stat().st_size / 2**20
    clock_saves = times[:-1]  # (the last is the end of the run's own checkpoint, which both runs write)
    print(f"\n{args.layers}x{args.hidden} LSTM, {steps:,} steps, {cpu_name()}; a resume point of {state_mb:.0f} MB\n")
    print("| measure | value |\n| --- | ---: |")
    print(f"| checkpoints by the clock (--save-every 1 --keep 3) | {len(clock_saves)} |")
    if clock_saves:
        print(f"| time of one: median, most | {statistics.median(clock_saves):.3f} s, {max(clock_saves):.3f} s |")
        print(f"| their share of the saving run's training time | {sum(clock_saves) / saving:.2%} |")
    print(f"| training time: without, with | {plain:.1f} s, {saving:.1f} s |")
    print(f"| with / without | {saving / plain:.3f} |")


if __name__ == "__main__":
    main()
