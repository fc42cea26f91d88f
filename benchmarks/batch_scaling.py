"""Batch scaling: does a k-times wider batch learn as well at the same epochs, and sooner?

Trains the same model for the same number of epochs at the base batch B0 and at k * B0
for each k, under each learning-rate scaling rule (legw, linear, none; see
chargen.schedule), all from one reference setting (lr0, W0) tuned at B0. Per run it
reports the final validation bpc, the training time (validation excluded: every run
validates the same number of times), chars/s, and the time to reach the base run's
final bpc (interpolated between validations); and it plots validation bpc against
training time for every run.

    pip install matplotlib                   # for the plot only
    python -m benchmarks.batch_scaling       # the grid in benchmarks/README.md, ~40 min on 2 cores
    python -m benchmarks.batch_scaling --ks 4 --epochs 0.2 --out /tmp/bs   # a smoke test
    python -m benchmarks.batch_scaling --report   # table and plot from the saved results

Results go to OUT/results.json as each run finishes; a second invocation skips the runs
already there, so an interrupted benchmark continues.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import OUT, command_line, cpu_name, write_json
from chargen import load_corpus
from chargen.config import TrainConfig
from chargen.corpus import epoch_steps
from chargen.model import ModelConfig
from chargen.train import train


def run_name(batch: int, scheme: str, base_batch: int) -> str:
    return f"B{batch}-base" if batch == base_batch else f"B{batch}-{scheme}"


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds at which the validation curve first reaches ``target`` bpc,
    interpolated linearly between the two validations around the crossing."""
    previous = None
    for seconds, bpc in curve:
        if bpc <= target:
            if previous is None or previous[1] == bpc:
                return seconds
            (s0, b0) = previous
            return s0 + (seconds - s0) * (b0 - target) / (b0 - bpc)
        previous = (seconds, bpc)
    return None


