"""Crash safety: SIGKILL a training run at random moments, resume it each time, and check.

One uninterrupted run of ``chargen train`` gives the reference. Then the same run is
started, killed with SIGKILL (no chance to save) after a random delay, and resumed with
``--resume``, again and again until it finishes. After every kill it checks that

- every checkpoint file on disk loads (trainer state, latest and best weights);
- the work lost is at most one checkpoint interval (``--eval-every`` steps): the step the
  run resumes from against the last step it logged before the kill;

and at the end that the final weights equal the reference's bit for bit. Kills that land
during a checkpoint write leave a partial temp file beside the checkpoint; those are
counted (and removed by the resume).

    python -m benchmarks.crash_safety --kills 20        # ~2.5 min on 2 cores
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, child_env, command_line, read_jsonl
from chargen import ChargenError, checkpoint
from chargen.storage import load_tensors

FLAGS = ["--hidden", "64", "--embedding", "16", "--batch-size", "8", "--bptt", "32", "--steps", "12000",
         "--eval-every", "10", "--val-fraction", "0.005", "--log-every", "5", "--precision", "fp32",
         "--device", "cpu", "--quiet", "--seed", "5"]


def train(text: Path, run: Path, flags: list[str], resume: bool) -> subprocess.Popen:
    command = [sys.executable, "-m", "chargen", "train", str(text), "--out", str(run), *flags]
    command.append("--resume" if resume else "--force")
    env = child_env(OMP_NUM_THREADS="1")
    # The log goes to a file: a pipe nobody reads until the end fills up and stalls the run.
    with open(log_path(run), "a") as log:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)


def log_path(run: Path) -> Path:
    return run.parent / f"{run.name}.log"


def log_tail(run: Path) -> str:
    return log_path(run).read_text()[-2000:]


def last_logged_step(run: Path) -> int:
    return max((event["step"] for event in read_jsonl(run / checkpoint.METRICS)), default=0)


def checkpoint_files_load(run: Path) -> tuple[bool, int | None]:
    """Whether every checkpoint file present loads, and the step of the resume point."""
    step = None
    for name in (checkpoint.TRAINER, checkpoint.WEIGHTS, checkpoint.BEST):
        if (run / name).exists():
            try:
                _, meta = load_tensors(run / name)
            except ChargenError:
                return False, None
            if name == checkpoint.TRAINER:
                step = meta["progress"]["step"]
    return True, step


def kill_and_resume(text: Path, work: Path, kills: int, seed: int, flags: list[str] = FLAGS,
                    delay: tuple[float, float] = (1.5, 4.0)) -> dict:
    """The whole harness: returns the counts and whether the final weights match."""
    rng = random.Random(seed)
    reference = train(text, work / "reference", flags, resume=False)
    if reference.wait() != 0:
        raise RuntimeError(f"the reference run failed: {log_tail(work / 'reference')}")
    run = work / "killed"
    done = killed = corrupt = mid_write = 0
    lost: list[int] = []
    started = False
    while not done:
        has_checkpoint = (run / checkpoint.TRAINER).exists()
        process = train(text, run, flags, resume=started and has_checkpoint)
        started = True
        if killed < kills:
            try:
                process.wait(timeout=rng.uniform(*delay))
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
                killed += 1
                temps = [p for d in (run, run / "trainer") if d.is_dir() for p in d.glob(".*.tmp")]
                mid_write += bool(temps)
                loads, step = checkpoint_files_load(run)
                corrupt += not loads
                lost.append(last_logged_step(run) - (step or 0))
                continue
        else:
            process.wait()
        if process.returncode != 0:
            raise RuntimeError(f"a resumed run failed: {log_tail(run)}")
        done = 1
    final = load_tensors(run / checkpoint.WEIGHTS)[0]
    expected = load_tensors(work / "reference" / checkpoint.WEIGHTS)[0]
    same = final.keys() == expected.keys() and all(final[k].equal(expected[k]) for k in final)
    return {"kills": killed, "corrupt_checkpoints": corrupt, "kills_mid_write": mid_write,
            "max_steps_lost": max(lost, default=0), "checkpoint_interval": int(flags[flags.index("--eval-every") + 1]),
            "final_weights_identical": same}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill times")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = kill_and_resume(ROOT / "corpora" / "shakespeare.txt", Path(tmp), args.kills, args.seed)
    print(f"\n{args.kills} kills, seed {args.seed}, {time.perf_counter() - start:.0f} s; "
          f"a 1x64 LSTM, {int(FLAGS[FLAGS.index('--steps') + 1]):,} steps, "
          f"a checkpoint every {result['checkpoint_interval']} steps\n")
    print("| measure | value | target |")
    print("| --- | ---: | ---: |")
    print(f"| SIGKILLs survived | {result['kills']} | >= 20 |")
    print(f"| kills that landed during a checkpoint write | {result['kills_mid_write']} | |")
    print(f"| corrupt checkpoints after a kill | {result['corrupt_checkpoints']} | 0 |")
    print(f"| most steps lost to one kill | {result['max_steps_lost']} | <= {result['checkpoint_interval']} |")
    print(f"| final weights equal the uninterrupted run's, bit for bit | "
          f"{'yes' if result['final_weights_identical'] else 'NO'} | yes |")


if __name__ == "__main__":
    main()
