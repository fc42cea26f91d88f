"""--tensorboard mirrors metrics.jsonl (train and validation scalars) and the samples to
TensorBoard under RUN_DIR/tb; without the package it is refused in one line before anything
is written; ``python -m benchmarks.run_summary`` draws the curves from metrics.jsonl."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from chargen import ChargenError, checkpoint, load_corpus, train
from chargen.cli import main
from conftest import TINY_FLAGS, tiny_model, tiny_train

ROOT = Path(__file__).resolve().parents[1]


def board_of(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return events


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / checkpoint.METRICS).read_text().splitlines()]


def test_the_scalars_and_samples_are_those_of_metrics_jsonl(corpus_file, tmp_path):
    run = tmp_path / "run"
    train(load_corpus(corpus_file), run, tiny_model(), tiny_train(steps=12, tensorboard=True))
    board, written = board_of(run), metrics(run)
    for kind, key, tag in [("train", "loss", "train/loss"), ("train", "lr", "train/lr"),
                           ("train", "chars_per_s", "train/chars_per_s"), ("val", "val_bpc", "val/bpc"),
                           ("val", "val_loss", "val/loss")]:
        expected = [(e["step"], e[key]) for e in written if e["event"] == kind]
        got = [(s.step, s.value) for s in board.Scalars(tag)]
        assert [step for step, _ in got] == [step for step, _ in expected] and expected, tag
        assert [value for _, value in got] == pytest.approx([value for _, value in expected], rel=1e-6), tag
    samples = board.Tensors("samples/text_summary")
    assert [s.step for s in samples] == [e["step"] for e in written if e["event"] == "val"]


def test_without_the_package_it_is_refused_before_anything_is_written(corpus_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # (import fails as if not installed)
    with pytest.raises(ChargenError, match=r"--tensorboard needs the tensorboard package: pip install"):
        train(load_corpus(corpus_file), tmp_path / "run", tiny_model(), tiny_train(tensorboard=True))
    assert not (tmp_path / "run").exists()


def test_the_cli_flag_and_the_summary_plot(corpus_file, tmp_path):
    run = tmp_path / "run"
    assert main(["train", str(corpus_file), "--out", str(run), *TINY_FLAGS, "--steps", "10", "--tensorboard"]) == 0
    assert board_of(run).Scalars("val/bpc")
    assert main(["train", str(corpus_file), "--out", str(tmp_path / "plain"), *TINY_FLAGS, "--steps", "4"]) == 0
    assert not (tmp_path / "plain" / "tb").exists()
    png = tmp_path / "curve.png"
    done = subprocess.run([sys.executable, "-m", "benchmarks.run_summary", str(run), "--plot", str(png)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "best validation loss" in done.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
