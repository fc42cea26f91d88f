"""Dropout that changes over the run (Liu et al. 2023, "Dropout reduces underfitting": late
dropout for a model that overfits) on a suite text at fixed steps, against chargen's constant
dropout (issue 33, part 2). The texts part ways on how much dropout pays at one exposure (the
play and Python want the rule's 0.2-0.28 at 411 s, prose and Russian about 0.1): a dropout
that starts low and rises leaves a text that is still learning its early steps free, and
holds back one that has begun to memorise. chargen is not changed: for each setting this
process patches the trainer to set the model's dropout after every update, from the share
of the planned steps done.

    python -m benchmarks.dropout_schedule --text play --steps 3400 --settings const:0.2 ramp:0.4 late:0.5:0.3

A setting is SHAPE:PEAK[:START]: ``const:P``, P all run (chargen's); ``ramp:P``, from 0 at the
start straight up to P at the end; ``late:START:P``, 0 until START (a share of the run,
0-1) and P from then on. ``--dropout`` does not count here (each setting names its own).
Rows go to OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import contextmanager
from unittest.mock import patch

from benchmarks.common import OUT, append_jsonl, command_line
from benchmarks.suite_texts import suite_corpus
from benchmarks.weight_drop import equal_steps_arguments, equal_steps_model, equal_steps_row
from chargen.train import Trainer

Schedule = Callable[[float], float]  # the share of the planned steps done -> dropout


def setting(value: str) -> tuple[str, Schedule]:
    """const:P, ramp:P or late:START:P, each P in [0, 1) and START in [0, 1]."""
    shape, *numbers = value.split(":")
    try:
        numbers = [float(number) for number in numbers]
        if shape in ("const", "ramp") and len(numbers) == 1:
            start, peak = (0.0 if shape == "const" else 1.0), numbers[0]
        elif shape == "late" and len(numbers) == 2 and 0 <= numbers[0] <= 1:
            start, peak = numbers
        else:
            raise ValueError
        if not 0 <= peak < 1:
            raise ValueError
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{value!r} is not const:P, ramp:P or late:START:P (P in [0, 1), "
                                         "START a share of the run in [0, 1]), e.g. ramp:0.4") from error
    if shape == "ramp":
        return value, lambda done: peak * done
    return value, lambda done: peak if done >= start else 0.0


@contextmanager
def scheduled(schedule: Schedule):
    """The trainer, for the block, setting its model's dropout by ``schedule`` from the start
    and after every update."""
    begin, update = Trainer.fit, Trainer.update

    def set_by_schedule(self: Trainer) -> None:
        progress = self.run.state.progress
        self.run.model.set_dropout(round(schedule(progress.step / max(1, progress.total_steps)), 4))

    def scheduled_fit(self: Trainer, *args, **kwargs):
        set_by_schedule(self)
        return begin(self, *args, **kwargs)

    def scheduled_update(self: Trainer, loss, batch) -> None:
        update(self, loss, batch)
        set_by_schedule(self)

    with patch.multiple(Trainer, fit=scheduled_fit, update=scheduled_update):
        yield


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    equal_steps_arguments(parser, OUT / "dropout_schedule")
    parser.add_argument("--settings", nargs="+", type=setting, default=[setting("const:0.2"), setting("ramp:0.4")],
                        help="const:P, ramp:P or late:START:P each")
    args = parser.parse_args(argv)
    model = equal_steps_model(parser, args)
    corpus = suite_corpus(args.text)
    for name, schedule in args.settings:
        run_name = f"{args.text}-{args.layers}x{args.hidden}-e{args.embedding}-drop-{name}"
        with scheduled(schedule):
            row = equal_steps_row(corpus, args.out, run_name, model, args.steps, seed=args.seed)
        row |= {"text": args.text, "schedule": name}
        append_jsonl(args.out / "results.jsonl", row)
        print(row, flush=True)


if __name__ == "__main__":
    main()
