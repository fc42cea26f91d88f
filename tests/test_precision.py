"""Precision by what the kernels do: bf16 (and fp16) are tried, not read off the CPU's flags;
``auto`` falls back to fp32 and says why; an explicit precision that cannot run is refused
in one line, and no message suggests what this machine cannot do."""

import os
import platform
import subprocess
import sys

import pytest
import torch

from chargen import ChargenError
from chargen import device as device_module
from chargen.device import resolve_precision
from conftest import BF16_PROBLEM, ROOT, TINY_FLAGS, config_json

CPU = torch.device("cpu")


def test_fp32_and_unknown_names():
    assert resolve_precision("fp32", CPU) == (None, "fp32")
    with pytest.raises(ChargenError, match="--precision must be one of"):
        resolve_precision("fp8", CPU)


def test_fp16_on_the_cpu_is_refused_with_advice_that_runs_here():
    with pytest.raises(ChargenError, match="fp16 is for CUDA GPUs") as refused:
        resolve_precision("fp16", CPU)
    assert "bf16" not in str(refused.value)  # it may not run here; auto and fp32 always do


def test_explicit_bf16_follows_the_probe():
    if BF16_PROBLEM is None:
        assert resolve_precision("bf16", CPU) == (torch.bfloat16, "bf16 autocast")
    else:
        with pytest.raises(ChargenError, match="--precision bf16 does not run on this CPU"):
            resolve_precision("bf16", CPU)


def test_auto_is_fp32_where_bf16_fails(monkeypatch):
    monkeypatch.setattr(device_module, "autocast_problem", lambda device, dtype: "no bf16 LSTM kernel")
    dtype, note = resolve_precision("auto", CPU)
    assert dtype is None and note == "fp32: bf16 autocast does not run on this CPU: no bf16 LSTM kernel"
    with pytest.raises(ChargenError, match=r"bf16 does not run on this CPU \(no bf16 LSTM kernel\); use"):
        resolve_precision("bf16", CPU)


@pytest.mark.parametrize("speedup, expected", [(0.25, None), (1.0, None), (1.8, torch.bfloat16)])
def test_auto_takes_bf16_only_where_it_is_faster(monkeypatch, speedup, expected):
    """Emulated bf16 runs, but slowly (AVX-512 without AVX512-BF16): auto must not take it."""
    monkeypatch.setattr(device_module, "autocast_problem", lambda device, dtype: None)
    monkeypatch.setattr(device_module, "bf16_speedup", lambda device: speedup)
    dtype, note = resolve_precision("auto", CPU)
    assert dtype is expected and f"{speedup:.1f}" in note


def test_probe_reports_a_failing_kernel_in_one_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("could not create a primitive descriptor for the LSTM forward propagation primitive. "
                           "Run workload with environment variable ONEDNN_VERBOSE=all to get more\nsecond line")

    monkeypatch.setattr(device_module, "_lstm_step", broken)
    problem = device_module.autocast_problem.__wrapped__(CPU, torch.bfloat16)
    assert problem == "could not create a primitive descriptor for the LSTM forward propagation primitive"


def test_the_probe_agrees_with_training(tmp_path, corpus_file):
    """Where the probe says bf16 runs, a real bf16 step runs; where it says no, a real one fails."""
    from chargen.model import CharLSTM, ModelConfig

    model = CharLSTM(ModelConfig(vocab_size=40, hidden=24))
    x = torch.randint(0, 40, (16, 4))
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(x)
        logits.float().sum().backward()
        ran = True
    except RuntimeError:
        ran = False
    assert ran == (BF16_PROBLEM is None)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN's ISA cap is x86's")
def test_an_avx2_cpu_trains_in_fp32_and_refuses_bf16_in_one_line(tmp_path, corpus_file):
    """What an AVX2-only CPU gets, on any x86 machine: oneDNN capped to AVX2 has no bf16 LSTM."""
    env = os.environ | {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    base = [sys.executable, "-m", "chargen", "train", str(corpus_file), *TINY_FLAGS, "--steps", "3"]
    refused = subprocess.run([*base, "--out", str(tmp_path / "a"), "--precision", "bf16"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--precision bf16 does not run on this CPU" in lines[0], refused.stderr
    assert not (tmp_path / "a").exists()  # refused before anything was written
    auto = subprocess.run([*base, "--out", str(tmp_path / "b")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert auto.returncode == 0, auto.stderr
    assert "device cpu (fp32: bf16 autocast does not run on this CPU" in auto.stderr


def test_the_probes_leave_the_callers_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    device_module.autocast_problem.__wrapped__(CPU, torch.bfloat16)
    device_module._lstm_step(CPU, None, hidden=8, batch=2, steps=3)
    assert torch.equal(torch.rand(3), expected)


def test_a_resumed_auto_run_keeps_its_precision(tmp_path, corpus_file, monkeypatch):
    """auto times bf16 against fp32 once, when the run starts; a resume keeps that choice (a
    close call timed again could flip, and the resume would no longer be exact)."""
    from chargen import load_corpus, train
    from conftest import tiny_model, tiny_train

    corpus, lines = load_corpus(corpus_file), []
    train(corpus, tmp_path / "run", tiny_model(), tiny_train(steps=4, eval_every=2))
    first = config_json(tmp_path / "run")["precision_used"]
    assert first in ("fp32", "bf16")
    flipped = 0.5 if first == "bf16" else 3.0  # what a new timing would now say
    monkeypatch.setattr(device_module, "bf16_speedup", lambda device: flipped)
    train(corpus, tmp_path / "run", None, tiny_train(steps=8, eval_every=2), resume=True, log=lines.append)
    assert config_json(tmp_path / "run")["precision_used"] == first
    assert any("as the run trained so far" in line for line in lines)


def test_mps_is_a_clear_error_where_there_is_none_and_falls_back_to_fp32_without_bf16(monkeypatch, tmp_path, capsys):
    """--device mps: refused in one line on a machine without an Apple GPU; where there is
    one, auto takes bf16 only where its autocast runs, else fp32, and says why."""
    from chargen.cli import main as cli_main

    if not torch.backends.mps.is_available():
        with pytest.raises(ChargenError, match="no MPS .*use --device cpu"):
            device_module.resolve_device("mps")
        text = tmp_path / "t.txt"
        text.write_text("some text to train on\n" * 200)
        assert cli_main(["train", str(text), "--device", "mps", "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--device mps" in err[0] and not (tmp_path / "r").exists()
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    mps = device_module.resolve_device("mps")
    assert mps == torch.device("mps")
    monkeypatch.setattr(device_module, "autocast_problem", lambda device, dtype: "no bf16 kernel for this op")
    assert device_module.resolve_precision("auto", mps) == (
        None, "fp32: bf16 autocast does not run on this GPU (MPS): no bf16 kernel for this op")
    monkeypatch.setattr(device_module, "autocast_problem", lambda device, dtype: None)
    assert device_module.resolve_precision("auto", mps) == (torch.bfloat16, "bf16 autocast")
    with pytest.raises(ChargenError, match="fp16 is for CUDA"):
        device_module.resolve_precision("fp16", mps)
    # Sums and random draws in float64, but float32 on MPS, which has no float64.
    assert device_module.wide_dtype(mps) is torch.float32 and device_module.wide_dtype("cpu") is torch.float64
