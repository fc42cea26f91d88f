"""An exponential moving average of the weights (Polyak averaging, as AWD-LSTM's averaged
SGD) on a suite text at fixed steps (issue 33, part 2: what else might pay in the
many-epoch regime, where dropout's noise is in every step's weights). chargen is not
changed: for each setting this process patches the trainer to keep an average of the
weights after every update, from a start step on, and to score the validation text with
the average in place of the live weights (the live ones train on).

    python -m benchmarks.weight_average --text play --steps 3400 --dropout 0.2 --settings 0 0.999 0.9995

A setting is the average's decay per step (0: none, chargen as it is; 0.999 averages over
about the last 1,000 steps), optionally :START, the step it starts at (0.999:1000). Each
validation scores the average it has so far; the best one counts, as in chargen. Rows go
to OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from unittest.mock import patch

import torch

from benchmarks.common import OUT, append_jsonl, command_line
from benchmarks.suite_texts import suite_corpus
from benchmarks.weight_drop import equal_steps_arguments, equal_steps_model, equal_steps_row
from chargen.train import Trainer


def setting(value: str) -> tuple[float, int]:
    """DECAY[:START]: a decay in [0, 1) and a start step of 0 or more."""
    try:
        parts = value.split(":")
        decay, start = float(parts[0]), int(parts[1]) if len(parts) == 2 else 0
        if len(parts) > 2 or not 0 <= decay < 1 or start < 0:
            raise ValueError
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{value!r} is not DECAY[:START], a decay in [0, 1) and a step, "
                                         "e.g. 0.999:1000") from error
    return decay, start


@contextmanager
def averaged(decay: float, start: int):
    """The trainer, for the block, keeping and scoring an average of its weights."""
    update, score = Trainer.update, Trainer.score
    average: list[torch.Tensor] = []  # parameter by parameter (one run trains in the block)

    def averaging_update(self: Trainer, loss, batch) -> None:
        update(self, loss, batch)
        live = [p.detach() for p in self.run.model.parameters()]
        if self.run.state.progress.step <= start or not average:
            average[:] = [p.clone() for p in live]
        else:
            torch._foreach_lerp_(average, live, 1.0 - decay)

    def averaged_score(self: Trainer, sample):
        if not average:
            return score(self, sample)
        params = list(self.run.model.parameters())
        live = [p.detach().clone() for p in params]
        with torch.no_grad():
            torch._foreach_copy_(params, average)
            try:
                return score(self, sample)
            finally:
                torch._foreach_copy_(params, live)

    if decay == 0:  # none: chargen as it is
        yield
        return
    with patch.multiple(Trainer, update=averaging_update, score=averaged_score):
        yield


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    equal_steps_arguments(parser, OUT / "weight_average")
    parser.add_argument("--settings", nargs="+", type=setting, default=[(0.0, 0), (0.999, 0)],
                        help="DECAY[:START] each")
    args = parser.parse_args(argv)
    model = equal_steps_model(parser, args)
    corpus = suite_corpus(args.text)
    for decay, start in args.settings:
        name = f"{args.text}-{args.layers}x{args.hidden}:{args.dropout:g}-e{args.embedding}-avg{decay:g}:{start}"
        with averaged(decay, start):
            row = equal_steps_row(corpus, args.out, name, model, args.steps, seed=args.seed)
        row |= {"text": args.text, "decay": decay, "start": start}
        append_jsonl(args.out / "results.jsonl", row)
        print(row, flush=True)


if __name__ == "__main__":
    main()
