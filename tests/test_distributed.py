"""Training under torchrun: 2 processes with gloo on the CPU, against one process over the
same global batch; two simulated nodes; a lost worker and a lost node."""

import contextlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import chargen
import chargen.cli
from benchmarks.common import free_port, listening
from chargen import ChargenError, load_corpus, train
from chargen.cli import main
from chargen.distributed import Ranks
from conftest import make_text, name_list, needs_bf16, tiny_model, tiny_train

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--hidden", "24", "--layers", "2", "--embedding", "8", "--batch-size", "8", "--bptt", "16",
         "--eval-every", "10", "--steps", "30", "--dropout", "0", "--precision", "fp32", "--device", "cpu",
         "--quiet", "--seed", "3"]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TORCHRUN_ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([*TORCHRUN, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=TORCHRUN_ENV)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ddp") / "tiny.txt"
    path.write_text(make_text(2000))
    return path


def losses(run: Path) -> list[float]:
    return [e["loss"] for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if e["event"] == "train"]


def test_two_processes_train_like_one_over_the_global_batch(text_file):
    base = text_file.parent
    out = torchrun(["-m", "chargen", "train", str(text_file), "--out", "ddp", *FLAGS], base)
    assert main(["train", str(text_file), "--out", str(base / "single"), *FLAGS]) == 0
    # The same losses and weights, up to the order of float sums.
    assert losses(base / "ddp") == pytest.approx(losses(base / "single"), rel=1e-5)
    ddp, single = load_file(base / "ddp" / "model.safetensors"), load_file(base / "single" / "model.safetensors")
    for name in single:
        torch.testing.assert_close(ddp[name], single[name], rtol=1e-4, atol=1e-5)
    # Rank 0 alone writes: one run folder like a one-process run's, each event once.
    assert sorted(p.name for p in (base / "ddp").iterdir()) == sorted(p.name for p in (base / "single").iterdir())
    events = (base / "ddp" / "metrics.jsonl").read_text().splitlines()
    assert len(events) == len(set(events)) == len((base / "single" / "metrics.jsonl").read_text().splitlines())
    assert out.stderr.count("finished at step 30") == 1  # rank 0 logs; never one line per rank
    assert json.loads((base / "ddp" / "config.json").read_text())["train"]["batch_size"] == 8


SCRIPT = textwrap.dedent("""
    import json, sys, threading
    import torch, torch.distributed as dist
    from chargen import load_corpus, train
    from chargen.distributed import from_environment, leave
    sys.path.insert(0, {tests!r})
    from conftest import tiny_model, tiny_train

    ranks, device = from_environment("cpu")
    stop = threading.Event()
    def hook(event):  # the app's Stop, at step 10, on rank 0 only: the ranks must agree
        if event["event"] == "train" and event["step"] == 10:
            stop.set()
    config = tiny_train(steps=20, batch_size=8, eval_every=5, sample_chars=0, precision="fp32")
    result = train(load_corpus({text!r}), {run!r}, tiny_model(dropout=0.0), config, on_event=hook,
                   stop=stop if ranks.main else None, ranks=ranks)
    flat = torch.cat([p.detach().flatten() for p in result.model.parameters()])
    every = [torch.empty_like(flat) for _ in range(ranks.world)]
    dist.all_gather(every, flat)
    spread = max((w - flat).abs().max().item() for w in every)
    leave(finished=True)
    report = {{"rank": ranks.rank, "step": result.step, "stopped": result.stopped, "spread": spread}}
    with open({run!r} + f"-rank{{ranks.rank}}.json", "w") as f:
        json.dump(report, f)
""")


def test_stop_on_one_rank_stops_all_and_resume_in_one_process(text_file, tmp_path):
    """Rank 0 alone sees Stop at step 10: every rank stops there (none waits forever) with
    the very same parameters, the checkpoint holds the state of all 8 streams, and one
    process resumes it to the end, matching a one-process run."""
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), text=str(text_file), run=str(tmp_path / "run")))
    torchrun([str(script)], tmp_path)
    reports = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("run-rank*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["step"] == 10 and r["stopped"] == "interrupted" for r in reports)
    assert all(r["spread"] == 0.0 for r in reports), "the ranks' parameters differ"
    corpus = load_corpus(text_file)
    config = tiny_train(steps=20, batch_size=8, eval_every=5, sample_chars=0, precision="fp32")
    resumed = train(corpus, tmp_path / "run", config=config, resume=True)
    whole = train(corpus, tmp_path / "whole", tiny_model(dropout=0.0), config)
    assert resumed.step == whole.step == 20
    assert resumed.last_val_loss == pytest.approx(whole.last_val_loss, rel=1e-5)
    a, b = load_file(tmp_path / "run" / "model.safetensors"), load_file(tmp_path / "whole" / "model.safetensors")
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_lines_mode_two_processes_train_like_one(tmp_path):
    """Lines mode under torchrun: each rank takes every other item of a bucketed batch (the
    global batch is their sum; 297 items at batch 8 end each epoch on a batch of one, where
    rank 1 steps with no weight), validation is split and summed: the same losses and
    weights as one process, up to the order of float sums."""
    names, val = tmp_path / "names.txt", tmp_path / "val.txt"
    names.write_text("\n".join(name_list(297)) + "\n")
    val.write_text("\n".join(name_list(40, seed=1)) + "\n")
    flags = [*FLAGS, "--mode", "lines", "--val-file", str(val), "--steps", "80", "--eval-every", "20"]
    out = torchrun(["-m", "chargen", "train", str(names), "--out", "ddp", *flags], tmp_path)
    assert main(["train", str(names), "--out", str(tmp_path / "single"), *flags]) == 0
    assert "8 items, about 4 on each of 2 processes" in out.stderr
    assert losses(tmp_path / "ddp") == pytest.approx(losses(tmp_path / "single"), rel=1e-5)
    ddp_val, single_val = (val_losses(tmp_path / run) for run in ("ddp", "single"))
    assert len(ddp_val) == 4 and ddp_val == pytest.approx(single_val, rel=1e-5)
    ddp, single = (load_file(tmp_path / run / "model.safetensors") for run in ("ddp", "single"))
    for name in single:
        torch.testing.assert_close(ddp[name], single[name], rtol=1e-4, atol=1e-5)


def val_losses(run: Path) -> list[float]:
    return [e["val_loss"] for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if e["event"] == "val"]


def test_refusals_before_any_process_waits(tmp_path, text_file):
    with pytest.raises(ChargenError, match="does not divide among 2 processes"):
        train(load_corpus(text_file), tmp_path / "b", tiny_model(), tiny_train(batch_size=5), ranks=Ranks(0, 2))


@needs_bf16
def test_bf16_autocast_on_cpu_trains_and_samples(tmp_path, text_file):
    result = train(load_corpus(text_file), tmp_path / "run", tiny_model(), tiny_train(steps=4, precision="bf16"))
    assert result.step == 4 and result.last_val_loss == result.last_val_loss  # not NaN
    model = chargen.load(tmp_path / "run", device="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        texts = model.generate_batch("the ", 30, num_samples=2, seed=1)
        texts += model.generate_batch("the ", 30, num_samples=12, seed=1)
    assert all(len(t) == len("the ") + 30 and t.startswith("the ") for t in texts)


def test_under_torchrun_one_process_joins_the_group_too(monkeypatch):
    """torchrun with one process runs the distributed code (DDP, agreement) as with many."""
    import torch.distributed as dist

    from chargen.distributed import from_environment, leave

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    ranks, device = from_environment("cpu")
    try:
        assert ranks.active and ranks.world == 1 and device == "cpu"
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert ranks.sum(torch.tensor([2.0])).item() == 2.0
    finally:
        leave()
    assert not dist.is_initialized()


@pytest.mark.parametrize("backend, message", [("mpi", "must be one of nccl, gloo"), ("nccl", "needs CUDA GPUs")])
def test_a_backend_that_cannot_run_is_one_clear_line(monkeypatch, backend, message):
    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("CUDA is here")
    from chargen.distributed import from_environment

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "CHARGEN_DIST_BACKEND": backend}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ChargenError, match=message):
        from_environment("cpu")
    assert not torch.distributed.is_initialized()


