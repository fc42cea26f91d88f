"""A plain PyTorch char-LSTM loop: the baseline of ``python -m benchmarks.budget``.

The recipe a careful user would write in about 60 lines, as issue 16 describes it: the text
as 32 contiguous streams, chunks of 128, the LSTM state carried (detached) between chunks,
Adam at 2e-3, no dropout, gradient clipping at 1, the learning rate on a cosine over the
time budget down to a tenth, fp32. Nothing of chargen runs in the loop; chargen's evaluator
scores the result on the validation file (whole text, state carried), so its figure is the
same measure as a chargen run's.

    python -m benchmarks.plain_loop TRAIN.txt VAL.txt --hidden 256 --max-time 137 [--json OUT]  # the budget + scoring
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.common import command_line, write_json
from chargen.corpus import eval_streams
from chargen.evaluate import evaluate_streams


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, embedding: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x, state=None):
        out, state = self.lstm(self.embed(x), state)
        return self.head(out), state


def train(train_ids: np.ndarray, vocab: int, hidden: int, layers: int, seconds: float, batch: int = 32,
          bptt: int = 128, lr: float = 2e-3, steps: int | None = None) -> tuple[CharLSTM, int, float]:
    """Trains for ``seconds`` (the cosine runs over the time), or for ``steps`` updates."""
    torch.manual_seed(0)
    n = len(train_ids) // batch
    data = torch.from_numpy(train_ids[: n * batch].astype(np.int64)).view(batch, n).t().contiguous()  # (time, batch)
    model = CharLSTM(vocab, hidden, layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    step, position, state, start = 0, 0, None, time.perf_counter()
    while (done := (step / steps if steps else (time.perf_counter() - start) / seconds)) < 1:
        for group in optimizer.param_groups:  # cosine over the budget, to a tenth
            group["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))
        if position + bptt + 1 > n:
            position, state = 0, None
        x, y = data[position : position + bptt], data[position + 1 : position + 1 + bptt]
        logits, state = model(x, state)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        state = tuple(s.detach() for s in state)
        position, step = position + bptt, step + 1
    return model, step, time.perf_counter() - start


def encode_files(train_file: Path, val_file: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The characters of both files (the vocabulary, sorted) and each file as their ids."""
    train_text, val_text = (p.read_text(encoding="utf-8") for p in (train_file, val_file))
    chars = sorted(set(train_text) | set(val_text))
    index = {c: i for i, c in enumerate(chars)}
    return chars, *(np.array([index[c] for c in text], dtype=np.int64) for text in (train_text, val_text))


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("train_file", type=Path)
    parser.add_argument("val_file", type=Path)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--max-time", type=float, help="training seconds")
    parser.add_argument("--steps", type=int, help="updates, instead of --max-time")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    chars, train_ids, val_ids = encode_files(args.train_file, args.val_file)
    if (args.max_time is None) == (args.steps is None):
        parser.error("give --max-time or --steps")
    model, steps, seconds = train(train_ids, len(chars), args.hidden, args.layers, args.max_time, steps=args.steps)
    val_loss = evaluate_streams(model, eval_streams(val_ids))
    result = {"val_loss": val_loss, "steps": steps, "train_seconds": round(seconds, 1),
              "chars_per_s": round(steps * 32 * 128 / seconds)}
    print(json.dumps(result))
    if args.json:
        write_json(args.json, result, indent=None)


if __name__ == "__main__":
    main()
