"""Which of chargen's recipe choices cost against a plain loop, at a fixed number of steps
(so the figures do not depend on the machine's speed): issue 16's "recipe gap".

Every row trains 1x256 (embedding 64, dropout 0) in fp32 on the 1 MB slice of
``benchmarks.budget`` (32 streams x 128), for ``--steps`` updates, and is scored on the whole
validation file by chargen's evaluator:

- ``plain``: ``benchmarks.plain_loop`` (Adam 2e-3, cosine to a tenth, PyTorch's init);
- ``chargen, plain's lr``: chargen's loop with lr 2e-3, no warmup, no weight decay;
- ``chargen``: chargen's loop with its own schedule (3e-3, 100 warmup steps, weight decay 0.01);
- each chargen row again ``+ forget bias 1``: the forget-gate bias set to 1 at the start
  (Jozefowicz et al. 2015), as chargen did before issue 16;
- ``+ beta2 0.999``: Adam's usual beta2 in place of chargen's 0.99.

    python -m benchmarks.recipe --steps 600 2400      # minutes per row on 2 cores
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from benchmarks import plain_loop
from benchmarks.budget import prepare
from benchmarks.common import OUT, command_line
from chargen import ModelConfig, TrainConfig, load_corpus, train
from chargen.corpus import eval_streams
from chargen.evaluate import evaluate_streams
from chargen.model import CharLSTM

VARIANTS = ("plain", "chargen, plain's lr", "chargen, plain's lr + forget bias 1", "chargen, plain's lr + beta2 0.999",
            "chargen", "chargen + forget bias 1")


def with_forget_bias(model: CharLSTM) -> None:
    """The old initialisation: forget-gate bias 1 in bias_ih, 0 in bias_hh."""
    h = model.config.hidden
    with torch.no_grad():
        for layer in range(model.config.layers):
            getattr(model.lstm, f"bias_ih_l{layer}")[h : 2 * h].fill_(1.0)
            getattr(model.lstm, f"bias_hh_l{layer}")[h : 2 * h].fill_(0.0)


def run_chargen(variant: str, steps: int, train_file: Path, val_file: Path, out: Path) -> float:
    corpus = load_corpus(train_file, val_path=val_file)
    plain_lr = dict(base_lr=2e-3, warmup_steps=0, weight_decay=0.0) if "plain's lr" in variant else \
        dict(weight_decay=0.01)
    config = TrainConfig(steps=steps, eval_every=10**9, sample_chars=0, precision="fp32", device="cpu", **plain_lr)
    original_init, original_adamw = CharLSTM.__init__, torch.optim.AdamW

    def init(self: CharLSTM, model_config: ModelConfig) -> None:
        original_init(self, model_config)
        with_forget_bias(self)

    try:
        if "forget bias" in variant:
            CharLSTM.__init__ = init
        if "beta2" in variant:
            torch.optim.AdamW = lambda params, lr, betas: original_adamw(params, lr=lr, betas=(0.9, 0.999))
        result = train(corpus, out / variant.replace(" ", "_").replace(",", "").replace("'", ""),
                       ModelConfig(hidden=256, layers=1, dropout=0.0), config, force=True)
    finally:
        CharLSTM.__init__, torch.optim.AdamW = original_init, original_adamw
    return result.best_val_loss


def run_plain(steps: int, train_file: Path, val_file: Path) -> float:
    train_text, val_text = (p.read_text(encoding="utf-8") for p in (train_file, val_file))
    chars = sorted(set(train_text) | set(val_text))
    index = {c: i for i, c in enumerate(chars)}
    train_ids, val_ids = (np.array([index[c] for c in text], dtype=np.int64) for text in (train_text, val_text))
    model, _, _ = plain_loop.train(train_ids, len(chars), 256, 1, 0.0, steps=steps)
    return evaluate_streams(model, eval_streams(val_ids))


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--steps", type=int, nargs="+", default=[600])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", type=Path, default=OUT / "recipe")
    args = parser.parse_args()
    train_file, val_file = prepare(OUT / "budget")
    print("| variant | " + " | ".join(f"{s:,} steps" for s in args.steps) + " |")
    print("| --- | " + " | ".join("---:" for _ in args.steps) + " |")
    for variant in args.variants:
        losses = [run_plain(s, train_file, val_file) if variant == "plain" else
                  run_chargen(variant, s, train_file, val_file, args.out) for s in args.steps]
        print(f"| {variant} | " + " | ".join(f"{loss:.4f}" for loss in losses) + " |", flush=True)


if __name__ == "__main__":
    main()
