"""A small character transformer in nanoGPT's CPU configuration: the other baseline of
``python -m benchmarks.suite`` (issue 33).

nanoGPT's README trains ``config/train_shakespeare_char.py`` on a CPU with
``--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0``; the
rest is that config's and train.py's: AdamW at 1e-3 (betas 0.9, 0.99; weight decay 0.1 on
the matrices), 100 warmup steps, a cosine to 1e-4, gradient clipping at 1, random windows of
the training text, fp32. Here the cosine runs over the time budget (as the plain loop's
does), and the model is written out (pre-norm blocks, causal attention, tied embeddings, as
nanoGPT's ``model.py``). As nanoGPT's config (``always_save_checkpoint = False``), the
weights kept are the best of the validation estimates every 250 steps (20 random windows of
the validation text, the README's ``--eval_iters=20``; inside the time budget, as there) and
at the end: without dropout it overfits a small text. Those weights are scored on the whole
validation text: windows of 64 every 32 characters, each character scored once, with at least
32 before it past the first window.

    python -m benchmarks.tiny_gpt TRAIN.txt VAL.txt --max-time 137 [--json OUT]
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.common import command_line, write_json
from benchmarks.plain_loop import encode_files

CONTEXT, BATCH, LAYERS, HEADS, WIDTH = 64, 12, 4, 4, 128
LR, MIN_LR, WARMUP, WEIGHT_DECAY = 1e-3, 1e-4, 100, 0.1
EVAL_INTERVAL, EVAL_ITERS = 250, 20  # (train_shakespeare_char.py's interval, the README's CPU iters)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (part.view(b, t, HEADS, c // HEADS).transpose(1, 2) for part in self.qkv(self.norm1(x)).split(c, 2))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, vocab, bias=False)
        self.head.weight = self.embed.weight  # (tied, as nanoGPT's)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * LAYERS) if name.endswith(("proj.weight", "2.weight"))
                                else 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        return self.head(self.norm(self.blocks(self.embed(x) + self.position(positions))))


def random_windows(data: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """BATCH random windows of CONTEXT + 1 characters (nanoGPT's ``get_batch``)."""
    offsets = torch.from_numpy(rng.integers(0, len(data) - CONTEXT - 1, BATCH))
    return data[offsets[:, None] + torch.arange(CONTEXT + 1)]


@torch.inference_mode()
def estimate_loss(model: TinyGPT, data: torch.Tensor, rng: np.random.Generator) -> float:
    """The mean loss of EVAL_ITERS random batches (nanoGPT's ``estimate_loss``)."""
    model.eval()
    losses = [F.cross_entropy(model(w[:, :-1]).flatten(0, 1), w[:, 1:].flatten()).item()
              for w in (random_windows(data, rng) for _ in range(EVAL_ITERS))]
    model.train()
    return float(np.mean(losses))


def train(ids: np.ndarray, vocab: int, seconds: float,
          val_ids: np.ndarray | None = None) -> tuple[TinyGPT, int, float, int]:
    """Trains for ``seconds``; with ``val_ids``, keeps the weights of the best validation
    estimate (every EVAL_INTERVAL steps and at the end), else the last. Returns the model,
    the steps, the seconds and the step whose weights were kept."""
    torch.manual_seed(0)
    data, rng = torch.from_numpy(ids.astype(np.int64)), np.random.default_rng(0)
    val, val_rng = None, np.random.default_rng(1)  # (its own, so the training windows are as without it)
    if val_ids is not None and len(val_ids) > CONTEXT + 1:
        val = torch.from_numpy(val_ids.astype(np.int64))
    model = TinyGPT(vocab)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.99))
    step, start, best = 0, time.perf_counter(), (math.inf, 0, None)  # (estimate, step, weights)
    while (done := (time.perf_counter() - start) / seconds) < 1:
        if val is not None and step and step % EVAL_INTERVAL == 0 \
                and (estimate := estimate_loss(model, val, val_rng)) < best[0]:
            best = (estimate, step, copy.deepcopy(model.state_dict()))
        cosine = MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * done))
        lr = cosine * min(1.0, (step + 1) / WARMUP)
        for group in optimizer.param_groups:
            group["lr"] = lr
        window = random_windows(data, rng)
        loss = F.cross_entropy(model(window[:, :-1]).flatten(0, 1), window[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
    seconds_taken = time.perf_counter() - start
    if best[2] is not None and estimate_loss(model, val, val_rng) > best[0]:
        model.load_state_dict(best[2])
        return model, step, seconds_taken, best[1]
    return model, step, seconds_taken, step


def windows(n: int) -> list[tuple[int, int]]:
    """(start, offset) of the windows of CONTEXT + 1 characters that score each of the n - 1
    targets of a text once: a window starting at s scores targets s + 1 + k for k from
    offset; every target past the first window's has at least CONTEXT/2 before it."""
    if n <= CONTEXT + 1:
        return [(0, 0)]  # (one short window: all)
    half = CONTEXT // 2
    spans = [(start, 0 if start == 0 else half) for start in range(0, n - CONTEXT, half)]
    covered = spans[-1][0] + CONTEXT  # (the last target scored so far)
    if covered < n - 1:
        start = n - 1 - CONTEXT
        spans.append((start, covered - start))
    return spans


@torch.inference_mode()
def score(model: TinyGPT, ids: np.ndarray, batch: int = 256) -> float:
    """Mean loss (nats) of every character after the first (``windows``)."""
    model.eval()
    data, spans = torch.from_numpy(ids.astype(np.int64)), windows(len(ids))
    total, count = 0.0, 0
    for i in range(0, len(spans), batch):
        chunk = spans[i : i + batch]
        window = torch.stack([data[start : start + CONTEXT + 1] for start, _ in chunk])
        losses = F.cross_entropy(model(window[:, :-1]).transpose(1, 2), window[:, 1:], reduction="none")
        keep = torch.arange(losses.shape[1])[None, :] >= torch.tensor([offset for _, offset in chunk])[:, None]
        total, count = total + float(losses[keep].sum()), count + int(keep.sum())
    return total / count


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("train_file", type=Path)
    parser.add_argument("val_file", type=Path)
    parser.add_argument("--max-time", type=float, required=True, help="training seconds")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    chars, train_ids, val_ids = encode_files(args.train_file, args.val_file)
    model, steps, seconds, kept = train(train_ids, len(chars), args.max_time, val_ids)
    result = {"val_loss": score(model, val_ids), "steps": steps, "weights_of_step": kept,
              "train_seconds": round(seconds, 1),
              "chars_per_s": round(steps * BATCH * CONTEXT / seconds),
              "parameters": sum(p.numel() for p in model.parameters())}
    print(json.dumps(result))
    if args.json:
        write_json(args.json, result, indent=None)


if __name__ == "__main__":
    main()
