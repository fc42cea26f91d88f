"""Fine-tuning against training from scratch on another author's text, at equal wall time
(issue 18): the shipped Shakespeare model (``--init-from models/shakespeare``) against a
new model of the same shape (1x512) and against the size chargen picks for the budget.

The text: Books I-V of Milton's *Paradise Lost* (public domain; the whole books within its
first 200,000 characters: 196,033), from the Canterbury corpus file
``tests/testdata/plrabn12.txt`` inside the source archive of the PyPI package
``Brotli==1.1.0`` (MIT licence). Like corpora/build.py it is taken from a pinned package's
files, not from the web at run time; the archive is checked against its SHA-256.
Cleaned: the 1992 etext introduction, the end mark and the stray "***" markers dropped,
trailing spaces trimmed, runs of blank lines made one, LF line endings. Split 90/10 into a
training file and a validation file (``--val-file``), the same for every run.

    pip download Brotli==1.1.0 --no-deps --no-binary Brotli -d benchmarks/out/finetune
    python -m benchmarks.finetune                     # natively and under the AVX2 cap: ~7 min
    python -m benchmarks.finetune --report            # the table from what is done

Each run is ``chargen train TRAIN --val-file VAL --max-time 60`` plus its flags; its figure
is the best validation loss in its summary. Runs are timed: one at a time, on a quiet machine.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, append_jsonl, child_env, command_line, corpus_split, cpu_name, read_jsonl

SDIST = "Brotli-1.1.0.tar.gz"
SDIST_SHA256 = "81de08ac11bcb85841e440c13611c00b67d3bf82698314928d0b676362546724"
MEMBER = "Brotli-1.1.0/tests/testdata/plrabn12.txt"
CHARS = 200_000
CONFIGS = {
    "fine-tuned": ["--init-from", str(ROOT / "models" / "shakespeare")],
    "scratch 1x512": ["--hidden", "512", "--layers", "1", "--embedding", "64"],
    "scratch, size for the budget": [],
}


def milton(raw: str) -> str:
    """The poem from the etext: from its title, without the end mark, markers and padding."""
    lines = [line.rstrip() for line in raw.replace("\r\n", "\n").split("\n")]
    lines = lines[lines.index("Paradise Lost"):]
    text = "\n".join(line.replace("***", "").rstrip() for line in lines)
    text = text.replace("[The End]", "").replace("\x1a", "")
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def prepare(out: Path, sdist: Path) -> tuple[Path, Path]:
    """OUT/data/train.txt and val.txt: the text split 90/10 at a line break (made once)."""
    return corpus_split(out / "data", lambda: milton_text(sdist), at_line=True)


def milton_text(sdist: Path) -> str:
    """Books I-V, whole, from the pinned source archive (checked against its SHA-256)."""
    if not sdist.is_file():
        raise SystemExit(f"{sdist} is missing; fetch it with:\n"
                         f"  pip download Brotli==1.1.0 --no-deps --no-binary Brotli -d {sdist.parent}")
    if hashlib.sha256(sdist.read_bytes()).hexdigest() != SDIST_SHA256:
        raise SystemExit(f"{sdist} is not the pinned Brotli 1.1.0 source archive (SHA-256 differs)")
    with tarfile.open(sdist) as archive:
        raw = archive.extractfile(MEMBER).read().decode("ascii")
    poem = milton(raw)
    return poem[: poem.rfind("\n\nBook ", 0, CHARS) + 1]  # (whole books)


def run_one(config: str, isa: str, budget: float, out: Path, train: Path, val: Path) -> dict:
    run = out / "runs" / f"{isa}-{config.replace(' ', '_').replace(',', '')}"
    cmd = [sys.executable, "-m", "chargen", "train", str(train), "--val-file", str(val), "--out", str(run),
           "--max-time", str(budget), "--mode", "stream", "--force", "--quiet", *CONFIGS[config]]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=child_env(ROOT, isa), cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{config} ({isa}) failed:\n{(done.stderr or done.stdout)[-2000:]}")
    (run / "log.txt").write_text(done.stdout + done.stderr)
    saved = json.loads((run / "config.json").read_text())
    summary, model = saved["summary"], saved["model"]
    return {"config": config, "isa": isa, "budget": budget, "cpu": cpu_name(), "wall_seconds": round(wall, 1),
            "val_loss": summary["best_val_loss"], "steps": summary["step"],
            "chars_per_s": round(summary["chars_seen"] / summary["train_seconds"]),
            "model": f"{model['layers']}x{model['hidden']}, dropout {model['dropout']}",
            "new_chars": saved.get("init_from", {}).get("new_chars"), "precision": saved.get("precision_used")}


def report(rows: list[dict]) -> str:
    lines = []
    for where in sorted({(r["cpu"], r["isa"], r["budget"]) for r in rows}):
        group = [r for r in rows if (r["cpu"], r["isa"], r["budget"]) == where]
        scratch = min((r["val_loss"] for r in group if r["config"] != "fine-tuned"), default=None)
        lines += ["", f"### {where[0]}, {where[1]}, {where[2]:g} s each", "",
                  "| run | model | best val loss (nats/char) | bits/char | against scratch's best | steps | chars/s |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in sorted(group, key=lambda r: r["val_loss"]):
            gap = "" if scratch is None else f"{r['val_loss'] - scratch:+.3f}"
            lines.append(f"| {r['config']} | {r['model']} | {r['val_loss']:.4f} | {r['val_loss'] / 0.693147:.3f} | "
                         f"{gap} | {r['steps']:,} | {r['chars_per_s']:,} |")
    return "\n".join(lines)


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--out", type=Path, default=OUT / "finetune")
    parser.add_argument("--sdist", type=Path, help=f"the Brotli source archive (default OUT/{SDIST})")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds each run trains (default 60)")
    parser.add_argument("--isa", nargs="+", default=["native", "AVX2"],
                        help="native, or an ONEDNN_MAX_CPU_ISA value such as AVX2 (default: both)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--report", action="store_true", help="only print the table of what is done")
    args = parser.parse_args()
    args.out = args.out.resolve()
    train, val = prepare(args.out, (args.sdist or args.out / SDIST).resolve())
    if not args.report:
        for isa in args.isa:
            for config in args.configs:
                print(f"{isa}: {config} ...", file=sys.stderr, flush=True)
                row = run_one(config, isa, args.budget, args.out, train, val)
                append_jsonl(args.out / "results.jsonl", row)
    print(report(read_jsonl(args.out / "results.jsonl")))


if __name__ == "__main__":
    main()
