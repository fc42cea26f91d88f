"""Summarise a run folder's metrics.jsonl: the validation curve, throughput, and the
best validation loss, as a Markdown table (what the README records for the quality target);
with ``--plot``, the training and validation curves as a PNG.

    python -m benchmarks.run_summary RUN_DIR                  # a second
    python -m benchmarks.run_summary RUN_DIR --plot curve.png
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.common import command_line, read_jsonl


def plot(events: list[dict], title: str, path: Path) -> None:
    """Bits per character against the step: training (each log window), validation on the
    whole text (dots) and on a sample of it during a timed run (rings)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("python -m benchmarks.run_summary: error: --plot needs matplotlib: pip install matplotlib "
                         "(or drop --plot)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(e["step"], e["bpc"]) for e in events if e["event"] == "train"]
    if train:
        ax.plot(*zip(*train, strict=True), color="tab:blue", linewidth=0.8, alpha=0.7, label="training")
    for whole, look in ((True, {"color": "tab:red"}), (False, {"markerfacecolor": "none", "color": "tab:red"})):
        val = [(e["step"], e["val_bpc"]) for e in events if e["event"] == "val" and e.get("whole", True) == whole]
        if val:
            ax.plot(*zip(*val, strict=True), "o", label="validation" + ("" if whole else " (a sample)"), **look)
    ax.set(title=title, xlabel="step", ylabel="bits per character")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also draw the curves here")
    args = parser.parse_args()
    run_dir = args.run_dir
    events = read_jsonl(run_dir / "metrics.jsonl")
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
        elif e["event"] == "best_on_sample":
            print(f"| {e['step']} | {e['epoch']:.2f} | | | {e['val_loss']:.4f} (the weights of step "
                  f"{e['weights_step']:,}) | {e['val_bpc']:.4f} |")
    speeds = sorted(e["chars_per_s"] for e in train_events[1:])
    if speeds:
        print(f"\nmedian training speed: {speeds[len(speeds) // 2]:,} chars/s")
    # (the best sample's weights scored whole at the end of a timed run count too: chargen.best_on_sample)
    best = min((e["val_loss"] for e in events if e["event"] == "val" and e.get("whole", True)
                or e["event"] == "best_on_sample"), default=None)
    if best is not None:
        print(f"best validation loss (whole text): {best:.4f} nats/char ({best / math.log(2):.4f} bpc)")
    if args.plot:
        plot(events, f"{run_dir.name}: {config['model']['layers']}x{config['model']['hidden']}", args.plot)
        print(f"curves drawn in {args.plot}")


if __name__ == "__main__":
    main()
