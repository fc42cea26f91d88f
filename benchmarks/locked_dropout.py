"""chargen's dropout (one mask per row, shared by the chunk's time steps: ``LockedDropout``)
against nn.Dropout's fresh mask for every element of every step, on a suite text at fixed
steps: the loss each reaches, and the milliseconds a step takes (issue 33, part 2).

    python -m benchmarks.locked_dropout --text play --steps 3400 --dropout 0.2
    python -m benchmarks.locked_dropout --layers 2 --steps 1500 --dropout 0.3 --kinds locked element between

Kinds: ``locked`` is chargen's (between stacked layers, nn.LSTM's own dropout, a fresh mask
per element); ``element`` builds the model with nn.Dropout in place of ``LockedDropout``;
``between`` is chargen's with the locked mask between stacked layers too (the layers run one
at a time: ``locked_between_forward``). Nothing else differs (1x512 unless told, weight
decay 0.01, the same seed). About 5 minutes a kind at 3,400 steps of 1x512 on a 2-core Xeon.
Rows go to OUT/results.jsonl.
"""

from __future__ import annotations

import torch
from torch import nn

import chargen.model
from benchmarks.common import OUT, append_jsonl, command_line
from benchmarks.suite_texts import suite_corpus
from benchmarks.weight_drop import equal_steps_arguments, equal_steps_model, equal_steps_row
from chargen.model import CharLSTM, State

CHARGENS_FORWARD = CharLSTM.forward  # (main swaps CharLSTM.forward for a kind's)


def locked_between_forward(self: CharLSTM, x: torch.Tensor, state: State | None = None):
    """``CharLSTM.forward`` with the locked mask between stacked layers as well: in training
    with dropout, one layer at a time (torch.lstm, the op nn.LSTM calls, on a layer's weights)."""
    if self.config.layers == 1 or not self.training or self.drop.p == 0:
        return CHARGENS_FORWARD(self, x, state)
    state = state if state is not None else self.initial_state(x.shape[1], x.device)
    x = self.drop(self.embed(x))
    (h, c), hs, cs = state, [], []
    for k, weights in enumerate(self.lstm.all_weights):
        x, h_k, c_k = torch.lstm(self.drop(x) if k else x, (h[k : k + 1], c[k : k + 1]), weights,
                                 True, 1, 0.0, True, False, False)
        hs.append(h_k)
        cs.append(c_k)
    return self.head(self.drop(x)), (torch.cat(hs), torch.cat(cs))


# each kind: the dropout CharLSTM builds, and its forward
KINDS = {"locked": (chargen.model.LockedDropout, CHARGENS_FORWARD), "element": (nn.Dropout, CHARGENS_FORWARD),
         "between": (chargen.model.LockedDropout, locked_between_forward)}


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    equal_steps_arguments(parser, OUT / "locked_dropout")
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=["locked", "element"])
    args = parser.parse_args(argv)
    if args.dropout == 0:
        parser.error("--dropout must be in (0, 1), not 0: the kinds differ only in how they drop")
    model = equal_steps_model(parser, args)
    corpus = suite_corpus(args.text)
    chosen = chargen.model.LockedDropout, CharLSTM.forward
    for kind in args.kinds:
        # (CharLSTM builds its dropout from this name)
        chargen.model.LockedDropout, CharLSTM.forward = KINDS[kind]
        try:
            name = f"{args.text}-{args.layers}x{args.hidden}-{kind}:{args.dropout:g}"
            row = equal_steps_row(corpus, args.out, name, model, args.steps, seed=args.seed)
        finally:
            chargen.model.LockedDropout, CharLSTM.forward = chosen
        append_jsonl(args.out / "results.jsonl", {"kind": kind, "text": args.text, "layers": args.layers, **row})
        print(row, flush=True)


if __name__ == "__main__":
    main()
