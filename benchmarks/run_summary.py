"""Summarise a run folder's metrics.jsonl: the validation curve, throughput, and the
best validation loss, as a Markdown table (what the README records for the quality target).

    python benchmarks/run_summary.py RUN_DIR
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def main() -> None:
    run_dir = Path(sys.argv[1])
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config = json.loads((run_dir / "config.json").read_text())
    train_events = [e for e in events if e["event"] == "train"]
    print(f"run: {run_dir}  model: {config['model']}  parameters: {config['parameters']:,}")
    print(f"train: {json.dumps({k: v for k, v in config['train'].items() if v is not None})}\n")
    print("| step | epoch | train time (s) | train loss | val loss (nats/char) | val bpc |")
    print("|---|---|---|---|---|---|")
    last_train = None
    for e in events:
        if e["event"] == "train":
            last_train = e
        elif e["event"] == "val":
            train_loss = f"{last_train['loss']:.3f}" if last_train else ""
            part = "" if e.get("whole", True) else f" (on {e['chars']:,} chars)"  # a sample, during a timed run
            print(f"| {e['step']} | {e['epoch']:.2f} | {e['elapsed']:.0f} | {train_loss} | "
                  f"{e['val_loss']:.4f}{part} | {e['val_bpc']:.4f} |")
    speeds = sorted(e["chars_per_s"] for e in train_events[1:])
    if speeds:
        print(f"\nmedian training speed: {speeds[len(speeds) // 2]:,} chars/s")
    best = min((e["val_loss"] for e in events if e["event"] == "val" and e.get("whole", True)), default=None)
    if best is not None:
        print(f"best validation loss (whole text): {best:.4f} nats/char ({best / math.log(2):.4f} bpc)")


if __name__ == "__main__":
    main()
