"""Samples on a stdout that cannot encode them, and --output FILE (UTF-8, written whole or
not at all)."""

import os
import subprocess
import sys

import pytest

from chargen import load_corpus, train
from chargen.cli import main
from conftest import ROOT, make_text, tiny_model, tiny_train

ACCENTED = "Café naïve — déjà vu, über façade. "


@pytest.fixture(scope="module")
def accented_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("accented")
    text = base / "text.txt"
    text.write_text((ACCENTED + "\n") * 40 + make_text(100), encoding="utf-8")
    train(load_corpus(text), base / "run", tiny_model(), tiny_train(steps=4, sample_chars=0))
    return base / "run"


def sample_in_subprocess(run, encoding: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "chargen", "sample", str(run), "--prime", "Café", "--length", "200",
                           "--seed", "3", "--device", "cpu", *flags], capture_output=True, env=env, timeout=120)


def test_a_narrow_stdout_gets_question_marks_and_one_line_not_an_error(accented_run):
    wide = sample_in_subprocess(accented_run, "utf-8")
    narrow = sample_in_subprocess(accented_run, "ascii")
    assert wide.returncode == narrow.returncode == 0, narrow.stderr.decode()
    text = wide.stdout.decode("utf-8")
    assert text.startswith("Café") and wide.stderr == b""
    assert narrow.stdout.decode("ascii") == text.encode("ascii", errors="replace").decode("ascii")
    lines = narrow.stderr.decode().splitlines()
    assert len(lines) == 1 and "stdout is ascii" in lines[0] and "--output" in lines[0]


def test_output_writes_utf8_whole_or_leaves_the_old_file(accented_run, tmp_path, capsys):
    wide = sample_in_subprocess(accented_run, "utf-8").stdout.decode("utf-8")
    out = tmp_path / "samples.txt"
    flags = ["sample", str(accented_run), "--prime", "Café", "--length", "200", "--seed", "3", "--device", "cpu"]
    assert main([*flags, "--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == wide and capsys.readouterr().out == ""
    # A sample that fails (a prime the model cannot read) leaves the earlier file as it was.
    assert main([*flags[:3], "Ж", *flags[4:], "--output", str(out)]) == 2
    assert out.read_text(encoding="utf-8") == wide
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.txt"]  # no partial file left
    # Never a file of the run itself, nor a folder.
    assert main([*flags, "--output", str(accented_run / "config.json")]) == 2
    assert main([*flags, "--output", str(tmp_path)]) == 2
    assert len([line for line in capsys.readouterr().err.splitlines() if line]) == 3


def test_a_closed_pipe_ends_the_sample_quietly(trained_run):
    """``chargen sample RUN | head``: the reader leaves early; exit 0, nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "chargen", "sample", str(trained_run), "--length", "1000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and err == b"", err
