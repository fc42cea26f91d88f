"""How far a ``--max-time`` run's size probe was from the steps the run then took: per run
folder, the probe's time for a step of the chosen size (the fastest of its timed steps),
the plan's first and last fitted step times (the run's own steps, sustained), their ratio,
and the characters per parameter the probe promised against those the run trained on.
The size rule compares the promise with its line (``chargen/autosize.py``); a size whose
sustained steps run slower than its probe is chosen on more than it gets.

    python -m benchmarks.probe_drift benchmarks/out/suite/runs/*/*auto*
    python -m benchmarks.probe_drift --dropout-cost 1x512 2x512    # what dropout adds to a probed step

``--dropout-cost`` times chargen's probe (``chargen.autosize.probe_speed``: 32 streams of 128,
bf16 where the CPU has native kernels, else fp32; the fastest of four steps) for each size
without dropout and with 0.1, twice in turn: the probe used to time sizes without it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import command_line

BATCH, BPTT, VOCAB = 32, 128, 104

CHOSEN = re.compile(r"^model: (\d+x\d+), chosen .*?probe \(chars/s\) (.*?); "
                    r"\S+ can train on .*?, ([\d.]+) per parameter", re.M)
PARAMS = re.compile(r"^training .*?, ([\d,]+) parameters, ", re.M)
STEP = re.compile(r"^plan: steps of (\d+) streams x (\d+) chars", re.M)
FITTED = re.compile(r"^plan fitted to --max-time \S+: [\d,]+ steps \(([\d.]+) ms a step", re.M)
ENDED = re.compile(r"^(?:stopped \(time\)|finished) at step ([\d,]+)", re.M)


@dataclass(frozen=True)
class Drift:
    size: str
    probe_ms: float  # a step of the chosen size, as the probe timed it
    first_ms: float  # ... as the plan's first fit read the run's own steps
    last_ms: float  # ... and its last
    promised: float  # characters per parameter the probe said the size could train on
    trained: float  # characters per parameter the run trained on

    @property
    def ratio(self) -> float:
        return self.last_ms / self.probe_ms


def number(text: str) -> float:
    return float(text.replace(",", ""))


def read_drift(log: str) -> Drift | None:
    """The drift of one run's log (its log.txt), or None for a run whose size was not chosen
    by the probe (a fixed size, or no --max-time) or that did not finish."""
    chosen, params, step, fitted, ended = (pattern.search(log) for pattern in (CHOSEN, PARAMS, STEP, FITTED, ENDED))
    if not (chosen and params and step and fitted and ended):
        return None
    speeds = dict(re.findall(r"(\d+x\d+) ([\d,]+)", chosen.group(2)))
    step_chars = int(step.group(1)) * int(step.group(2))
    fits = [float(ms) for ms in FITTED.findall(log)]
    return Drift(chosen.group(1), 1000 * step_chars / number(speeds[chosen.group(1)]), fits[0], fits[-1],
                 float(chosen.group(3)), number(ended.group(1)) * step_chars / number(params.group(1)))


def dropout_cost(sizes: list[str]) -> None:
    import torch

    from chargen.autosize import probe_speed
    from chargen.device import resolve_precision
    from chargen.model import ModelConfig

    dtype = resolve_precision("auto", torch.device("cpu"))[0]
    print("| size | precision | ms a step: no dropout | dropout 0.1 |\n| --- | --- | ---: | ---: |")
    for size in sizes:
        layers, hidden = (int(n) for n in size.split("x"))
        ms = {d: [] for d in (0.0, 0.1)}
        for _ in range(2):
            for dropout in ms:
                config = ModelConfig(vocab_size=VOCAB, hidden=hidden, layers=layers, dropout=dropout)
                chars_per_s = probe_speed(config, BATCH, BPTT, torch.device("cpu"), dtype, 4)
                ms[dropout].append(1000 * BATCH * BPTT / chars_per_s)
        precision = "bf16" if dtype == torch.bfloat16 else "fp32"
        print(f"| {size} | {precision} | {', '.join(f'{m:.0f}' for m in ms[0.0])} | "
              f"{', '.join(f'{m:.0f}' for m in ms[0.1])} |")


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR", help="run folders, each with its log.txt")
    parser.add_argument("--dropout-cost", nargs="+", metavar="LAYERSxHIDDEN", help="time these sizes instead")
    args = parser.parse_args()
    if args.dropout_cost:
        return dropout_cost(args.dropout_cost)
    if not args.runs:
        parser.error("give run folders (RUN_DIR), or --dropout-cost with sizes")
    print("| run | size | probe ms a step | fitted: first, last | last / probe "
          "| chars per parameter: promised, trained |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for run in args.runs:
        log = run / "log.txt"
        drift = read_drift(log.read_text(errors="replace")) if log.is_file() else None
        if drift is None:  # (said, not a silent gap in the table)
            print(f"{run}: no size probe in a log.txt there (a size given, no --max-time, or not finished)",
                  file=sys.stderr)
            continue
        print(f"| {run} | {drift.size} | {drift.probe_ms:.1f} | {drift.first_ms:.0f}, {drift.last_ms:.0f} | "
              f"{drift.ratio:.2f} | {drift.promised:.1f}, {drift.trained:.2f} |")


if __name__ == "__main__":
    main()
