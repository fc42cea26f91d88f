"""How a trained stream model does from a zero state in mid-text, as it starts when it
validates (chargen scores the validation text as up to 32 streams, each from a zero state)
and when it continues a prompt: a model that only ever started training at the epoch's
fixed stream starts can fall, from a zero state elsewhere, into a saturated state it never
leaves (issue 33: a 2x512 prose model, 43 nats a character on one validation stream).

Scores TEXT three ways: as chargen validates it (its streams, the worst of them); as one
stream, the state carried from the text's start; and from a zero state at 400 random places,
512 characters each, where a start is *derailed* when its last 256 characters score more
than 1 nat a character above the same characters in the one stream. A few seconds to a
minute on a CPU.

    python -m benchmarks.cold_starts RUN_DIR VAL_TEXT [--weights latest]
    python -m benchmarks.cold_starts benchmarks/out/suite/runs/prose/native-1800-2x512_0.4-long \\
        benchmarks/out/suite/data/prose/val.txt --weights latest
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import chargen
from benchmarks.common import command_line
from chargen.corpus import Streams, eval_streams

STARTS, SPAN, TAIL = 400, 512, 256  # random starts, the characters scored from each, the last scored
CARRIED_CHARS = 1_000_000  # the one carried stream scores at most this much of the text


@torch.inference_mode()
def stream_losses(model: torch.nn.Module, data: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Each target's loss, (streams, length - 1), for ``data`` (streams, length) read from a
    zero state, the state carried across chunks."""
    model.eval()
    streams, losses, state = Streams(data), [], None
    for position in range(0, streams.length - 1, chunk):
        x, y = streams.chunk(position, chunk)
        logits, state = model(x, state)
        losses.append(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none").view(y.shape).t())
    return torch.cat(losses, dim=1)


def cold_starts(model: torch.nn.Module, ids: np.ndarray, carried: torch.Tensor) -> dict:
    """From a zero state at STARTS random places (seed 0): the last TAIL of SPAN characters
    against the same characters in the carried stream."""
    starts = np.random.default_rng(0).integers(0, len(carried) - SPAN, STARTS)
    data = torch.from_numpy(np.stack([ids[s : s + SPAN + 1] for s in starts]).astype(np.int64))
    cold = stream_losses(model, data)
    late = cold[:, SPAN - TAIL :].mean(dim=1)
    reference = torch.stack([carried[s + SPAN - TAIL : s + SPAN].mean() for s in starts])
    return {"derailed": int((late > reference + 1.0).sum()), "cold_late": late.mean().item(),
            "carried_late": reference.mean().item(), "cold_first_32": cold[:, :32].mean().item(),
            "worst_start": int(starts[int((late - reference).argmax())])}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("val_text", type=Path)
    parser.add_argument("--weights", default="best", help="best or latest (default best)")
    args = parser.parse_args()
    trained = chargen.load(args.run_dir, weights=args.weights)
    if trained.kind.items:
        raise SystemExit("python -m benchmarks.cold_starts: error: a lines-mode model starts every item from a zero "
                         "state already; give a stream model's run folder")
    text = args.val_text.read_text(encoding="utf-8")
    ids = np.asarray(trained.tokenizer.encode(text), dtype=np.int64)
    if len(ids) < 2 * SPAN:
        raise SystemExit(f"python -m benchmarks.cold_starts: error: the text needs at least {2 * SPAN} characters")
    model = trained.model
    streams = eval_streams(ids)
    per_stream = stream_losses(model, streams.data.long()).mean(dim=1)
    carried = stream_losses(model, torch.from_numpy(ids[:CARRIED_CHARS]).view(1, -1))[0]
    print(f"{args.run_dir} ({args.weights} weights) on {args.val_text}, {len(ids):,} characters")
    print(f"as chargen validates it, {streams.n_streams} streams of {streams.length:,}: {per_stream.mean().item():.4f} "
          f"(the worst stream {per_stream.max().item():.4f}, the best {per_stream.min().item():.4f})")
    print(f"as one stream, the state carried: {carried.mean().item():.4f} (its first {len(carried) + 1:,} characters)")
    found = cold_starts(model, ids, carried)
    print(f"from a zero state at {STARTS} random places, {SPAN} characters each: {found['derailed']} derailed; "
          f"the last {TAIL} characters {found['cold_late']:.4f} (carried: {found['carried_late']:.4f}), the first 32 "
          f"{found['cold_first_32']:.4f}; the worst start at character {found['worst_start']:,}")


if __name__ == "__main__":
    main()
