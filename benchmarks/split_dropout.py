"""Dropout at one rate on the LSTM's input (the embedding) and another on its output (before
the head), as AWD-LSTM sets ``dropouti`` and ``dropout`` apart, on a suite text at fixed
steps against chargen's one rate for both (issue 33, part 2: what else might pay in the
many-epoch regime). chargen is not changed: for each setting this process patches
``CharLSTM.forward`` to apply chargen's locked dropout at the two rates.

    python -m benchmarks.split_dropout --text play --steps 3400 --settings 0.2:0.2 0.1:0.3 0:0.3 0.3:0.1

A setting is IN:OUT, each in [0, 1); 0.2:0.2 is chargen's own at dropout 0.2. ``--dropout``
does not count here (each setting names its own). Equal steps, so only the setting differs.
Rows go to OUT/results.jsonl.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from unittest.mock import patch

import torch

from benchmarks.common import OUT, append_jsonl, command_line
from benchmarks.suite_texts import suite_corpus
from benchmarks.weight_drop import equal_steps_arguments, equal_steps_model, equal_steps_row, rate_pair
from chargen.model import CharLSTM, LockedDropout


def setting(value: str) -> tuple[float, float]:
    """IN:OUT, each in [0, 1)."""
    return rate_pair(value, "IN:OUT", "0.1:0.3")


@contextmanager
def split(p_in: float, p_out: float):
    """``CharLSTM.forward``, for the block, dropping the LSTM's input with ``p_in`` and its
    output with ``p_out`` (chargen's locked masks; none in eval mode)."""
    drop_in, drop_out = LockedDropout(p_in), LockedDropout(p_out)

    def forward(self: CharLSTM, x: torch.Tensor, state=None):
        state = state if state is not None else self.initial_state(x.shape[1], x.device)
        drop_in.train(self.training), drop_out.train(self.training)
        out, state = self.lstm(drop_in(self.embed(x)), state)
        return self.head(drop_out(out)), state

    with patch.object(CharLSTM, "forward", forward):
        yield


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    equal_steps_arguments(parser, OUT / "split_dropout")
    parser.add_argument("--settings", nargs="+", type=setting, default=[(0.2, 0.2), (0.1, 0.3)],
                        help="IN:OUT each")
    args = parser.parse_args(argv)
    model = equal_steps_model(parser, args)
    corpus = suite_corpus(args.text)
    for p_in, p_out in args.settings:
        name = f"{args.text}-{args.layers}x{args.hidden}-in{p_in:g}-out{p_out:g}"
        with split(p_in, p_out):  # (between layers, nn.LSTM's own at the larger of the two)
            row = equal_steps_row(corpus, args.out, name, replace(model, dropout=max(p_in, p_out)), args.steps,
                                  seed=args.seed)
        row |= {"text": args.text, "input_dropout": p_in, "output_dropout": p_out}
        append_jsonl(args.out / "results.jsonl", row)
        print(row, flush=True)


if __name__ == "__main__":
    main()
