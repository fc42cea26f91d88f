"""Precision by what the kernels do: bf16 (and fp16) are tried before they are used; ``auto``
takes bf16 on x86 where its kernels are native (not by a timing: the same command makes the
same run), falls back to fp32 and says why; an explicit precision that cannot run is
refused in one line, and no message suggests what this machine cannot do."""

import os
import platform
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

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


@pytest.mark.parametrize("flags, cap, expected, why", [
    ((True, False), None, torch.bfloat16, "native bf16 kernels (AVX512-BF16)"),
    ((True, True), None, torch.bfloat16, "native bf16 kernels (AVX512-BF16 and AMX)"),
    ((False, False), None, None, "no native bf16 kernels (no AVX512-BF16 or AMX)"),
    ((True, True), "AVX512_CORE", None, "no native bf16 kernels (oneDNN is capped at AVX512_CORE"),
    ((True, True), "avx512_core_amx", torch.bfloat16, "native bf16 kernels"),
])
def test_auto_on_an_x86_cpu_follows_its_kernels_not_a_timing(monkeypatch, flags, cap, expected, why):
    """The same command, the same run: whatever a timing of the two would say now (here a
    flip between calls, as seen on one machine: 1.3x, then 1.09x), auto on x86 takes bf16
    exactly where its kernels are native (the CPU's flags, and oneDNN's ISA cap)."""
    timings = iter([1.3, 1.09, 0.25, 6.0])
    monkeypatch.setattr(device_module, "autocast_problem", lambda device, dtype: None)
    monkeypatch.setattr(device_module, "bf16_speedup", lambda device: next(timings))
    monkeypatch.setattr(device_module.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: flags[0])
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: flags[1])
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    else:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    decisions = [resolve_precision("auto", CPU) for _ in range(3)]
    assert all(dtype is expected and why in note for dtype, note in decisions), decisions


@pytest.mark.parametrize("speedup, expected", [(0.25, None), (1.2, None), (1.8, torch.bfloat16)])
def test_auto_off_x86_takes_bf16_only_well_clear_of_fp32(monkeypatch, speedup, expected):
    """Off x86 (ARM) the kernels' kind is not known: a timing decides, with a line (1.5x)
    that the noise of one (1.09x to 1.8x on one machine) does not reach from fp32's side."""
    monkeypatch.setattr(device_module, "autocast_problem", lambda device, dtype: None)
    monkeypatch.setattr(device_module, "bf16_speedup", lambda device: speedup)
    monkeypatch.setattr(device_module.platform, "machine", lambda: "aarch64")
    dtype, note = resolve_precision("auto", CPU)
    assert dtype is expected and f"timed at {speedup:.1f}" in note


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


def test_one_command_twice_makes_one_run(tmp_path, corpus_file):
    """The same command with the same seed on the same machine: the same weights, bit for
    bit (the precision is not timed on x86, where this would flip with a close timing)."""
    from chargen.cli import main

    flags = [*TINY_FLAGS, "--steps", "12", "--seed", "1"]  # (--precision auto: the default)
    for run in ("a", "b"):
        assert main(["train", str(corpus_file), "--out", str(tmp_path / run), *flags]) == 0
    a, b = (load_file(tmp_path / run / "model.safetensors") for run in ("a", "b"))
    assert config_json(tmp_path / "a")["precision_used"] == config_json(tmp_path / "b")["precision_used"]
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_what_max_time_chose_is_said_as_flags_that_choose_it_again(tmp_path, corpus_file, capsys):
    from chargen.cli import main

    assert main(["train", str(corpus_file), "--out", str(tmp_path / "timed"), "--max-time", "3", "--device", "cpu",
                 "--quiet"]) == 0
    # (the last said: a refit of the regularisation to the plan says it again)
    said = re.findall(r"the same model and precision without timing: (.*)", capsys.readouterr().err)[-1]
    assert main(["train", str(corpus_file), "--out", str(tmp_path / "again"), *said.split(), "--steps", "2",
                 "--device", "cpu", "--quiet"]) == 0
    timed, again = config_json(tmp_path / "timed"), config_json(tmp_path / "again")
    assert timed["model"] == again["model"] and timed["precision_used"] == again["precision_used"]
    assert timed["train"]["weight_decay"] == again["train"]["weight_decay"]
    assert timed["train"]["base_lr"] == again["train"]["base_lr"]
