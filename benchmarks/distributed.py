"""torchrun on the CPU: 2 processes against 1, the same global batch and epochs.

Trains the same model on the same text twice with the CLI: once in one process, once with
``torchrun --standalone --nproc_per_node=2`` (gloo; each process one thread, torchrun's
default, and half of the streams, or in lines mode every other item of each batch). Prints
the validation bpc of each and their ratio, and the training chars/s of each and their
ratio: Shakespeare in stream mode, the names list in lines mode.

    python -m benchmarks.distributed                 # ~4 min on 2 cores
    python -m benchmarks.distributed --modes lines
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, child_env, command_line, read_jsonl


def run(command: list[str], out: Path, env: dict) -> dict:
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = json.loads((out / "config.json").read_text())["summary"]
    last_val = [e for e in read_jsonl(out / "metrics.jsonl") if e["event"] == "val"][-1]
    return {"val_bpc": last_val["val_bpc"], "chars_per_s": summary["chars_seen"] / summary["train_seconds"],
            "seconds": summary["train_seconds"]}


CASES = {  # mode: (text, epochs)
    "stream": (ROOT / "corpora" / "shakespeare.txt", 1.0),
    "lines": (ROOT / "corpora" / "first_names.txt", 20.0),
}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--modes", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch (default 64)")
    args = parser.parse_args()
    env = child_env()
    print(f"1x{args.hidden} LSTM, global batch {args.batch_size}, fp32, {os.cpu_count()} cores\n")
    print("| text | run | val bpc | train chars/s | train time (s) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for mode in args.modes:
        text, epochs = CASES[mode]
        flags = ["--mode", mode, "--hidden", str(args.hidden), "--batch-size", str(args.batch_size), "--epochs",
                 str(epochs), "--eval-every", "1000000", "--precision", "fp32", "--device", "cpu", "--quiet",
                 "--force"]
        with tempfile.TemporaryDirectory() as tmp:
            one = run([sys.executable, "-m", "chargen", "train", str(text), "--out", f"{tmp}/one", *flags],
                      Path(tmp) / "one", env)
            two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       "-m", "chargen", "train", str(text), "--out", f"{tmp}/two", *flags], Path(tmp) / "two", env)
        name = f"{text.name} ({mode}, {epochs:g} epoch{'s' * (epochs != 1)})"
        print(f"| {name} | 1 process ({os.cpu_count()} threads) | {one['val_bpc']:.4f} | {one['chars_per_s']:,.0f} | "
              f"{one['seconds']:.0f} |")
        print(f"| {name} | torchrun, 2 processes (1 thread each) | {two['val_bpc']:.4f} | "
              f"{two['chars_per_s']:,.0f} | {two['seconds']:.0f} |")
        bpc_ratio, speed_ratio = two["val_bpc"] / one["val_bpc"], two["chars_per_s"] / one["chars_per_s"]
        print(f"| {name} | 2 processes / 1 | {bpc_ratio:.4f} | {speed_ratio:.2f} | |", flush=True)


if __name__ == "__main__":
    main()
