"""--patience: a run stops after K whole-text validations without a better loss, keeps the
best weights, says so, and resumes from where it stopped."""

import json
import random
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

import chargen
from chargen import checkpoint, load_corpus, train
from chargen.cli import main
from chargen.storage import load_tensors
from conftest import TINY_FLAGS, make_text, tiny_model, tiny_train


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Training text with structure, and a validation text of the same characters shuffled:
    the more the model learns of the structure, the worse it does on the shuffled text, so
    the validation loss is best early and then rises."""
    base = tmp_path_factory.mktemp("early")
    text = make_text(600)
    shuffled = list(text[:4000])
    random.Random(0).shuffle(shuffled)
    (base / "train.txt").write_text(text)
    (base / "val.txt").write_text("".join(shuffled))
    return base / "train.txt", base / "val.txt"


def val_events(run_dir):
    lines = (run_dir / checkpoint.METRICS).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "val"]


def test_patience_stops_after_k_validations_without_a_better_loss_and_keeps_the_best(texts, tmp_path):
    corpus = load_corpus(texts[0], val_path=texts[1])
    config = tiny_train(steps=400, eval_every=5, sample_chars=0)
    logs: list[str] = []
    result = train(corpus, tmp_path / "run", tiny_model(dropout=0.0), replace(config, patience=3), log=logs.append)
    assert result.stopped == "patience" and result.step < 400
    events = val_events(tmp_path / "run")
    assert [e["best"] for e in events[-3:]] == [False] * 3 and events[-4]["best"]  # stopped at the third
    best = min(events, key=lambda e: e["val_loss"])
    assert result.best_val_loss == best["val_loss"] and result.step == best["step"] + 3 * 5
    assert load_tensors(tmp_path / "run" / checkpoint.BEST)[1]["step"] == best["step"]
    summary = json.loads((tmp_path / "run" / "config.json").read_text())["summary"]
    assert summary["best_step"] == best["step"] and summary["step"] == result.step
    assert any(line.startswith(f"stopped early at step {result.step:,}") and f"at step {best['step']:,}" in line
               and "best.safetensors" in line for line in logs)
    assert any(line.startswith("early stop: after 3 validations") for line in logs)
    # The model that sample and export load is the best one, not the last.
    loaded = chargen.load(tmp_path / "run", device="cpu").model.state_dict()
    run = tmp_path / "run"
    best_weights, last_weights = load_file(run / checkpoint.BEST), load_file(run / checkpoint.WEIGHTS)
    assert all(torch.equal(loaded[name], best_weights[name]) for name in best_weights)
    assert not all(torch.equal(best_weights[name], last_weights[name]) for name in best_weights)

    # Without --patience the same run goes on to the end of its plan.
    whole = train(corpus, tmp_path / "whole", tiny_model(dropout=0.0), replace(config, steps=result.step + 10))
    assert whole.stopped == "done" and whole.step == result.step + 10

    # Resumed with more patience, it carries the count on instead of starting it again.
    logs.clear()
    more = train(corpus, tmp_path / "run", config=replace(config, patience=5), resume=True, log=logs.append)
    assert any("(3 so far)" in line for line in logs)
    assert more.step > result.step
    if more.stopped == "patience":  # 5 in all since the best, the 3 before the resume among them
        flags = [e["best"] for e in val_events(tmp_path / "run")]
        assert flags[-6:] == [True] + [False] * 5


def test_the_cli_takes_patience_and_refuses_a_bad_one(texts, tmp_path, capsys):
    flags = [*TINY_FLAGS, "--val-file", str(texts[1]), "--steps", "400", "--dropout", "0", "--sample-chars", "0"]
    assert main(["train", str(texts[0]), "--out", str(tmp_path / "run"), "--patience", "2", *flags]) == 0
    err = capsys.readouterr().err
    assert "stopped early at step" in err and "no better validation loss in 2 validations" in err
    assert main(["train", str(texts[0]), "--out", str(tmp_path / "bad"), "--patience", "0", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--patience" in err[0]