@pytest.mark.once  # (the restart's plumbing; exact resume under the AVX2 cap: test_train, test_reliability)
def test_a_worker_killed_mid_run_is_survived_through_torchruns_restart(text_file, tmp_path):
    """torchrun --max-restarts with --resume auto: rank 1 SIGKILLed at a random step; torchrun
    starts both ranks again with the same command, which resumes from the last checkpoint
    (at most one checkpoint interval lost), and the run ends with the weights of a run never
    interrupted, bit for bit."""
    flags = ["-m", "chargen", "train", str(text_file), *FLAGS, "--steps", "300", "--resume", "auto"]
    log = tmp_path / "torchrun.log"
    with log.open("w") as output:  # (a file, not a pipe that nobody reads while it runs)
        job = subprocess.Popen([*TORCHRUN, "--max-restarts=3", *flags, "--out", "killed"], cwd=tmp_path,
                               env=TORCHRUN_ENV, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_for_logs(tmp_path / "killed", random.randint(5, 20))
        pids = workers(job)
        assert len(pids) == 2, "torchrun should run two workers"
        os.kill(pids[1], signal.SIGKILL)
        logged = last_logged(tmp_path / "killed")  # (after the kill: the other rank waits at its next sum)
        job.wait(timeout=240)
    finally:
        job.kill()
    out = log.read_text()
    assert job.returncode == 0, out[-3000:]
    assert 0 <= logged - resumed_from(out) <= 10 and "finished at step 300 of 300" in out
    torchrun([*flags, "--out", "whole"], tmp_path)
    killed, whole = (load_file(tmp_path / run / "model.safetensors") for run in ("killed", "whole"))
    assert all(torch.equal(killed[name], whole[name]) for name in whole)


# --- two nodes, simulated: two torchrun agents on this machine, one process each ------------
NODES_ENV = TORCHRUN_ENV | {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # (as docs/training.md says for nodes)


class Nodes:
    """Two torchrun agents meeting at a c10d rendezvous on 127.0.0.1, as on two machines
    sharing a file system; node 0 starts first and hosts the rendezvous, as the machine at
    --rdzv-endpoint does."""

    def __init__(self, args: list[str], cwd: Path, restarts: int = 0) -> None:
        self.port, self.cwd, self.agents = free_port(), cwd, []
        self.command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id",
                        f"chargen-{self.port}", f"--max-restarts={restarts}", *args]

    def start(self) -> None:
        self.agents = [self.agent(0)]
        deadline = time.time() + 60
        while not listening(self.port) and time.time() < deadline:  # (node 1 joins once node 0 hosts it)
            time.sleep(0.05)
        self.agents.append(self.agent(1))

    def agent(self, node: int) -> subprocess.Popen:
        with (self.cwd / f"node{node}.log").open("a") as output:
            return subprocess.Popen(self.command, cwd=self.cwd, env=NODES_ENV, stdout=output,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return "".join((self.cwd / f"node{node}.log").read_text() for node in (0, 1))

    def wait(self) -> None:
        try:
            codes = [agent.wait(timeout=240) for agent in self.agents]
        finally:
            self.kill()
        assert codes == [0, 0], self.log()[-3000:]

    def kill(self, node: int | None = None) -> None:
        """SIGKILL a node's agent and its worker (all of them by default): a machine lost."""
        for agent in self.agents if node is None else [self.agents[node]]:
            for pid in [*workers(agent), agent.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            agent.wait()


def workers(agent: subprocess.Popen) -> list[int]:
    return [int(pid) for pid in subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True,
                                               text=True).stdout.split()]


def wait_for_logs(run: Path, logs: int) -> None:
    """Wait until the run has written ``logs`` training log lines."""
    metrics, deadline = run / "metrics.jsonl", time.time() + 120
    while not (metrics.exists() and metrics.read_text().count('"train"') >= logs) and time.time() < deadline:
        time.sleep(0.02)


def last_logged(run: Path) -> int:
    return max(json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines())


@pytest.mark.once  # (two agents' plumbing; what each trains is the two processes' test above)
def test_two_nodes_train_like_one_process(text_file, tmp_path):
    nodes = Nodes(["-m", "chargen", "train", str(text_file), "--out", "two", *FLAGS], tmp_path)
    nodes.start()
    nodes.wait()
    assert main(["train", str(text_file), "--out", str(tmp_path / "one"), *FLAGS]) == 0
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    assert "4 on each of 2 processes" in nodes.log() and nodes.log().count("finished at step 30 of 30") == 1


@pytest.mark.once
def test_on_two_nodes_a_lost_worker_and_a_lost_node_are_survived(text_file, tmp_path):
    """A worker SIGKILLed on node 1: both agents start their workers again (--max-restarts)
    and the run goes on from its last checkpoint. Node 1 lost whole (agent and worker), then
    torchrun started on it again: node 0's agent takes it into a new round, and --resume auto
    goes on. Either way the run ends with the weights of one never interrupted, bit for bit."""
    args = ["-m", "chargen", "train", str(text_file), *FLAGS, "--steps", "150", "--resume", "auto", "--out"]
    runs = {run: Nodes([*args, str(tmp_path / run)], tmp_path / f"{run}-nodes", restarts=0 if run == "whole" else 3)
            for run in ("whole", "worker", "node")}
    for run, nodes in runs.items():
        nodes.cwd.mkdir()
        nodes.start()
        if run != "whole":
            wait_for_logs(tmp_path / run, random.randint(4, 12))
            if run == "worker":
                os.kill(workers(nodes.agents[1])[0], signal.SIGKILL)
                logged = last_logged(tmp_path / run)
            else:
                nodes.kill(1)  # (node 0's worker fails at its next sum; its agent waits for a node 1)
                logged = last_logged(tmp_path / run)
                nodes.agents[1] = nodes.agent(1)  # (the machine back, or another in its place: torchrun again)
        nodes.wait()
        if run != "whole":
            out = nodes.log()
            assert 0 <= logged - resumed_from(out) <= 10 and "finished at step 150 of 150" in out, out[-3000:]
    final = load_file(tmp_path / "whole" / "model.safetensors")
    for run in ("worker", "node"):
        weights = load_file(tmp_path / run / "model.safetensors")
        assert all(torch.equal(weights[name], final[name]) for name in final), run


def resumed_from(log: str) -> int:
    """The step a --resume auto run went on from, by its log."""
    return int(re.search(r"--resume auto: resuming.*?from step ([\d,]+)", log, re.S).group(1).replace(",", ""))


def test_the_slurm_example_is_a_valid_script_with_valid_commands():
    """examples/slurm.sbatch parses as bash, and its srun line's torchrun and chargen
    arguments parse with torchrun's and chargen's own parsers (its variables set as SLURM
    and the defaults would)."""
    script = ROOT / "examples" / "slurm.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "\nexport TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n" in text
    args = re.search(r"^ARGS=\$\{ARGS:-(.*)\}$", text, re.M).group(1)
    values = {"SLURM_NNODES": "2", "PROCS": "4", "HEAD": "node001", "SLURM_JOB_ID": "42", "TEXT": "t.txt",
              "RUN": "runs/x"}
    line = re.search(r"^srun (.*)$", text.replace("\\\n", " "), re.M).group(1)
    line = re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), f"${m.group(1)}"), line).replace("$ARGS", args)
    words = shlex.split(line)
    assert words[0] == "torchrun" and "$" not in " ".join(words)
    from torch.distributed.run import get_args_parser

    launch = get_args_parser().parse_args(words[1:])
    assert (launch.nnodes, launch.rdzv_endpoint, launch.module, launch.training_script) == \
        ("2", "node001:29500", True, "chargen")
    train_args = chargen.cli.build_parser().parse_args(launch.training_script_args)
    assert (train_args.resume, train_args.save_every, train_args.keep) == ("auto", 10.0, 2)


