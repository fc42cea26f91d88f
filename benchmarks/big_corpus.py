"""Big corpora: peak memory and time to the first training step, for a 1 GB text.

The big file is built here by repeating the shipped Shakespeare until it reaches
``--size-mb``. ``chargen train`` (CLI defaults, stream mode) runs under ``/usr/bin/time -v``
for a few steps on it, and on the shipped 4.8 MB file as the baseline in the same run; the
table gives peak resident memory, the time until the run is set up (its config.json is
written: the text read and encoded, the model built) and until its first step is logged,
each measured from the start of the command, and the ratios big / baseline.

Targets (issue 7): peak resident memory under 2.5 GB and the first step within 90 s.

    python -m benchmarks.big_corpus                 # 1 GB: ~2 min on 2 cores, 1 GB of disk
    python -m benchmarks.big_corpus --size-mb 64    # a quick look
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import OUT, ROOT, command_line, write_json

SHAKESPEARE = ROOT / "corpora" / "shakespeare.txt"
NAMES = ROOT / "corpora" / "first_names.txt"
TARGET_RSS_MB, TARGET_FIRST_STEP_S = 2.5 * 1024, 90.0


def build(path: Path, size_mb: int, source: Path) -> None:
    piece = source.read_bytes()
    with open(path, "wb") as out:
        while out.tell() < size_mb * 2**20:
            out.write(piece)


def first_event_time(metrics: Path, start: float, process: subprocess.Popen, timeout: float) -> float | None:
    """Seconds from ``start`` until the run logs its first training step."""
    while time.perf_counter() - start < timeout and process.poll() is None:
        if metrics.exists() and '"event": "train"' in metrics.read_text():
            return time.perf_counter() - start
        time.sleep(0.05)
    return None


def run(text: Path, out: Path, steps: int, timeout: float, mode: str = "stream") -> dict:
    run_dir, log_path = out / f"run-{text.stem}", out / f"{text.stem}.log"
    shutil.rmtree(run_dir, ignore_errors=True)  # its files are how the run's progress is seen
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "chargen", "train", str(text), "--out", str(run_dir),
               "--force", "--mode", mode, "--steps", str(steps), "--log-every", "1", "--eval-every", "100000",
               "--sample-chars", "0", "--device", "cpu", "--quiet"]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        ready = None
        while ready is None and process.poll() is None and time.perf_counter() - start < timeout:
            if (run_dir / "config.json").exists():
                ready = time.perf_counter() - start
            time.sleep(0.05)
        first_step = first_event_time(run_dir / "metrics.jsonl", start, process, timeout)
        try:
            process.wait(timeout=max(1.0, timeout - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    total = time.perf_counter() - start
    output = log_path.read_text()
    if process.returncode != 0:
        sys.exit(f"chargen train on {text} failed ({process.returncode}):\n{output[-3000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", output).group(1))
    config = json.loads((run_dir / "config.json").read_text())
    return {"file": text.name, "mode": mode, "mb": text.stat().st_size / 2**20, "chars": config["corpus"]["chars"],
            "ready_s": ready, "first_step_s": first_step, "total_s": total, "peak_rss_mb": rss_kb / 1024,
            "steps": config["summary"]["step"], "best_val_bpc": config["summary"]["best_val_bpc"]}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the big file (default %(default)s)")
    parser.add_argument("--list-mb", type=int, default=100, help="size of a list of names (first_names.txt "
                        "repeated) also trained in lines mode; 0 for none (default %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="training steps of each run (default %(default)s)")
    parser.add_argument("--work", type=Path, help="folder for the big file and the runs (default: a temp folder, "
                        "removed afterwards)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds each run may take (default %(default)s)")
    args = parser.parse_args()
    if not Path("/usr/bin/time").exists():
        sys.exit("needs /usr/bin/time (Debian: apt-get install time)")
    work = args.work or Path(tempfile.mkdtemp(prefix="chargen-big-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        big, names = work / f"big{args.size_mb}mb.txt", work / f"names{args.list_mb}mb.txt"
        for path, size_mb, source in ((big, args.size_mb, SHAKESPEARE), (names, args.list_mb, NAMES)):
            if size_mb and (not path.exists() or path.stat().st_size < size_mb * 2**20):
                started = time.perf_counter()
                build(path, size_mb, source)
                print(f"built {path} ({path.stat().st_size / 2**20:,.0f} MB) in {time.perf_counter() - started:.1f} s")
        rows = [run(SHAKESPEARE, work, args.steps, args.timeout), run(big, work, args.steps, args.timeout)]
        if args.list_mb:
            rows.append(run(names, work, args.steps, args.timeout, mode="lines"))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    def cell(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    print(f"\nchargen train, CLI defaults, {args.steps} steps and one validation, CPU\n")
    print("| file | mode | MB | characters | set up (s) | first step (s) | whole run (s) | peak RSS (MB) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['file']} | {row['mode']} | {row['mb']:,.1f} | {row['chars']:,} | "
              f"{cell(row['ready_s'], '.1f')} | {cell(row['first_step_s'], '.1f')} | {row['total_s']:.1f} | "
              f"{row['peak_rss_mb']:,.0f} |")
    small, large = rows[:2]

    def ratio(key: str) -> str:
        return "n/a" if not (large[key] and small[key]) else f"{large[key] / small[key]:.1f}x"

    print(f"| ratio big / baseline | | {large['mb'] / small['mb']:.0f}x | | {ratio('ready_s')} | "
          f"{ratio('first_step_s')} | {ratio('total_s')} | {ratio('peak_rss_mb')} |")
    ok_rss = large["peak_rss_mb"] < TARGET_RSS_MB
    ok_start = large["first_step_s"] is not None and large["first_step_s"] < TARGET_FIRST_STEP_S
    print(f"\npeak RSS {large['peak_rss_mb']:,.0f} MB (target < {TARGET_RSS_MB:,.0f}): "
          f"{'met' if ok_rss else 'MISSED'}; first step at {cell(large['first_step_s'], '.1f')} s "
          f"(target < {TARGET_FIRST_STEP_S:.0f}): {'met' if ok_start else 'MISSED'}")
    write_json(OUT / "big_corpus.json", rows)


if __name__ == "__main__":
    main()
