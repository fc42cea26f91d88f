"""Weight drop (DropConnect on the LSTM's recurrent weights, as in AWD-LSTM) on the suite's
play text, at fixed steps against chargen's own dropout alone (issue 33, part 2: what else
might pay in the many-epoch regime). chargen is not changed: for each setting this process
patches ``CharLSTM.forward`` to train on a dropped copy of each ``weight_hh`` (one mask a
step, scaled, as ``F.dropout`` does) and scores with the whole weights.

    python -m benchmarks.weight_drop --steps 3400 --settings 0:0.2 0.3:0.2

A setting is WEIGHT_DROP:DROPOUT (1x512, weight decay 0.01). Equal steps, not equal time:
the patched step is slower (a mask over 4·hidden x hidden each step), so a win here would
still have to pay for its time. Rows go to OUT/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import OUT, append_jsonl, command_line, cpu_name
from benchmarks.suite_texts import TEXTS, suite_corpus
from chargen import Corpus, train
from chargen.config import TrainConfig
from chargen.errors import ChargenError
from chargen.model import CharLSTM, ModelConfig


def dropped_forward(p: float):
    """``CharLSTM.forward`` training on recurrent weights dropped with probability ``p``."""
    whole = CharLSTM.forward

    def forward(self: CharLSTM, x: torch.Tensor, state=None):
        if not (self.training and p > 0):
            return whole(self, x, state)
        state = state if state is not None else self.initial_state(x.shape[1], x.device)
        lstm = self.lstm
        weights = [F.dropout(w, p) if name.startswith("weight_hh") else w
                   for name, w in zip(lstm._flat_weights_names, lstm._flat_weights, strict=True)]
        out, h, c = torch._VF.lstm(self.drop(self.embed(x)), state, weights, True, lstm.num_layers,
                                   lstm.dropout, True, False, False)
        return self.head(self.drop(out)), (h, c)

    return forward


def rate_pair(value: str, form: str, example: str) -> tuple[float, float]:
    """Two rates A:B, each in [0, 1), or argparse's refusal naming ``form`` with ``example``."""
    try:
        pair = tuple(float(v) for v in value.split(":"))
    except ValueError:
        pair = ()
    if len(pair) != 2 or not all(0 <= v < 1 for v in pair):
        raise argparse.ArgumentTypeError(f"{value!r} is not {form}, two numbers in [0, 1), e.g. {example}")
    return pair


def setting(value: str) -> tuple[float, float]:
    """WEIGHT_DROP:DROPOUT, each in [0, 1)."""
    return rate_pair(value, "WEIGHT_DROP:DROPOUT", "0.1:0.2")


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--steps", type=int, default=3400)
    parser.add_argument("--settings", nargs="+", type=setting, default=[(0.0, 0.2), (0.3, 0.2)],
                        help="WEIGHT_DROP:DROPOUT each")
    parser.add_argument("--out", type=Path, default=OUT / "weight_drop")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, not {args.steps}")
    corpus = suite_corpus("play")
    whole = CharLSTM.forward
    for weight_drop, dropout in args.settings:
        name = f"{weight_drop:g}:{dropout:g}"
        CharLSTM.forward = dropped_forward(weight_drop)
        try:
            model = ModelConfig(hidden=512, layers=1, dropout=dropout)
            row = equal_steps_row(corpus, args.out, name, model, args.steps)
        finally:
            CharLSTM.forward = whole
        append_jsonl(args.out / "results.jsonl", row)
        print(row, flush=True)


def equal_steps_arguments(parser: argparse.ArgumentParser, out: Path) -> None:
    """The flags of a run at fixed steps on a suite text: --text, --steps, the model, --out."""
    parser.add_argument("--text", choices=sorted(TEXTS), default="play")
    parser.add_argument("--steps", type=int, default=3400)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--embedding", type=int, default=ModelConfig.embedding)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed,
                        help="another seed: another initialisation and other dropout masks (the noise between runs)")
    parser.add_argument("--out", type=Path, default=out)


def equal_steps_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ModelConfig:
    """The model those flags ask for, or a one-line refusal (exit 2) naming the flag."""
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, not {args.steps}")
    try:  # chargen's own checks name the flag: --hidden, --embedding, --layers, --dropout, --seed
        TrainConfig(seed=args.seed)
        return ModelConfig(embedding=args.embedding, hidden=args.hidden, layers=args.layers, dropout=args.dropout)
    except ChargenError as error:
        parser.error(str(error))


def equal_steps_row(corpus: Corpus, out: Path, name: str, model: ModelConfig, steps: int,
                    weight_decay: float = 0.01, decay: str = "cosine", base_lr: float | None = None,
                    seed: int = TrainConfig.seed) -> dict:
    """Train ``model`` for ``steps`` (weight decay 0.01, chargen's peak lr and seed unless told)
    under OUT/runs/NAME-STEPS (NAME-STEPS-seedN for another seed): its row."""
    run = f"{name.replace(':', '_')}-{steps}" + ("" if seed == TrainConfig.seed else f"-seed{seed}")
    try:  # chargen's refusals (an --out that is a file, a full disk) in one line, exit 2, as the CLI's
        result = train(corpus, out / "runs" / run, model,
                       TrainConfig(steps=steps, weight_decay=weight_decay, decay=decay, base_lr=base_lr, seed=seed,
                                   sample_chars=0), force=True)
    except ChargenError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    seconds = json.loads((result.run_dir / "config.json").read_text())["summary"]["train_seconds"]
    return {"setting": name, "steps": steps, "seed": seed, "best_val_loss": round(result.best_val_loss, 4),
            "ms_per_step": round(1000 * seconds / steps, 1), "cpu": cpu_name()}


if __name__ == "__main__":
    main()