@pytest.mark.once
def test_ranks_with_folders_of_their_own_train_then_stop_with_one_line_at_a_resume(text_file, tmp_path):
    """Each machine's own --out, not a shared one: a new run trains, rank 0 alone writing its
    folder (rank 1 once asked its own missing folder for free space, and crashed); then
    --resume auto finds a run on rank 0 and none on rank 1, and both stop with one line
    saying why, before anything is written."""
    flags = [*FLAGS, "--steps", "10"]
    script = tmp_path / "local.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        from chargen.cli import main
        out = {str(tmp_path)!r} + "/run" + os.environ["RANK"]
        sys.exit(main(["train", {str(text_file)!r}, "--out", out, *{flags!r}, *sys.argv[1:]]))
    """))
    torchrun([str(script)], tmp_path)
    assert (tmp_path / "run0" / "model.safetensors").is_file() and not (tmp_path / "run1").exists()
    before = (tmp_path / "run0" / "metrics.jsonl").read_text()
    job = subprocess.run([*TORCHRUN, str(script), "--resume", "auto"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=TORCHRUN_ENV)
    assert job.returncode != 0
    # (one line from each rank; the two share torchrun's stderr, where their writes may interleave)
    said = "chargen: error: the processes disagree on whether"
    assert job.stderr.count(said) == 2 and job.stderr.count("(a shared file system)") == 2, job.stderr[-3000:]
    assert not (tmp_path / "run1").exists() and (tmp_path / "run0" / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("agents, shared, advised", [("2", "True", True), ("2", "False", False), ("1", "True", False)])
def test_several_machines_sharing_torchruns_store_are_told_how_to_restart_safely(monkeypatch, agents, shared,
                                                                                 advised):
    from chargen.distributed import shared_store_advice

    monkeypatch.setenv("GROUP_WORLD_SIZE", agents)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", shared)
    advice = shared_store_advice()
    assert (advice is not None) == advised
    assert advice is None or "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in advice
