"""Weight tying (the head's weights are the embedding's, Press & Wolf 2017; AWD-LSTM) on a
suite text at fixed steps, against the same model untied (issue 33, part 2: what else might
pay in the many-epoch regime). Tying needs the embedding as wide as the LSTM, so both
settings train with ``--embedding`` equal to ``--hidden`` (chargen's own is 64: compare
with ``schedule_knobs --embedding 512`` for what the width alone does). chargen is not
changed: for the tied setting this process patches ``CharLSTM.forward`` to score the
characters with the embedding's matrix and the head's bias; the head's own matrix is left
out of the graph (no gradient, so AdamW leaves it be) and is saved unused.

    python -m benchmarks.tied_weights --text play --steps 3400 --dropout 0.2 --settings untied tied

Rows go to OUT/results.jsonl.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import OUT, append_jsonl, command_line
from benchmarks.suite_texts import suite_corpus
from benchmarks.weight_drop import equal_steps_arguments, equal_steps_model, equal_steps_row
from chargen.model import CharLSTM

SETTINGS = ("untied", "tied")


def tied_forward(self: CharLSTM, x: torch.Tensor, state=None):
    """``CharLSTM.forward`` with the head's matrix taken from the embedding."""
    if state is None:
        state = self.initial_state(x.shape[1], x.device)
    out, state = self.lstm(self.drop(self.embed(x)), state)
    return F.linear(self.drop(out), self.embed.weight, self.head.bias), state


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    equal_steps_arguments(parser, OUT / "tied_weights")
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.set_defaults(embedding=None)
    args = parser.parse_args(argv)
    if args.embedding is None:
        args.embedding = args.hidden
    elif args.embedding != args.hidden:
        parser.error(f"tying needs --embedding equal to --hidden ({args.hidden}), not {args.embedding}")
    model = equal_steps_model(parser, args)
    corpus = suite_corpus(args.text)
    whole = CharLSTM.forward
    for kind in args.settings:
        name = f"{args.text}-{args.layers}x{args.hidden}:{args.dropout:g}-e{args.embedding}-{kind}"
        CharLSTM.forward = tied_forward if kind == "tied" else whole
        try:
            row = equal_steps_row(corpus, args.out, name, model, args.steps, seed=args.seed)
        finally:
            CharLSTM.forward = whole
        row |= {"text": args.text, "embedding": args.embedding, "tied": kind == "tied"}
        append_jsonl(args.out / "results.jsonl", row)
        print(row, flush=True)


if __name__ == "__main__":
    main()
