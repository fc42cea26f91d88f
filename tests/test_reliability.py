"""Crash safety: SIGKILL at random moments and in the middle of a checkpoint write, and a
full disk during a checkpoint."""

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import crash_safety
from chargen import ChargenError, checkpoint, faults, load_corpus, train
from chargen.storage import load_tensors
from conftest import make_text, tiny_model, tiny_train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def long_text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("crash") / "text.txt"
    path.write_text(make_text(3000, seed=2))
    return path


def test_random_sigkills_lose_nothing(long_text, tmp_path):
    """The benchmark's harness, smaller: 3 SIGKILLs at random moments, a resume after each;
    every checkpoint loads, at most one checkpoint interval is lost, and the final weights
    are the uninterrupted run's, bit for bit."""
    flags = ["--hidden", "32", "--embedding", "8", "--batch-size", "8", "--bptt", "16", "--steps", "1000",
             "--eval-every", "10", "--log-every", "5", "--precision", "fp32", "--device", "cpu", "--quiet"]
    result = crash_safety.kill_and_resume(long_text, tmp_path, kills=3, seed=1, flags=flags, delay=(2.0, 3.5))
    assert result["kills"] == 3
    assert result["corrupt_checkpoints"] == 0
    assert result["max_steps_lost"] <= 10
    assert result["final_weights_identical"]


KILL_IN_WRITE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from chargen import checkpoint, faults, load_corpus, train
    from conftest import tiny_model, tiny_train

    def die_in_the_second_trainer_state_write(path, stage):
        # the temp file is complete and synced; the rename that would publish it never happens
        if path.name == "state.safetensors" and stage == "rename" and path.exists():
            os.kill(os.getpid(), signal.SIGKILL)

    faults.install(faults.Faults(write=die_in_the_second_trainer_state_write))
    train(load_corpus({text!r}), {run!r}, tiny_model(), tiny_train(steps=30, eval_every=5, precision="fp32"))
""")


def test_sigkill_in_the_middle_of_a_checkpoint_write(long_text, tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "die.py"
    script.write_text(KILL_IN_WRITE.format(tests=str(ROOT / "tests"), text=str(long_text), run=str(run)))
    died = subprocess.run([sys.executable, str(script)], env=os.environ | {"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert died.returncode == -9, died.stderr[-2000:]
    temps = [p for d in (run, run / "trainer") for p in d.glob(".*.tmp")]
    assert temps, "the kill should have left the half-done write's temp file"
    loads, step = crash_safety.checkpoint_files_load(run)
    assert loads and step == 5  # the first checkpoint, whole; the second never replaced it
    config = tiny_train(steps=30, eval_every=5, precision="fp32")
    resumed = train(load_corpus(long_text), run, config=config, resume=True)
    assert resumed.step == 30 and not [p for d in (run, run / "trainer") for p in d.glob(".*.tmp")]
    train(load_corpus(long_text), tmp_path / "whole", tiny_model(), config)
    a = load_tensors(run / checkpoint.WEIGHTS)[0]
    b = load_tensors(tmp_path / "whole" / checkpoint.WEIGHTS)[0]
    assert all(a[k].equal(b[k]) for k in b)


def test_full_disk_during_a_checkpoint_is_a_clear_error(long_text, tmp_path):
    corpus, run = load_corpus(long_text), tmp_path / "run"
    config = tiny_train(steps=20, eval_every=5, precision="fp32")

    def disk_full_after_the_first_checkpoint(path, stage):
        if stage == "write" and (run / checkpoint.TRAINER).exists():
            raise OSError(errno.ENOSPC, "No space left on device")

    with faults.injected(faults.Faults(write=disk_full_after_the_first_checkpoint)), \
            pytest.raises(ChargenError, match="No space left on device.*free some disk space.*intact"):
        train(corpus, run, tiny_model(), config)
    loads, step = crash_safety.checkpoint_files_load(run)
    assert loads and step == 5
    assert not [p for d in (run, run / "trainer") for p in d.glob(".*.tmp")]  # cleaned up on the way out
    assert train(corpus, run, config=config, resume=True).step == 20


def nan_loss(at_steps, once: bool = False) -> faults.Faults:
    """The training loss NaN at the given steps (counted from 1), the way a blown-up step
    would be; ``once``: only the first time a step comes round."""
    seen = set()

    def loss(step, value):
        if at_steps(step) and not (once and step in seen):
            seen.add(step)
            return value * float("nan")
        return value

    return faults.Faults(loss=loss)


def test_a_nan_loss_goes_back_to_the_checkpoint_at_half_the_lr(long_text, tmp_path):
    with faults.injected(nan_loss(lambda step: step == 13, once=True)):
        result = train(load_corpus(long_text), tmp_path / "run", tiny_model(),
                       tiny_train(steps=20, eval_every=5, precision="fp32"))
    assert result.stopped == "done" and result.step == 20
    (event,) = [e for e in result.history if e["event"] == "nonfinite"]
    assert event["at_step"] == 12 and event["step"] == 10 and event["lr_factor"] == 0.5
    lrs = {e["step"]: e["lr"] for e in result.history if e["event"] == "train"}
    assert all(v == v for v in lrs.values())  # no NaN anywhere in the record
    weights = load_tensors(tmp_path / "run" / checkpoint.WEIGHTS)[0]
    assert all(t.isfinite().all() for t in weights.values())
    saved = load_tensors(tmp_path / "run" / checkpoint.TRAINER)[1]["progress"]
    assert saved["lr_factor"] == 0.5 and saved["nonfinite"] == 1  # a resume keeps the lower lr


def test_nan_that_keeps_coming_stops_with_a_clear_message(long_text, tmp_path):
    with faults.injected(nan_loss(lambda step: step >= 13)), \
            pytest.raises(ChargenError, match="NaN or infinite again.*after 3 returns.*lower --base-lr"):
        train(load_corpus(long_text), tmp_path / "run", tiny_model(), tiny_train(steps=20, eval_every=5))
    with faults.injected(nan_loss(lambda step: step >= 2)), \
            pytest.raises(ChargenError, match="before the first checkpoint.*start again with --force"):
        train(load_corpus(long_text), tmp_path / "early", tiny_model(), tiny_train(steps=20, eval_every=5))


def test_no_fault_outside_injected(long_text, tmp_path):
    """The seams are no-ops once the block ends: the same run then trains clean."""
    with faults.injected(nan_loss(lambda step: True)), pytest.raises(ChargenError):
        train(load_corpus(long_text), tmp_path / "a", tiny_model(), tiny_train(steps=4, eval_every=2))
    assert train(load_corpus(long_text), tmp_path / "b", tiny_model(), tiny_train(steps=4, eval_every=2)).step == 4
