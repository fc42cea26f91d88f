import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chargen
from chargen import checkpoint
from chargen.cli import main
from conftest import TINY_FLAGS, config_json, name_list


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clear_error(code, err, pattern):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and re.search(pattern, lines[0]), lines[0]


def test_train_sample_eval_end_to_end(tmp_path, capsys, corpus_file):
    run_dir = tmp_path / "run"
    code, _, err = run(capsys, "train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--steps", "10")
    assert code == 0 and "finished at step 10" in err
    code, out, _ = run(capsys, "sample", run_dir, "--prime", "The ", "--length", "40", "--seed", "1")
    assert code == 0 and out.startswith("The ") and len(out) == len("The ") + 40 + 1
    code, again, _ = run(capsys, "sample", run_dir, "--prime", "The ", "--length", "40", "--seed", "1")
    assert again == out
    code, out, _ = run(capsys, "sample", run_dir, "--length", "20", "--num-samples", "3", "--seed", "1")
    assert code == 0 and out.count("--- sample") == 3
    code, out, err = run(capsys, "eval", run_dir, corpus_file)
    assert err.startswith("scoring ") and "scored in" in err  # (a long pass says what it does)
    assert code == 0 and "bpc" in out and "nats/char" in out
    # --resume with a larger --steps continues the same run
    code, _, err = run(capsys, "train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--steps", "15", "--resume")
    assert code == 0 and "from step 10" in err and "finished at step 15" in err


def test_resume_auto_starts_a_run_then_continues_it(tmp_path, capsys, corpus_file):
    """One command for a job that may be restarted (torchrun --max-restarts): it starts the run
    where --out holds none, resumes it where it does, and starts again a run that died before
    its first checkpoint; a folder that is not chargen's is still refused."""
    run_dir = tmp_path / "run"
    auto = ["train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--resume", "auto"]
    code, _, err = run(capsys, *auto, "--steps", "10")
    assert code == 0 and "no run to resume yet, starting one" in err and "finished at step 10" in err
    code, _, err = run(capsys, *auto, "--steps", "15")
    assert code == 0 and "resuming the run" in err and "from step 10" in err and "finished at step 15" in err
    code, _, err = run(capsys, *auto, "--steps", "15")  # (restarted after it finished: nothing more to do)
    assert code == 0 and "finished at step 15" in err and config_json(run_dir)["summary"]["step"] == 15
    (run_dir / "trainer" / "state.safetensors").unlink()  # as if it died before its first checkpoint
    code, _, err = run(capsys, *auto, "--steps", "5")
    assert code == 0 and "starting one" in err and "from step 0" in err and "finished at step 5" in err
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "train", corpus_file, "--out", theirs, *TINY_FLAGS, "--resume", "auto")
    assert code == 2 and "--force" not in err and list(theirs.iterdir()) == [theirs / "notes.txt"]
    assert (theirs / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "flags, peak",
    [(["--lr-scaling", "linear", "--base-lr", "0.001"], 0.004), (["--lr", "0.001"], 0.002)],  # default: legw
)
def test_lr_scaling_flags_reach_the_run(tmp_path, capsys, corpus_file, flags, peak):
    run_dir = tmp_path / "run"
    code, _, err = run(capsys, "train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--steps", "4",
                       "--base-batch-size", "1", *flags)  # TINY_FLAGS train at batch 4: k = 4
    assert code == 0 and f"to batch 4 (k=4): peak {peak:g}" in err
    lr = config_json(run_dir)["lr_schedule"]
    assert lr["peak_lr"] == pytest.approx(peak) and lr["base_batch_size"] == 1 and lr["batch_size"] == 4


