"""The budget suite (issue 33): chargen's ``--max-time`` choice on seven texts, at
several budgets, natively and as an AVX2-only CPU sees it, against the fixed sizes and
dropouts around it, the plain PyTorch loop and a small transformer, at equal wall time.

Texts (``benchmarks.suite_texts``: a play, English prose, Python source, C++ source (held
out from the rules' fitting), Russian prose, a list of names and one short book (where the
cap on parameters per character decides); built from the shipped corpora and pinned package
archives, each split 90/10). In every cell (text, budget, CPU):
``auto`` (``chargen train TRAIN --val-file VAL --max-time B``, nothing else), ``around``
(the sizes next to auto's on chargen's ladder at its dropout, and its size at the dropouts
next to its own: run after auto, from auto's record), ``LAYERSxHIDDEN:DROPOUT`` (a fixed
setting), ``plain:LAYERSxHIDDEN`` (``benchmarks.plain_loop``) and ``gpt``
(``benchmarks.tiny_gpt``, nanoGPT's CPU configuration). Every figure is the whole
validation text's loss (chargen: the best whole-text validation in its summary; the
baselines: chargen's evaluator, or the sliding windows of tiny_gpt). The list trains in
lines mode in chargen (each name from a fresh state, scored with its end) and as a stream
of lines in the baselines.

    python -m benchmarks.suite --budgets 60 --isa native                    # 6 texts x 3: ~24 min
    python -m benchmarks.suite --texts play --budgets 411 --configs auto around
    python -m benchmarks.suite --texts play --budgets 411 --configs auto --tag ramp  # again, after a change
    python -m benchmarks.suite --texts russian --budgets 411 --steps 3200 --configs 1x512:0.1 1x512:0.2
    python -m benchmarks.suite --report                                     # the tables of what is done

``--steps N`` trains fixed settings for N steps instead of the budget's time, tagged
``steps-N`` in the budget's cell: the host's speed drifts by a third over minutes, so runs
of equal time differ in steps, and a setting that trains on for longer (less dropout, say)
wins by the steps it got; at equal steps only the setting differs.

Rows go to OUT/results.jsonl as each run ends; a run already there is not run again, so
the grid fills in over several sittings. Runs are timed: one at a time, on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from benchmarks.budget import command as chargen_command
from benchmarks.common import OUT, ROOT, append_jsonl, child_env, command_line, cpu_name, read_jsonl, run_logged
from benchmarks.suite_texts import TEXTS, split
from chargen.autosize import LADDER

CONFIGS = ["auto", "around", "plain:1x256", "gpt"]
# chargen's CLI in-process, timed from its start to its return (after imports: the budget's
# own span, from reading the text to the last checkpoint), the seconds written to a file.
TIMED_CLI = ("import sys, time; from pathlib import Path; from chargen.cli import main; start = time.perf_counter(); "
             "code = main(sys.argv[2:]); Path(sys.argv[1]).write_text(str(time.perf_counter() - start)); "
             "sys.exit(code)")
DROPOUTS = (0.0, 0.1, 0.2, 0.3, 0.4)
FIXED = re.compile(r"\d+x\d+:[\d.]+")  # a fixed setting, LAYERSxHIDDEN:DROPOUT


def tag_name(value: str) -> str:
    """A --tag as it may name a run folder: letters, digits, '.', '_' and '-', not starting with a dot."""
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,39}", value):
        raise argparse.ArgumentTypeError(f"{value!r} cannot name a run folder: use up to 40 letters, digits, "
                                         "'.', '_' or '-', not starting with '.'")
    return value


def command(config: str, train: Path, val: Path, budget: float, run: Path, steps: int | None = None) -> list[str]:
    if config == "gpt":
        return [sys.executable, "-m", "benchmarks.tiny_gpt", str(train), str(val), "--max-time", str(budget),
                "--json", str(run / "result.json")]
    cmd = chargen_command(config, train, val, budget, run)
    if steps is not None:  # (a fixed setting for so many steps, not for the budget's time)
        at = cmd.index("--max-time")
        cmd[at : at + 2] = ["--steps", str(steps)]
    if cmd[1:3] == ["-m", "chargen"]:
        return [sys.executable, "-c", TIMED_CLI, str(run / "seconds.txt"), *cmd[3:]]
    return [part if part != str(run / "plain.json") else str(run / "result.json") for part in cmd]


def run_one(text: str, config: str, isa: str, budget: float, out: Path, tag: str = "",
            steps: int | None = None) -> dict:
    train, val = split(text, out)
    run = out / "runs" / text / f"{isa}-{budget:g}-{config.replace(':', '_')}{'-' + tag if tag else ''}"
    run.mkdir(parents=True, exist_ok=True)
    wall = run_logged(command(config, train, val, budget, run, steps), run, child_env(ROOT, isa), ROOT,
                      f"{text} {config} ({isa}, {budget:g} s)")
    row = {"text": text, "config": config, "isa": isa, "budget": budget, "wall_seconds": round(wall, 1),
           "cpu": cpu_name()} | ({"tag": tag} if tag else {}) | ({"fixed_steps": steps} if steps else {})
    if config.startswith("plain:") or config == "gpt":
        return row | json.loads((run / "result.json").read_text())
    saved = json.loads((run / "config.json").read_text())
    summary, model = saved["summary"], saved["model"]
    return row | {"val_loss": summary["best_val_loss"], "steps": summary["step"],
                  "epochs": round(summary["chars_seen"] / len(train.read_text(encoding="utf-8")), 2),
                  "train_seconds": summary["train_seconds"], "validation_seconds": summary.get("validation_seconds"),
                  "cli_seconds": round(float((run / "seconds.txt").read_text()), 2),
                  "size": f"{model['layers']}x{model['hidden']}", "dropout": model["dropout"],
                  "weight_decay": saved["train"]["weight_decay"], "base_lr": saved["train"].get("base_lr"),
                  "precision": saved.get("precision_used")}


def around(auto: dict) -> list[str]:
    """The fixed settings next to auto's choice: the ladder's sizes on either side at its
    dropout, and its size at the dropouts on either side."""
    size, dropout = tuple(int(v) for v in auto["size"].split("x")), auto["dropout"]
    i = LADDER.index(size) if size in LADDER else None
    sizes = [] if i is None else [LADDER[j] for j in (i - 1, i + 1) if 0 <= j < len(LADDER)]
    d = min(range(len(DROPOUTS)), key=lambda k: abs(DROPOUTS[k] - dropout))
    dropouts = [DROPOUTS[k] for k in (d - 1, d + 1) if 0 <= k < len(DROPOUTS)]
    return [f"{layers}x{hidden}:{dropout:g}" for layers, hidden in sizes] + \
           [f"{auto['size']}:{other:g}" for other in dropouts]


def cell_rows(rows: list[dict], text: str, isa: str, budget: float, tag: str = "") -> list[dict]:
    """The rows of one cell on this CPU, of one tag (untagged: the first set)."""
    cpu = cpu_name()
    return [r for r in rows if (r["text"], r["isa"], r["budget"], r.get("cpu"), r.get("tag", "")) ==
            (text, isa, budget, cpu, tag)]


def fill(out: Path, texts: list[str], budgets: list[float], isas: list[str], configs: list[str],
         tag: str = "", steps: int | None = None) -> None:
    results = out / "results.jsonl"
    for isa in isas:
        for budget in budgets:
            for text in texts:
                for config in configs:
                    rows = cell_rows(read_jsonl(results), text, isa, budget, tag)
                    if config == "around":
                        auto = next((r for r in rows if r["config"] == "auto"), None)
                        wanted = around(auto) if auto else []
                    else:
                        wanted = [config]
                    for one in wanted:
                        if any(r["config"] == one for r in cell_rows(read_jsonl(results), text, isa, budget, tag)):
                            continue
                        print(f"{text} {isa} {budget:g} s {one} ...", file=sys.stderr, flush=True)
                        append_jsonl(results, run_one(text, one, isa, budget, out, tag, steps))


def report(rows: list[dict]) -> str:
    lines = []

    def cell(r: dict) -> tuple:  # (runs of fixed steps are a table of their own)
        return r.get("cpu", ""), r["isa"], r["budget"], r["text"], r.get("fixed_steps", 0)

    for cpu, isa, budget, text, steps in sorted({cell(r) for r in rows}):
        group = sorted((r for r in rows if cell(r) == (cpu, isa, budget, text, steps)), key=lambda r: r["val_loss"])
        fixed = min((r["val_loss"] for r in group if ":" in r["config"] and not r["config"].startswith("plain")),
                    default=None)
        lines += ["", f"### {text}, {budget:g} s{f' (each {steps:,} steps)' if steps else ''}, {cpu}, {isa}", "",
                  "| configuration | model | val loss (nats/char) | against the best fixed | steps | epochs | "
                  "ended at (of the budget) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in group:
            rate = f", lr {r['base_lr']:g}" if r.get("base_lr") else ""  # (rows from before 12-07 have none)
            model = f"{r['size']}, dropout {r['dropout']:g}, wd {r['weight_decay']:g}{rate}" if "size" in r else \
                f"{r.get('parameters', 0):,} parameters" if r["config"] == "gpt" else ""
            gap = "" if fixed is None else f"{r['val_loss'] - fixed:+.3f}"
            epochs, ended = r.get("epochs"), None if steps else r.get("cli_seconds")
            name = f"{r['config']} [{r['tag']}]" if r.get("tag") else r["config"]
            lines.append(f"| {name} | {model} | {r['val_loss']:.4f} | {gap} | {r['steps']:,} | "
                         f"{'' if epochs is None else f'{epochs:.2f}'} | "
                         f"{'' if ended is None else f'{ended / budget:.1%}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--out", type=Path, default=OUT / "suite")
    parser.add_argument("--texts", nargs="+", default=list(TEXTS), choices=list(TEXTS))
    parser.add_argument("--budgets", type=float, nargs="+", default=[60, 137, 411, 1800])
    parser.add_argument("--isa", nargs="+", default=["native", "AVX2"],
                        help="native, or an ONEDNN_MAX_CPU_ISA value such as AVX2 (default: both)")
    parser.add_argument("--configs", nargs="+", default=CONFIGS,
                        help="auto, around, LAYERSxHIDDEN:DROPOUT, plain:LAYERSxHIDDEN, gpt")
    parser.add_argument("--tag", default=None, type=tag_name,
                        help="a second set of the same runs (a repeat, or the code after a change): its rows and "
                             "folders carry the tag, and only runs with it count as done")
    parser.add_argument("--steps", type=int, default=None,
                        help="train fixed settings for this many steps, not the budget's time (tagged steps-N)")
    parser.add_argument("--report", action="store_true", help="only print the tables of what is done")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # (runs start in another folder)
    if args.steps is not None:
        if args.steps < 1 or (loose := [c for c in args.configs if not FIXED.fullmatch(c)]):
            parser.error(f"--steps runs fixed settings (LAYERSxHIDDEN:DROPOUT) for at least one step, not "
                         f"{args.steps if args.steps < 1 else ', '.join(loose)}")
        args.tag = args.tag or f"steps-{args.steps}"
    if not args.report:
        fill(args.out, args.texts, args.budgets, args.isa, args.configs, args.tag or "", args.steps)
    print(report(read_jsonl(args.out / "results.jsonl")))


if __name__ == "__main__":
    main()