def one_run(args: argparse.Namespace, corpus, batch: int, scheme: str) -> dict:
    name = run_name(batch, scheme, args.base_batch)
    n_train = len(corpus.train_ids)
    total = max(1, round(args.epochs * epoch_steps(n_train, batch, args.bptt)))
    config = TrainConfig(
        batch_size=batch, bptt=args.bptt, lr_scaling=scheme, base_batch_size=args.base_batch,
        base_lr=args.base_lr, base_warmup_epochs=args.base_warmup_epochs, epochs=args.epochs,
        eval_every=max(1, round(total / args.evals)), log_every=max(1, total // 200), sample_chars=0,
        seed=args.seed, precision=args.precision,
    )
    model = ModelConfig(vocab_size=1, embedding=64, hidden=args.hidden, layers=args.layers, dropout=args.dropout)
    lines: list[str] = []
    wall = time.perf_counter()
    result = train(corpus, args.out / name, model, config, force=True, log=lines.append)
    wall = time.perf_counter() - wall
    if result.stopped != "done":  # Ctrl-C or SIGTERM: a partial run is not a result
        sys.exit(f"{name} stopped ({result.stopped}); run the script again to redo it")
    vals = [e for e in result.history if e["event"] == "val"]
    trains = [e for e in result.history if e["event"] == "train"]
    config_record = json.loads((args.out / name / "config.json").read_text())
    summary = config_record["summary"]
    final = vals[-1]["val_bpc"]
    print(f"{name}: final val bpc {final:.4f} after {summary['train_seconds']:.0f} s training "
          f"({wall:.0f} s with validation); {lines[2] if len(lines) > 2 else ''}", flush=True)
    return {
        "name": name, "batch": batch, "k": batch / args.base_batch, "scheme": scheme if batch != args.base_batch
        else "base", "steps": result.step, "epochs": result.epoch, "final_val_bpc": final,
        "best_val_bpc": min(v["val_bpc"] for v in vals), "train_seconds": summary["train_seconds"],
        "wall_seconds": round(wall, 1), "chars_per_s": summary["chars_seen"] / summary["train_seconds"],
        "diverged": not math.isfinite(final) or any(not math.isfinite(e["loss"]) for e in trains),
        "lr_schedule": config_record["lr_schedule"],
        "curve": [(v["elapsed"], v["val_bpc"], v["epoch"]) for v in vals],
    }


def report(results: dict, base_batch: int) -> str:
    base = results.get(run_name(base_batch, "", base_batch))
    rows = sorted(results.values(), key=lambda r: (r["batch"], ["base", "legw", "linear", "none"].index(r["scheme"])))
    head = ("| run | batch | k | scaling | peak lr | warmup steps | updates | final val bpc | vs base | "
            "train time (s) | chars/s | × base chars/s | time to base's final bpc (s) | × base time |")
    out = [head, "|" + " --- |" * 14]
    for r in rows:
        lr = r["lr_schedule"]
        vs = reach = speed = faster = "—"
        if base is not None:
            vs = f"{100 * (r['final_val_bpc'] / base['final_val_bpc'] - 1):+.1f}%"
            speed = f"{r['chars_per_s'] / base['chars_per_s']:.2f}"
            t = time_to_reach([(c[0], c[1]) for c in r["curve"]], base["final_val_bpc"])
            if t is not None:
                reach, faster = f"{t:.0f}", f"{base['train_seconds'] / t:.2f}"
            else:
                reach = "not reached"
        final = "diverged" if r["diverged"] else f"{r['final_val_bpc']:.4f}"
        out.append(
            f"| {r['name']} | {r['batch']} | {r['k']:g} | {r['scheme']} | {lr['peak_lr']:.2e} | "
            f"{lr['warmup_steps']:,} | {r['steps']:,} | {final} | {vs} | {r['train_seconds']:.0f} | "
            f"{r['chars_per_s']:,.0f} | {speed} | {reach} | {faster} |"
        )
    return "\n".join(out)


def plot(results: dict, path: Path, base_batch: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    ks = sorted({r["k"] for r in results.values() if r["scheme"] != "base"})
    colours = dict(zip(ks, plt.cm.viridis(np.linspace(0.15, 0.85, max(1, len(ks)))), strict=False))
    styles = {"legw": "-", "linear": "--", "none": ":"}
    finals = [r["final_val_bpc"] for r in results.values() if math.isfinite(r["final_val_bpc"])]
    for r in sorted(results.values(), key=lambda r: r["batch"]):
        curve = [c for c in r["curve"] if math.isfinite(c[1])]
        if not curve:
            continue
        seconds, bpc, epochs = zip(*curve, strict=True)
        if r["scheme"] == "base":
            style = dict(color="black", linestyle="-", linewidth=2.2, label=f"B0={r['batch']} (base)")
        else:
            style = dict(color=colours[r["k"]], linestyle=styles[r["scheme"]], linewidth=1.6,
                         label=f"B={r['batch']} (k={r['k']:g}) {r['scheme']}")
        axes[0].plot(seconds, bpc, **style)
        axes[1].plot(epochs, bpc, **style)
    base = results.get(run_name(base_batch, "", base_batch))
    for ax in axes:
        if base is not None:
            ax.axhline(base["final_val_bpc"], color="black", linewidth=0.8, alpha=0.5)
        ax.grid(alpha=0.3)
    if finals:
        axes[0].set_ylim(min(finals) - 0.05, min(finals) + 0.9)
    axes[0].set_xlabel("training time (s), validation excluded")
    axes[1].set_xlabel("epochs")
    axes[0].set_ylabel("validation bits per character")
    axes[1].legend(fontsize=8, ncol=1, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--corpus", type=Path, default=Path("corpora/shakespeare.txt"))
    parser.add_argument("--base-batch", type=int, default=16, help="B0 (default %(default)s)")
    parser.add_argument("--ks", type=int, nargs="*", default=[16, 4, 64], help="batch multiples (default 16 4 64)")
    parser.add_argument("--schemes", nargs="+", default=["legw", "linear", "none"])
    parser.add_argument("--epochs", type=float, default=5.0, help="epochs for every run (default %(default)s)")
    parser.add_argument("--bptt", type=int, default=64, help="(default %(default)s)")
    parser.add_argument("--hidden", type=int, default=256, help="(default %(default)s)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--base-lr", type=float, default=3e-3, help="lr0 at B0 (default %(default)s)")
    parser.add_argument("--base-warmup-epochs", type=float, default=0.02, help="W0 at B0 (default %(default)s)")
    parser.add_argument("--evals", type=int, default=24, help="validations per run (default %(default)s)")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=OUT / "batch_scaling")
    parser.add_argument("--plot", type=Path, help="PNG path (default OUT/batch_scaling.png)")
    parser.add_argument("--report", action="store_true", help="only print the table and plot from saved results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    saved = json.loads(results_path.read_text()) if results_path.exists() else {}
    results, setup = saved.get("runs", {}), saved.get("setup")
    here = {k: getattr(args, k) for k in ("corpus", "base_batch", "epochs", "bptt", "hidden", "layers", "dropout",
                                          "base_lr", "base_warmup_epochs", "evals", "precision", "seed")}
    here["corpus"] = str(here["corpus"])
    if setup is not None and setup != here and not args.report:
        sys.exit(f"{results_path} holds results of another setup; give another --out or delete it")
    setup = setup or here
    machine = {"torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
               "cpu": cpu_name(), "cuda": torch.cuda.is_available()}

    if not args.report:
        corpus = load_corpus(args.corpus)
        plan = [(args.base_batch, "legw")] + [(k * args.base_batch, s) for k in args.ks for s in args.schemes]
        for batch, scheme in plan:
            name = run_name(batch, scheme, args.base_batch)
            if name in results:
                continue
            results[name] = one_run(args, corpus, batch, scheme)
            saved = {"setup": setup, "machine": machine, "runs": results}
            write_json(results_path, saved, indent=1)

    print(f"\nsetup: {json.dumps(setup)}\nmachine: {json.dumps(saved.get('machine', machine))}\n")
    print(report(results, setup["base_batch"]))
    title = (f"{setup['corpus']}: {setup['layers']}x{setup['hidden']} LSTM, {setup['epochs']:g} epochs, "
             f"bptt {setup['bptt']}, lr0 {setup['base_lr']:g} and W0 {setup['base_warmup_epochs']:g} epochs "
             f"at B0={setup['base_batch']}")
    try:
        plot(results, args.plot or args.out / "batch_scaling.png", setup["base_batch"], title)
    except ImportError:
        print("no plot: pip install matplotlib")


if __name__ == "__main__":
    main()
