"""A lost worker under torchrun: SIGKILL one of two workers again and again, and let
torchrun start them again (``--max-restarts``) with the same command, ``--resume auto``.

One uninterrupted 2-process run gives the reference. Then the same job is started with
``--max-restarts KILLS``, and after each (re)start, once it has trained a random 2-5 s,
a worker picked at random is SIGKILLed. For each kill it records

- the steps lost: the last step logged before the kill against the step the restarted
  run resumes from (at most one checkpoint interval, ``--eval-every`` steps);
- the time to recover: from the kill until the run logs a step past the last one logged
  before it (torchrun stopping the other worker and starting two new ones, their imports,
  the text and the checkpoint read back, and the lost steps trained again);

and at the end whether the final weights equal the reference's, bit for bit.

    python -m benchmarks.lost_worker --kills 10             # ~3 min on 2 cores
    python -m benchmarks.lost_worker --kills 10 --nodes 2   # two simulated nodes
"""

from __future__ import annotations

import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, child_env, command_line, free_port, listening, read_jsonl
from chargen import checkpoint
from chargen.storage import load_tensors

FLAGS = ["--hidden", "64", "--embedding", "16", "--batch-size", "8", "--bptt", "32", "--steps", "6000",
         "--eval-every", "10", "--val-fraction", "0.005", "--log-every", "5", "--precision", "fp32",
         "--device", "cpu", "--quiet", "--seed", "5", "--resume", "auto"]


# One thread a process; and on several nodes a new store for each attempt, as docs/training.md says.
NODE_ENV = {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


class Job:
    """A torchrun job: one agent (``--standalone``, 2 processes), or one agent on each of
    ``nodes`` simulated nodes meeting at a c10d rendezvous on 127.0.0.1 (1 process each)."""

    def __init__(self, text: Path, run: Path, restarts: int, nodes: int = 1) -> None:
        train = ["-m", "chargen", "train", str(text), "--out", str(run), *FLAGS]
        if nodes == 1:
            where = ["--standalone", "--nproc_per_node=2"]
        else:
            port = free_port()
            where = ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                     f"127.0.0.1:{port}", "--rdzv-id", f"lost-worker-{port}"]
        command = [sys.executable, "-m", "torch.distributed.run", *where, f"--max-restarts={restarts}", *train]
        self.log, self.agents = run.parent / f"{run.name}.log", []  # (node 0's: rank 0 logs)
        for node in range(nodes):
            with open(run.parent / f"{run.name}{f'-node{node}' if node else ''}.log", "w") as log:
                # (a file: a pipe nobody reads would stall it)
                self.agents.append(subprocess.Popen(command, env=child_env(**NODE_ENV), stdout=log,
                                                    stderr=subprocess.STDOUT))
            if nodes > 1 and node == 0:
                while not listening(port):  # node 0 hosts the rendezvous, as the machine at --rdzv-endpoint does
                    time.sleep(0.05)

    def poll(self) -> int | None:
        """None while it runs; an exit status once an agent has failed or all have ended."""
        codes = [agent.poll() for agent in self.agents]
        failed = [code for code in codes if code]
        return failed[0] if failed else None if None in codes else 0

    def wait(self, timeout: float) -> int:
        return max(agent.wait(timeout=timeout) for agent in self.agents)

    def kill(self) -> None:
        for agent in self.agents:
            agent.kill()

    def workers(self) -> list[str]:
        return [pid for agent in self.agents for pid in
                subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout.split()]


def steps_logged(run: Path) -> list[int]:
    return [event["step"] for event in read_jsonl(run / checkpoint.METRICS) if event["event"] == "train"] \
        if (run / checkpoint.METRICS).exists() else []


def wait_for_step(job: Job, run: Path, after: int, timeout: float = 300) -> float:
    """When the run logged a step past ``after`` (time.monotonic()); raises if the job ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(step > after for step in steps_logged(run)):
            return time.monotonic()
        if job.poll() is not None:
            raise RuntimeError(f"the job ended (exit {job.poll()}) before step {after + 1}")
        time.sleep(0.01)
    raise RuntimeError(f"no step past {after} in {timeout:g} s")


def wait_for_restart(job: Job, log: Path, restarts: int, timeout: float = 300) -> int:
    """The step the next attempt resumes from, once its start-up report says so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resumed = re.findall(r"resuming the run.*?from step ([\d,]+)", log.read_text(), re.S)
        if len(resumed) > restarts:
            return int(resumed[-1].replace(",", ""))
        if job.poll() is not None:
            raise RuntimeError(f"the job ended (exit {job.poll()}) instead of restarting")
        time.sleep(0.01)
    raise RuntimeError(f"no restart in {timeout:g} s")


def kill_a_worker(job: Job, rng: random.Random) -> None:
    workers = job.workers()
    if len(workers) != 2:
        raise RuntimeError(f"expected 2 workers under torchrun, found {len(workers)}")
    subprocess.run(["kill", "-KILL", rng.choice(workers)], check=True)


def kill_and_recover(text: Path, work: Path, kills: int, seed: int, nodes: int = 1) -> dict:
    rng = random.Random(seed)
    reference = Job(text, work / "reference", 0, nodes)
    if reference.wait(timeout=1800) != 0:
        raise RuntimeError("the reference run failed: " + reference.log.read_text()[-2000:])
    run, lost, recovery = work / "killed", [], []
    job = Job(text, run, kills, nodes)
    log = job.log
    try:
        started = wait_for_step(job, run, 0)
        for restarts in range(kills):
            time.sleep(max(0.0, started + rng.uniform(2, 5) - time.monotonic()))
            kill_a_worker(job, rng)
            killed_at = time.monotonic()
            resumed = wait_for_restart(job, log, restarts)
            reached = max(steps_logged(run))  # (the killed attempt's last step: the new one has not passed it yet)
            started = wait_for_step(job, run, reached)
            lost.append(reached - resumed)
            recovery.append(started - killed_at)
        if job.wait(timeout=600) != 0:
            raise RuntimeError("the killed job failed: " + log.read_text()[-2000:])
    finally:
        job.kill()
    final = load_tensors(run / checkpoint.WEIGHTS)[0]
    expected = load_tensors(work / "reference" / checkpoint.WEIGHTS)[0]
    return {"kills": kills, "steps_lost": lost, "recovery_seconds": recovery,
            "identical": final.keys() == expected.keys() and all(final[k].equal(expected[k]) for k in final)}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill times and of which worker")
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                        help="2: two simulated nodes (a torchrun agent each, c10d rendezvous), one worker each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = kill_and_recover(ROOT / "corpora" / "shakespeare.txt", Path(tmp), args.kills, args.seed, args.nodes)
    lost, recovery = result["steps_lost"], result["recovery_seconds"]
    where = "on one node" if args.nodes == 1 else "on 2 simulated nodes, one each"
    print(f"\n{args.kills} kills of one of 2 torchrun workers {where}, seed {args.seed}; a 1x64 LSTM, batch 8 x 32, "
          f"a checkpoint every {FLAGS[FLAGS.index('--eval-every') + 1]} steps\n")
    print("| measure | value |\n| --- | ---: |")
    print(f"| kills survived (torchrun restarts) | {len(lost)} of {args.kills} |")
    print(f"| steps lost per kill: mean, most | {statistics.mean(lost):.1f}, {max(lost)} |")
    print(f"| time to recover, kill to a step past the last before it: median, most | "
          f"{statistics.median(recovery):.1f} s, {max(recovery):.1f} s |")
    print(f"| final weights equal the uninterrupted run's, bit for bit | {'yes' if result['identical'] else 'NO'} |")


if __name__ == "__main__":
    main()
