"""Where the learning rate ends and how much AdamW weight decay (and, for all the settings of
a run, the peak learning rate and the embedding's width), on a suite text at fixed
steps (issue 33, part 2: what else might pay in the many-epoch regime, where a model sees
its text 20 times and more and its validation loss flattens before the plan ends).

    python -m benchmarks.schedule_knobs --text play --steps 3400 --dropout 0.2 \\
        --settings cosine:0.1:0.01 cosine:0:0.01 linear:0:0.01 cosine:0.1:0.1 cosine:0.1:0.3
    python -m benchmarks.schedule_knobs --steps 3400 --dropout 0.2 --base-lr 0.005 --settings cosine:0.1:0.01
    python -m benchmarks.schedule_knobs --steps 3400 --dropout 0.2 --embedding 256 --settings cosine:0.1:0.01

A setting is DECAY:FLOOR:WEIGHT_DECAY: the decay from the peak (``--decay``), the fraction of
the peak it ends at (chargen's is 0.1, not a flag: this process patches the schedule for
the run) and AdamW's decoupled weight decay. chargen's own, as ``--max-time`` chooses it past
an exposure of 8, is cosine:0.1:0.01. Nothing else differs (1x512 unless told, the same seed,
the whole validation text every 250 steps, the best kept): equal steps, so only the setting
differs. About 4 minutes a setting at 3,400 steps of 1x512 on a 2-core Xeon. Rows go to
OUT/results.jsonl.
"""

from __future__ import annotations

import argparse

from benchmarks.common import OUT, append_jsonl, command_line
from benchmarks.suite_texts import suite_corpus
from benchmarks.weight_drop import equal_steps_arguments, equal_steps_model, equal_steps_row
from chargen.config import TrainConfig
from chargen.errors import ChargenError
from chargen.model import ModelConfig
from chargen.schedule import BatchScaling, WarmupDecay


def setting(value: str) -> tuple[str, float, float]:
    """DECAY:FLOOR:WEIGHT_DECAY, e.g. cosine:0.1:0.01, checked by the classes that will take
    it (an exp decay to 0, a weight decay past 1) before any setting trains."""
    parts = value.split(":")
    try:
        decay, floor, weight_decay = parts[0], float(parts[1]), float(parts[2])
        if len(parts) != 3:
            raise ValueError
        WarmupDecay(1.0, 0, 1, decay, floor)
        TrainConfig(weight_decay=weight_decay)
    except (IndexError, ValueError) as error:
        raise argparse.ArgumentTypeError(f"{value!r} is not DECAY:FLOOR:WEIGHT_DECAY, e.g. cosine:0.1:0.01") from error
    except ChargenError as error:
        raise argparse.ArgumentTypeError(f"{value!r}: {error}") from error
    return decay, floor, weight_decay


def floored(floor: float):
    """``BatchScaling.schedule`` with its decay ending at ``floor`` times the peak."""
    whole = BatchScaling.schedule

    def schedule(self: BatchScaling, *args, final_fraction: float = 0.1, **kwargs):
        return whole(self, *args, final_fraction=floor, **kwargs)

    return schedule


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    equal_steps_arguments(parser, OUT / "schedule_knobs")
    parser.add_argument("--settings", nargs="+", type=setting, default=[("cosine", 0.1, 0.01), ("cosine", 0.0, 0.01)],
                        help="DECAY:FLOOR:WEIGHT_DECAY each")
    parser.add_argument("--base-lr", type=float, default=None,
                        help="the peak learning rate at batch 32 (chargen's: by the run's exposure, base_lr_for)")
    args = parser.parse_args(argv)
    model = equal_steps_model(parser, args)
    try:
        TrainConfig(base_lr=args.base_lr)
    except ChargenError as error:
        parser.error(str(error))
    corpus = suite_corpus(args.text)
    whole = BatchScaling.schedule
    for decay, floor, weight_decay in args.settings:
        embedding = "" if args.embedding == ModelConfig.embedding else f"-e{args.embedding}"
        lr = "" if args.base_lr is None else f"-lr{args.base_lr:g}"
        name = (f"{args.text}-{args.layers}x{args.hidden}:{args.dropout:g}{embedding}{lr}-"
                f"{decay}:{floor:g}:{weight_decay:g}")
        BatchScaling.schedule = floored(floor)
        try:
            row = equal_steps_row(corpus, args.out, name, model, args.steps, weight_decay=weight_decay, decay=decay,
                                 base_lr=args.base_lr, seed=args.seed)
        finally:
            BatchScaling.schedule = whole
        row |= {"text": args.text, "embedding": args.embedding, "base_lr": args.base_lr, "decay": decay, "floor": floor,
                "weight_decay": weight_decay}
        append_jsonl(args.out / "results.jsonl", row)
        print(row, flush=True)


if __name__ == "__main__":
    main()
