"""The validation bump of the Quality run (issue 16, part 4): where in the validation
streams the loss rises, and whether the training loss rises with it.

Trains the Quality section's configuration with a fixed plan (1x512, dropout 0.1, weight
decay 0.01, 32 x 128, ``--steps`` the plan the native Quality run fitted to 420 s) on
corpora/shakespeare.txt, and at every ``--every`` steps up to ``--until`` scores the
validation streams by position since their zero start: the first 128 characters, 128 to
1,024, and the rest. The validation streams start from a zero state, as every evaluation
does; in training, a stream's state is zero only at the start of an epoch. If the bump is
the model forgetting how to start from zero, it is in the first columns only.

    python -m benchmarks.bump                       # the curve, as in the Quality runs (minutes on 2 cores)
    python -m benchmarks.bump --reset-every 1000    # with a stream's state reset now and then
    python -m benchmarks.bump --forget-bias-1       # as chargen started the model before issue 16

``--reset-every N`` zeroes, at each step, the state of each stream with probability
bptt / N: on average every N characters, so the model keeps meeting zero-state starts.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import OUT, ROOT, command_line
from chargen import ModelConfig, TrainConfig, load_corpus
from chargen.prepare import prepare_run
from chargen.train import Trainer

BUCKETS = ((0, 128), (128, 1024), (1024, None))


@torch.inference_mode()
def loss_by_position(model: torch.nn.Module, streams, bptt: int = 256) -> list[float]:
    """Mean validation loss in each of BUCKETS of positions since the zero start."""
    model.eval()
    losses, state, position = [], None, 0
    while position < streams.length - 1:
        x, y = streams.chunk(position, bptt)
        logits, state = model(x, state)
        losses.append(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
                      .view(y.shape).mean(1))
        position += x.shape[0]
    model.train()
    per_position = torch.cat(losses)
    return [per_position[start:end].mean().item() for start, end in BUCKETS]


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--steps", type=int, default=3290, help="the plan (the schedule's length)")
    parser.add_argument("--until", type=int, default=1400, help="stop after this many steps")
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--reset-every", type=int, help="reset a stream's state every N characters on average")
    parser.add_argument("--forget-bias-1", action="store_true",
                        help="start with a forget-gate bias of 1, as chargen did before issue 16")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--out", type=Path, default=OUT / "bump")
    args = parser.parse_args()

    corpus = load_corpus(ROOT / "corpora" / "shakespeare.txt")
    model = ModelConfig(hidden=512, layers=1, dropout=0.1)
    config = TrainConfig(steps=args.steps, eval_every=args.every, sample_chars=0, weight_decay=0.01,
                         precision=args.precision, device="cpu")
    run = args.out / (f"reset-{args.reset_every}" if args.reset_every else "plain")
    run = run.with_name(run.name + ("-fb1" if args.forget_bias_1 else ""))
    stop, last_train = threading.Event(), {}

    def on_event(event: dict) -> None:
        if event["event"] == "train":
            last_train.update(event)
        if event["event"] == "val":
            cold, middle, warm = loss_by_position(trainer.run.model, trainer.run.feed.val_streams)
            print(f"| {event['step']:,} | {last_train.get('lr', 0):.2e} | {last_train.get('loss', float('nan')):.4f} | "
                  f"{event['val_loss']:.4f} | {cold:.4f} | {middle:.4f} | {warm:.4f} |", flush=True)
            if event["step"] >= args.until:
                stop.set()

    trainer = Trainer(prepare_run(corpus, run, model, config, force=True), on_event=on_event)
    if args.reset_every:
        reset_now_and_then(trainer, config.bptt / args.reset_every)
    if args.forget_bias_1:
        from benchmarks.recipe import with_forget_bias

        with_forget_bias(trainer.run.model)
    print(f"precision {trainer.run.autocast_dtype or 'fp32'}; state reset every {args.reset_every or 'epoch only'}; "
          f"forget-gate bias {'1' if args.forget_bias_1 else 'as PyTorch initialises it'}")
    print("| step | lr | train loss (last 10 steps) | val loss | first 128 chars | 128-1,024 | after 1,024 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    trainer.fit(stop)


def reset_now_and_then(trainer: Trainer, chance: float) -> None:
    """Each stream's carried state is zeroed before a step with probability ``chance``."""
    forward, generator = trainer.forward, torch.Generator().manual_seed(0)

    def forward_with_resets(batch):
        carry = trainer.run.state.carry
        if carry is not None:
            keep = (torch.rand(carry[0].shape[1], generator=generator) >= chance).to(carry[0].dtype)
            trainer.run.state.carry = (carry[0] * keep[None, :, None], carry[1] * keep[None, :, None])
        return forward(batch)

    trainer.forward = forward_with_resets


if __name__ == "__main__":
    main()
