"""What a time budget buys: chargen's validation loss against fixed model sizes and a plain
PyTorch loop, at equal wall time, natively and as an AVX2-only CPU sees it (issue 16).

Data: the first 1,000,000 characters of corpora/shakespeare.txt, split 90/10 into a
training file and a validation file (``--val-file``). Every chargen run goes through the
CLI, ``chargen train TRAIN --val-file VAL --max-time B`` plus the configuration's flags;
its figure is the best whole-text validation loss in its summary. The plain loop is
``benchmarks.plain_loop``, scored by the same evaluator. Configurations: ``auto`` (no model
flags: the size chosen for the budget), ``before`` (see below),
``LAYERSxHIDDEN:DROPOUT`` (the sweep; weight decay by the epochs) and ``plain:LAYERSxHIDDEN``.
``before`` runs chargen as issue 16 found it: all defaults, from a git worktree of BEFORE_REV.

    python -m benchmarks.budget                                  # the whole grid: hours
    python -m benchmarks.budget --isa AVX2 --budgets 137 --configs auto before 1x256:0 plain:1x256
    python -m benchmarks.budget --report                         # the table and plot from what is done

Each run is appended to OUT/results.jsonl as it ends, and a run already there is not run
again, so the grid can be filled in over several sittings (rows name the CPU, and machines
are never mixed in a table). Runs are timed: one at a time, on a quiet machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.common import (
    OUT,
    ROOT,
    append_jsonl,
    checkout,
    child_env,
    command_line,
    corpus_split,
    cpu_name,
    read_jsonl,
    run_logged,
)

SLICE = 1_000_000
SWEEP = [f"{size}:{dropout}" for size in ("1x256", "1x512", "2x256", "2x512") for dropout in ("0", "0.1")]
# "before": chargen as issue 16 found it (its defaults: 1x512, dropout 0.1, weight decay 0.01,
# a forget-gate bias of 1, validation unbounded), run from a git worktree of that commit.
BEFORE_REV = "245bee7"
CONFIGS = ["auto", "before", *SWEEP, "plain:1x256", "plain:1x512"]


def prepare(out: Path) -> tuple[Path, Path]:
    """OUT/data/train.txt and val.txt: the first SLICE characters of Shakespeare, split 90/10."""
    shakespeare = ROOT / "corpora" / "shakespeare.txt"
    return corpus_split(out / "data", lambda: shakespeare.read_text(encoding="utf-8")[:SLICE])


def before_tree(out: Path) -> Path:
    """A checkout of BEFORE_REV, made once."""
    return checkout(BEFORE_REV, out / f"before-{BEFORE_REV}")


def command(config: str, train: Path, val: Path, budget: float, run: Path) -> list[str]:
    if config.startswith("plain:"):
        layers, hidden = config.removeprefix("plain:").split("x")
        return [sys.executable, "-m", "benchmarks.plain_loop", str(train), str(val), "--hidden", hidden,
                "--layers", layers, "--max-time", str(budget), "--json", str(run / "plain.json")]
    flags = []
    if config not in ("auto", "before"):
        size, dropout = config.split(":")
        layers, hidden = size.split("x")
        flags = ["--hidden", hidden, "--layers", layers, "--dropout", dropout]
    return [sys.executable, "-m", "chargen", "train", str(train), "--val-file", str(val), "--out", str(run),
            "--max-time", str(budget), "--force", "--quiet", *flags]


def run_one(config: str, isa: str, budget: float, out: Path, train: Path, val: Path) -> dict:
    run = out / "runs" / f"{isa}-{budget:g}-{config.replace(':', '_')}"
    run.mkdir(parents=True, exist_ok=True)
    code = before_tree(out) if config == "before" else ROOT  # (python -m puts the working folder first)
    wall = run_logged(command(config, train, val, budget, run), run, child_env(code, isa), code,
                      f"{config} ({isa}, {budget:g} s)")
    row = {"config": config, "isa": isa, "budget": budget, "wall_seconds": round(wall, 1), "cpu": cpu_name()}
    if config.startswith("plain:"):
        return row | json.loads((run / "plain.json").read_text())
    saved = json.loads((run / "config.json").read_text())
    summary, model = saved["summary"], saved["model"]
    chosen = next((line for line in (run / "log.txt").read_text().splitlines() if line.startswith("model: ")), None)
    return row | {"val_loss": summary["best_val_loss"], "steps": summary["step"], "chosen": chosen,
                  "train_seconds": summary["train_seconds"], "validation_seconds": summary.get("validation_seconds"),
                  "chars_per_s": round(summary["chars_seen"] / summary["train_seconds"]),
                  "model": f"{model['layers']}x{model['hidden']}, dropout {model['dropout']}, "
                           f"weight decay {saved['train']['weight_decay']}",
                  "precision": saved.get("precision_used")}


def machine(row: dict) -> str:
    return f"{row.get('cpu', 'unknown CPU')}, {row['isa']}"


def report(rows: list[dict]) -> str:
    lines = []
    for where in sorted({machine(r) for r in rows}):
        for budget in sorted({r["budget"] for r in rows if machine(r) == where}):
            group = sorted((r for r in rows if machine(r) == where and r["budget"] == budget),
                           key=lambda r: r["val_loss"])
            best_sweep = min((r["val_loss"] for r in group if r["config"] in SWEEP), default=None)
            lines += ["", f"### {where}, {budget:g} s", "",
                      "| configuration | model | val loss (nats/char) | against the sweep's best | steps | chars/s | "
                      "validation share |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
            for r in group:
                gap = "" if best_sweep is None else f"{r['val_loss'] - best_sweep:+.3f}"
                share = r.get("validation_seconds")
                share = "" if share is None else f"{share / budget:.1%}"
                lines.append(f"| {r['config']} | {r.get('model', '')} | {r['val_loss']:.4f} | {gap} | {r['steps']:,} | "
                             f"{r['chars_per_s']:,} | {share} |")
    return "\n".join(lines)


# How each line is drawn: chargen's choice bold, the baselines dashed, the fixed sizes thin.
THIN = {"linewidth": 0.8, "alpha": 0.6}
LOOK = {"auto": {"color": "black", "linewidth": 2.5}, "before": {"color": "tab:red", "linestyle": "--"},
        "plain": {"linestyle": ":"}}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    isas = sorted({machine(r) for r in rows})
    fig, axes = plt.subplots(1, len(isas), figsize=(6 * len(isas), 4.5), squeeze=False)
    for ax, isa in zip(axes[0], isas, strict=True):
        for config in sorted({r["config"] for r in rows if machine(r) == isa}):
            points = sorted((r["budget"], r["val_loss"]) for r in rows if machine(r) == isa and r["config"] == config)
            ax.plot(*zip(*points, strict=True), marker="o", label=config, **LOOK.get(config.split(":")[0], THIN))
        budgets = sorted({r["budget"] for r in rows if machine(r) == isa})
        ax.set(title=f"{isa}", xlabel="budget (s)", ylabel="validation loss (nats/char)", xscale="log",
               xticks=budgets, xticklabels=[f"{b:g}" for b in budgets])
        ax.minorticks_off()
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--out", type=Path, default=OUT / "budget")
    parser.add_argument("--budgets", type=float, nargs="+", default=[137, 411])
    parser.add_argument("--isa", nargs="+", default=["native", "AVX2"],
                        help="native, or an ONEDNN_MAX_CPU_ISA value such as AVX2 (default: both)")
    parser.add_argument("--configs", nargs="+", default=CONFIGS,
                        help="auto, before, LAYERSxHIDDEN:DROPOUT, plain:LAYERSxHIDDEN")
    parser.add_argument("--report", action="store_true", help="only print the table (and plot) of what is done")
    parser.add_argument("--plot", type=Path, help="also draw val loss against budget here (PNG)")
    args = parser.parse_args()
    args.out = args.out.resolve()  # (runs start in other folders)
    train, val = prepare(args.out)
    done = {(r["config"], r["isa"], r["budget"], r.get("cpu")) for r in read_jsonl(args.out / "results.jsonl")}
    if not args.report:
        for isa in args.isa:
            for budget in args.budgets:
                for config in args.configs:
                    if (config, isa, budget, cpu_name()) in done:
                        continue
                    print(f"{isa} {budget:g} s {config} ...", file=sys.stderr, flush=True)
                    row = run_one(config, isa, budget, args.out, train, val)
                    append_jsonl(args.out / "results.jsonl", row)
    rows = read_jsonl(args.out / "results.jsonl")
    print(report(rows))
    if args.plot and rows:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
