"""Length bucketing in lines mode: padding, speed and quality against random batches.

For each corpus of short items (one per line) it trains the same model for the same
number of epochs with random batches (``--bucket-factor 1``: a batch is padded to its
longest item) and with length-bucketed batches (superbatches of N batches sorted by
length, N = 10, 50, 100), and reports per run: the share of padded positions over an
epoch's batches, training chars/s counting real characters only (each item's characters
and its end), the ratio to random batching, and the validation bpc after those epochs.

Corpora:
- speeches: every speech of corpora/shakespeare.txt as one line ("SPEAKER: text", its
  verse lines joined by spaces), a few characters to a few thousand: widely varying;
- names: corpora/first_names.txt, 2 to 15 characters.

    python -m benchmarks.bucketing                  # ~15 min on 2 cores
    python -m benchmarks.bucketing --quick          # a smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import ROOT, command_line, write_json
from chargen import load_corpus, train
from chargen.config import TrainConfig
from chargen.lines import epoch_batches, padded_share
from chargen.model import ModelConfig


def speeches(text: str) -> list[str]:
    """Each speech (a block between blank lines) as one line."""
    blocks = [[line.strip() for line in block.split("\n") if line.strip()] for block in text.split("\n\n")]
    return [" ".join(block) for block in blocks if block]


def one_run(corpus, name: str, factor: int, seed: int, args: argparse.Namespace, out: Path) -> dict:
    lengths = corpus.train_items.lengths
    share = padded_share(lengths, epoch_batches(lengths, args.batch, factor, seed, 0))
    config = TrainConfig(batch_size=args.batch, base_batch_size=args.batch, bucket_factor=factor,
                         epochs=args.epochs[name], eval_every=10**9, log_every=50, sample_chars=0, seed=seed,
                         precision=args.precision)
    model = ModelConfig(vocab_size=1, embedding=64, hidden=args.hidden, layers=1, dropout=0.1)
    result = train(corpus, out / f"{name}-N{factor}", model, config, force=True)
    if result.stopped != "done":  # Ctrl-C or SIGTERM: a partial run is not a result
        sys.exit(f"{name} N={factor} stopped ({result.stopped})")
    summary = json.loads((out / f"{name}-N{factor}" / "config.json").read_text())["summary"]
    row = {"corpus": name, "bucket_factor": factor, "seed": seed, "padded_share": share, "steps": result.step,
           "train_seconds": summary["train_seconds"], "chars_per_s": summary["chars_seen"] / summary["train_seconds"],
           "val_bpc": result.last_val_loss / math.log(2)}
    print(f"{name} N={factor} seed {seed}: padded {share:.1%}, {row['chars_per_s']:,.0f} chars/s, "
          f"val bpc {row['val_bpc']:.4f}", flush=True)
    return row


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--factors", type=int, nargs="+", default=[1, 10, 50, 100])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--speeches-epochs", type=float, default=1.0)
    parser.add_argument("--names-epochs", type=float, default=20.0)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234],
                        help="train each setting once per seed (weights, batch order); the table gives the mean "
                             "and, with several seeds, the spread (max - min) of val bpc")
    parser.add_argument("--corpora", nargs="+", default=["speeches", "names"], choices=["speeches", "names"])
    parser.add_argument("--quick", action="store_true", help="a smoke test: tiny epochs")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    args.epochs = {"speeches": args.speeches_epochs, "names": args.names_epochs}
    if args.quick:
        args.epochs = {"speeches": 0.02, "names": 0.5}

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        speech_file = tmp / "speeches.txt"
        speech_file.write_text("\n".join(speeches((ROOT / "corpora/shakespeare.txt").read_text())) + "\n")
        files = {"speeches": speech_file, "names": ROOT / "corpora/first_names.txt"}
        for name, path in files.items():
            if name not in args.corpora:
                continue
            corpus = load_corpus(path, mode="lines")
            n = corpus.train_items.n_chars
            print(f"{name}: {len(n):,} training items, {n.sum():,} chars; length median {np.median(n):.0f}, "
                  f"5%-95% {np.percentile(n, 5):.0f}-{np.percentile(n, 95):.0f}, max {n.max():,}", flush=True)
            lengths = n + 1
            shares = {f: padded_share(lengths, epoch_batches(lengths, args.batch, f, args.seeds[0], 0))
                      for f in sorted({1, 10, 50, 100, 200, 500, 1000, *args.factors})}
            print("padded share of an epoch's batches, by N: "
                  + ", ".join(f"N={f}: {share:.1%}" for f, share in shares.items()), flush=True)
            for seed in args.seeds:
                for factor in args.factors:
                    rows.append(one_run(corpus, name, factor, seed, args, tmp))

    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"1x{args.hidden} LSTM, epochs {args.epochs}\n")
    print(f"val bpc: mean over seeds {args.seeds}" + (", ± half the spread (max - min)" if len(args.seeds) > 1 else ""))
    print("| corpus | batches | padded share | real chars/s | × random | val bpc | train time (s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["corpus"], row["bucket_factor"]), []).append(row)
    for (corpus_name, factor), group in groups.items():
        random = groups[(corpus_name, 1)]
        speed = np.mean([r["chars_per_s"] for r in group])
        ratio = speed / np.mean([r["chars_per_s"] for r in random])
        bpcs = [r["val_bpc"] for r in group]
        spread = f" ± {(max(bpcs) - min(bpcs)) / 2:.4f}" if len(bpcs) > 1 else ""
        kind = "random (N=1)" if factor == 1 else f"bucketed, N={factor}"
        print(f"| {corpus_name} | {kind} | {np.mean([r['padded_share'] for r in group]):.1%} | {speed:,.0f} | "
              f"{ratio:.2f} | {np.mean(bpcs):.4f}{spread} | {np.mean([r['train_seconds'] for r in group]):.0f} |")
    if args.json:
        write_json(args.json, rows, indent=1)


if __name__ == "__main__":
    main()