def test_default_run_folder(tmp_path, capsys, corpus_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, _ = run(capsys, "train", corpus_file, *TINY_FLAGS, "--steps", "2")
    assert code == 0 and (tmp_path / "runs" / corpus_file.stem / "config.json").is_file()


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short.txt").write_text("to be or not to be\n" * 5)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 4000)
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["train", "{d}/missing.txt"], "missing.txt: no such file"),
        (["train", "{d}/folder"], "no text files to train on"),
        (["train", "{d}/empty.txt"], "is empty"),
        (["train", "{d}/short.txt"], r"needs at least [\d,]+; give more text or use e.g. --batch-size"),
        (["train", "{d}/latin1.txt"], r"not valid utf-8: byte 0xe9 at offset 3 \(line 1\).*--encoding"),
        (["train", "{d}/short.txt", "--batch-size", "0"], "--batch-size: must be positive"),
        (["train", "{d}/short.txt", "--bptt", "-3"], "--bptt: must be positive"),
        (["train", "{d}/short.txt", "--hidden", "zero"], "--hidden: 'zero' is not a whole number"),
        (["train", "{d}/short.txt", "--dropout", "1.5"], "--dropout must be in"),
        (["train", "{d}/short.txt", "--epochs", "2", "--steps", "5"], "not allowed with"),
        (["train", "{d}/short.txt", "--lr-scaling", "sqrt"], "--lr-scaling: invalid choice"),
        (["train", "{d}/short.txt", "--mode", "words"], "--mode: invalid choice"),
        (["train", "{d}/short.txt", "--bucket-factor", "0"], "--bucket-factor: must be positive"),
        (["train", "{d}/short.txt", "--base-batch-size", "0"], "--base-batch-size: must be positive"),
        (["train", "{d}/short.txt", "--base-batch-size", "1.5"], "--base-batch-size: '1.5' is not a whole"),
        (["train", "{d}/short.txt", "--base-warmup-epochs", "-1"], "--base-warmup-epochs must be 0 or more"),
        (["train", "{d}/short.txt", "--warmup-steps", "-1"], "--warmup-steps must be 0 or more"),
        (["train", "{d}/short.txt", "--warmup-steps", "5", "--base-warmup-epochs", "1"], "not allowed with"),
        (["sample", "{d}/nothing"], "no such run or model folder"),
        (["sample", "{d}/folder"], "config.json is missing"),
        (["train", "{d}/short.txt", "--out", "{d}/new", "--resume"], "holds no run to resume; drop --resume"),
        (["train", "--resume", "{d}/short.txt"], "--resume takes no value or auto, not .*: put the text file before"),
        (["train", "{d}/short.txt", "--keep", "-1"], "--keep: must be 0 or more, not -1"),
        (["train", "{d}/short.txt", "--save-every", "0"], "--save-every: must be positive"),
        (["train", "{d}/short.txt", "--resume-from", "ten"], "--resume-from: 'ten' is not a whole number"),
        (["train", "{d}/short.txt", "--resume", "auto", "--resume-from", "10"], "not with --resume auto"),
        (["train", "{d}/short.txt", "--out", "{d}/new", "--resume-from", "10"], "holds no run to resume"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(capsys, files, args, pattern):
    code, _, err = run(capsys, *[a.format(d=files) for a in args])
    assert_clear_error(code, err, pattern)


def test_encoding_flag_reads_other_encodings(tmp_path, capsys, files):
    code, _, err = run(capsys, "train", files / "latin1.txt", "--encoding", "latin-1", "--out", tmp_path / "r",
                       *TINY_FLAGS, "--steps", "2")
    assert code == 0, err


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--temperature", "-1"], "temperature must be 0 or more"),
        (["--top-p", "0"], r"top-p must be in \(0, 1\]"),
        (["--top-p", "1.2"], r"top-p must be in \(0, 1\]"),
        (["--top-k", "-2"], "top-k"),
        (["--prime", "QX#"], "never saw"),
    ],
)
def test_bad_sampling_options(capsys, trained_run, args, pattern):
    code, out, err = run(capsys, "sample", trained_run, *args)
    assert_clear_error(code, err, pattern)
    assert out == ""  # refused before anything (the prime included) is printed


def test_existing_run_is_refused_and_untouched(tmp_path, capsys, corpus_file):
    run_dir = tmp_path / "run"
    assert run(capsys, "train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--steps", "2")[0] == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    code, _, err = run(capsys, "train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--steps", "2")
    assert_clear_error(code, err, "already holds a run; continue it with --resume, or choose another --out")
    assert "--force" not in err  # (it would lose the run)
    assert before == {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    code, _, err = run(capsys, "train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--steps", "2", "--hidden", "32",
                       "--resume")
    assert_clear_error(code, err, "model settings differ")
    assert run(capsys, "train", corpus_file, "--out", run_dir, *TINY_FLAGS, "--steps", "2", "--force")[0] == 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "config"])
