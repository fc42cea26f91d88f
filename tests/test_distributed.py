"""Training under torchrun: 2 processes with gloo on the CPU, against one process over the
same global batch."""

import json
import os
import random
import re
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
    import socket

    import torch.distributed as dist

    from chargen.distributed import from_environment, leave

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
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
        metrics, logs, deadline = tmp_path / "killed" / "metrics.jsonl", random.randint(5, 20), time.time() + 120
        while not (metrics.exists() and metrics.read_text().count('"train"') >= logs) and time.time() < deadline:
            time.sleep(0.02)
        workers = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2, "torchrun should run two workers"
        os.kill(int(workers[1]), signal.SIGKILL)
        logged = max(json.loads(line)["step"] for line in metrics.read_text().splitlines())
        job.wait(timeout=240)
    finally:
        job.kill()
    out = log.read_text()
    assert job.returncode == 0, out[-3000:]
    resumed_from = int(re.search(r"--resume auto: resuming.*?from step ([\d,]+)", out, re.S).group(1).replace(",", ""))
    assert 0 <= logged - resumed_from <= 10 and "finished at step 300 of 300" in out
    torchrun([*flags, "--out", "whole"], tmp_path)
    killed, whole = (load_file(tmp_path / run / "model.safetensors") for run in ("killed", "whole"))
    assert all(torch.equal(killed[name], whole[name]) for name in whole)
