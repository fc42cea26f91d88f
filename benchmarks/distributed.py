"""torchrun on the CPU: 2 processes against 1, the same global batch and epochs.

Trains the same model on the same text twice with the CLI: once in one process, once with
``torchrun --standalone --nproc_per_node=2`` (gloo; each process one thread, torchrun's
default, and half of the streams). Prints the validation bpc of each and their ratio, and
the training chars/s of each and their ratio.

    python benchmarks/distributed.py                 # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str], out: Path, env: dict) -> dict:
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = json.loads((out / "config.json").read_text())["summary"]
    last_val = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last_val = [e for e in last_val if e["event"] == "val"][-1]
    return {"val_bpc": last_val["val_bpc"], "chars_per_s": summary["chars_seen"] / summary["train_seconds"],
            "seconds": summary["train_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", default=str(ROOT / "corpora" / "shakespeare.txt"))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch (default 64)")
    parser.add_argument("--epochs", type=float, default=1.0)
    args = parser.parse_args()
    flags = ["--hidden", str(args.hidden), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
             "--eval-every", "1000000", "--precision", "fp32", "--device", "cpu", "--quiet", "--force"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        one = run([sys.executable, "-m", "chargen", "train", args.text, "--out", f"{tmp}/one", *flags],
                  Path(tmp) / "one", env)
        two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   "-m", "chargen", "train", args.text, "--out", f"{tmp}/two", *flags], Path(tmp) / "two", env)
    print(f"\n{Path(args.text).name}, 1x{args.hidden} LSTM, global batch {args.batch_size}, {args.epochs:g} epochs, "
          f"fp32, {os.cpu_count()} cores\n")
    print("| run | val bpc | train chars/s | train time (s) |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| 1 process ({os.cpu_count()} threads) | {one['val_bpc']:.4f} | {one['chars_per_s']:,.0f} | "
          f"{one['seconds']:.0f} |")
    print(f"| torchrun, 2 processes (1 thread each) | {two['val_bpc']:.4f} | {two['chars_per_s']:,.0f} | "
          f"{two['seconds']:.0f} |")
    bpc_ratio, speed_ratio = two["val_bpc"] / one["val_bpc"], two["chars_per_s"] / one["chars_per_s"]
    print(f"| 2 processes / 1 | {bpc_ratio:.4f} | {speed_ratio:.2f} | |")


if __name__ == "__main__":
    main()