def test_corrupt_checkpoint_is_refused(tmp_path, capsys, trained_run, damage):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    best = run_dir / "best.safetensors"
    data = bytearray(best.read_bytes())
    if damage == "truncate":
        best.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data[-100] ^= 0x01
        best.write_bytes(bytes(data))
    elif damage == "garbage":
        best.write_bytes(b"\x80\x04not a checkpoint")
    else:
        (run_dir / "config.json").write_text("{not json")
    code, _, err = run(capsys, "sample", run_dir, "--length", "5")
    assert_clear_error(code, err, "corrupt")


def test_ctrl_c_saves_and_resume_finishes(tmp_path, corpus_file):
    """A real Ctrl-C (SIGINT) in a real process: checkpoint saved, exit 130, no traceback;
    the same command with --resume then finishes the plan."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "chargen", "train", str(corpus_file), "--out", str(run_dir), *TINY_FLAGS,
           "--steps", "100000", "--eval-every", "100000"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while not (run_dir / "config.json").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # let it take some steps
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "stopped (interrupted)" in err
    assert (run_dir / "trainer" / "state.safetensors").is_file()
    step = json.loads((run_dir / "config.json").read_text())["summary"]["step"]
    assert step > 0
    done = subprocess.run([*cmd[:-4], "--steps", str(step + 5), "--resume"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"from step {step:,}" in done.stderr and f"finished at step {step + 5:,}" in done.stderr
    assert Path(run_dir / "best.safetensors").is_file()


@pytest.mark.parametrize("command", [[], ["train"], ["sample"], ["eval"]])
def test_help(capsys, command):
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0 and "usage: chargen" in out


def test_lines_mode_from_the_command_line(tmp_path, capsys):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(name_list(300)) + "\n")
    run_dir = tmp_path / "run"
    code, _, err = run(capsys, "train", names, "--out", run_dir, *TINY_FLAGS, "--steps", "6")
    assert code == 0 and "mode: lines: 300 lines" in err and "(--mode stream to override)" in err
    code, out, _ = run(capsys, "sample", run_dir, "--num-samples", "7", "--seed", "1", "--length", "30")
    assert code == 0 and out.count("\n") == 7
    code, out, err = run(capsys, "sample", run_dir, "--num-samples", "7", "--seed", "1", "--new-only")
    new = re.fullmatch(r"(\d+) of 7 samples are new \(not in the training list\)\n", err)
    assert code == 0 and new and out.count("\n") == int(new.group(1))
    code, out, _ = run(capsys, "eval", run_dir, names)
    assert code == 0 and re.search(r"over 300 items \([\d,]+ chars and ends\)", out)
    # --resume keeps the run's mode without being told
    code, _, err = run(capsys, "train", names, "--out", run_dir, *TINY_FLAGS, "--steps", "8", "--resume")
    assert code == 0 and "mode: " not in err and "finished at step 8" in err


def test_new_only_needs_lines_mode(capsys, trained_run):
    code, _, err = run(capsys, "sample", trained_run, "--new-only")
    assert_clear_error(code, err, "--new-only is for runs trained in lines mode")


def test_export_writes_a_servable_model_folder(tmp_path, capsys, trained_run):
    out = tmp_path / "models" / "tiny"
    assert main(["export", str(trained_run), str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "tokenizer.json"]
    original, exported = chargen.load(trained_run), chargen.load(out)
    assert exported.generate("the ", 50, seed=3) == original.generate("the ", 50, seed=3)
    assert exported.record.summary == original.record.summary
    # An occupied folder is refused unless --force; the run folder itself always is.
    assert main(["export", str(trained_run), str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds an exported model; choose another folder" in err and "--force" not in err
    assert main(["export", str(trained_run), str(out), "--force", "--weights", "latest"]) == 0
    for inside in (trained_run, trained_run / "trainer", trained_run / "sub"):
        assert main(["export", str(trained_run), str(inside), "--force"]) == 2
        assert "a folder of its own" in capsys.readouterr().err
    other_run = tmp_path / "other"
    shutil.copytree(trained_run, other_run)
    assert main(["export", str(trained_run), str(other_run), "--force"]) == 2  # --force replaces no training run
    assert "already holds a training run" in capsys.readouterr().err and (other_run / checkpoint.TRAINER).is_file()
