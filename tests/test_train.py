import os
from dataclasses import replace

import pytest
import torch

from chargen import ChargenError, load_corpus, train
from chargen.budget import fit_to_time
from chargen.checkpoint import TRAINER
from chargen.storage import load_tensors
from conftest import config_json, interrupt_at, needs_bf16, tiny_model, tiny_train


def weights(run_dir):
    tensors, _ = load_tensors(run_dir / TRAINER)
    return {k: v for k, v in tensors.items() if not k.startswith("rng/")}


@pytest.mark.parametrize("precision, variable_bptt", [("fp32", False), pytest.param("bf16", True, marks=needs_bf16)])
def test_resume_is_exact(tmp_path, corpus_file, precision, variable_bptt):
    """N steps, Ctrl-C, resume, N more == 2N steps straight: bit for bit, including the
    carried LSTM state, optimizer moments, dropout and variable-BPTT random streams."""
    corpus = load_corpus(corpus_file)
    # LEGW at twice the base batch, stopped mid-warmup: the lr sequence must carry on exactly.
    config = tiny_train(steps=24, eval_every=8, variable_bptt=variable_bptt, precision=precision,
                        batch_size=4, base_batch_size=2, warmup_steps=8)
    straight = train(corpus, tmp_path / "straight", tiny_model(), config)
    assert straight.stopped == "done" and straight.step == 24

    first = train(corpus, tmp_path / "split", tiny_model(), config, on_event=interrupt_at(6))
    assert first.stopped == "interrupted" and first.step == 6
    assert "carry/h" in weights(tmp_path / "split")  # mid-epoch: the LSTM state was saved
    second = train(corpus, tmp_path / "split", None, config, resume=True)
    assert second.stopped == "done" and second.step == 24

    a, b = weights(tmp_path / "straight"), weights(tmp_path / "split")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert second.best_val_loss == straight.best_val_loss
    lrs = [[e["lr"] for e in history if e["event"] == "train"]
           for history in (straight.history, first.history + second.history)]
    assert lrs[0] == lrs[1] and len(lrs[0]) == 12
    if not variable_bptt:  # (a variable chunk's step is scaled by its length: the draws would decide)
        assert lrs[0][:3] == sorted(lrs[0][:3]) and max(lrs[0]) == lrs[0][3]  # warmup peaks at step 8


def test_epochs_wrap_and_reset_state(tmp_path, corpus_file):
    corpus = load_corpus(corpus_file)
    result = train(corpus, tmp_path / "run", tiny_model(), tiny_train(steps=None, epochs=2.5, eval_every=1000))
    assert 2.4 < result.epoch <= 2.6
    epochs = [e["epoch"] for e in result.history if e["event"] == "train"]
    assert epochs == sorted(epochs)


def test_training_learns(tmp_path, corpus_file):
    corpus = load_corpus(corpus_file)
    result = train(corpus, tmp_path / "run", tiny_model(hidden=48),
                   tiny_train(steps=150, eval_every=50, base_lr=1e-2, base_batch_size=8, batch_size=8, bptt=32))
    vals = [e["val_bpc"] for e in result.history if e["event"] == "val"]
    assert vals[-1] < vals[0] - 0.5 and vals[-1] < 3.5  # uniform over ~35 characters is 5.1 bpc


def test_run_folder_records(tmp_path, corpus_file):
    run = tmp_path / "run"
    train(load_corpus(corpus_file), run, tiny_model(), tiny_train(steps=12, eval_every=6))
    config = config_json(run)
    assert config["mode"] == "stream" and config["model"]["hidden"] == 24
    assert config["summary"]["step"] == 12 and config["summary"]["best_val_bpc"] > 0
    assert config["corpus"]["chars"] == len(corpus_file.read_text())
    lr = config["lr_schedule"]  # the effective values the scaling rule made of the reference
    assert lr["scheme"] == "legw" and lr["k"] == 1 and lr["peak_lr"] == config["train"]["base_lr"]
    assert lr["warmup_steps"] == 2 and lr["total_steps"] == 12 and lr["decay"] == "cosine"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert sum('"val"' in line for line in lines) == 2
    for name in ("config.json", "tokenizer.json", "model.safetensors", "best.safetensors", TRAINER):
        assert (run / name).is_file()
    assert not [p for p in run.rglob("*.tmp")]
    umask = os.umask(0)
    os.umask(umask)
    assert (run / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # shareable, not 0600


def test_existing_run_is_not_overwritten(tmp_path, corpus_file):
    corpus = load_corpus(corpus_file)
    run = tmp_path / "run"
    train(corpus, run, tiny_model(), tiny_train(steps=6))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ChargenError, match="already holds a run; continue it with --resume"):
        train(corpus, run, tiny_model(), tiny_train(steps=6))
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    train(corpus, run, tiny_model(), tiny_train(steps=6), force=True)


def test_resume_refuses_a_different_text_or_layout(tmp_path, corpus_file):
    corpus = load_corpus(corpus_file)
    run = tmp_path / "run"
    train(corpus, run, tiny_model(), tiny_train(steps=6))
    other = replace(corpus, train_ids=corpus.train_ids[::-1], source={**corpus.source, "sha256": "x"})
    with pytest.raises(ChargenError, match="different text"):
        train(other, run, None, tiny_train(steps=12), resume=True)
    with pytest.raises(ChargenError, match="--batch-size differs"):
        train(corpus, run, None, tiny_train(steps=12, batch_size=5), resume=True)
    with pytest.raises(ChargenError, match="model settings differ"):
        train(corpus, run, tiny_model(hidden=32), tiny_train(steps=12), resume=True)


def test_resume_needs_a_checkpoint(tmp_path, corpus_file):
    with pytest.raises(ChargenError, match="holds no run to resume"):
        train(load_corpus(corpus_file), tmp_path / "none", None, tiny_train(), resume=True)


def test_text_shorter_than_a_batch(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("abcdefghij" * 10)
    with pytest.raises(ChargenError, match=r"needs at least 1,024.*--batch-size"):
        train(load_corpus(path), tmp_path / "run", tiny_model(), tiny_train(batch_size=64, bptt=15))


def test_max_time_fits_the_plan():
    # 1000 steps asked, 0.1 s each, 30 s left, validation 2 s every 100 steps
    assert fit_to_time(1000, 0, 30.0, 0.1, 2.0, 100) == 233
    assert fit_to_time(100, 0, 30.0, 0.1, 2.0, 100) == 100  # never beyond the plan asked for
    assert fit_to_time(1000, 50, 0.0, 0.1, 2.0, 100) == 51  # always at least one more step


def test_max_time_stops_and_decays(tmp_path, corpus_file):
    result = train(load_corpus(corpus_file), tmp_path / "run", tiny_model(),
                   tiny_train(steps=10**6, max_time=3.0, eval_every=200))
    assert result.stopped in ("done", "time")
    assert result.total_steps < 10**6  # the plan was fitted to the time
    assert result.history[-1]["event"] == "val"  # finished with a validation
    lrs = [e["lr"] for e in result.history if e["event"] == "train"]
    assert lrs[-1] < max(lrs)  # decaying towards the fitted end (how far depends on the machine's pace)


def test_stop_event_from_another_thread_saves_and_resumes(tmp_path, corpus_file):
    """The app's Stop button: setting ``stop`` (here from a worker thread, where no signal
    handler can be installed) ends the run after the step with a checkpoint to resume."""
    import threading

    corpus = load_corpus(corpus_file)
    stop = threading.Event()
    events = []

    def hook(event):
        events.append(event)
        if event["event"] == "train" and event["step"] == 8:
            stop.set()

    results = []
    worker = threading.Thread(target=lambda: results.append(
        train(corpus, tmp_path / "run", tiny_model(), tiny_train(steps=20), on_event=hook, stop=stop)))
    worker.start()
    worker.join(timeout=120)
    (result,) = results
    assert result.stopped == "interrupted" and result.step == 8
    assert config_json(tmp_path / "run")["summary"]["step"] == 8
    samples = [e for e in events if e["event"] == "sample"]
    assert samples and all(len(e["texts"]) == 1 and e["texts"][0] for e in samples)
    trains = [e for e in events if e["event"] == "train"]
    assert all(e["total_steps"] == 20 for e in trains)
    resumed = train(corpus, tmp_path / "run", config=tiny_train(steps=20), resume=True)
    assert resumed.stopped == "done" and resumed.step == 20


def test_a_run_stopped_before_its_first_validation_says_so(tmp_path, corpus_file):
    """Not "best val bpc n/a": the closing line, and the app's card of the run, say that it
    has not been validated yet."""
    import threading

    import chargen
    from chargen.shelf import model_card

    stop, lines = threading.Event(), []
    stop.set()  # (the run ends after its first step, before any validation)
    result = train(load_corpus(corpus_file), tmp_path / "run", tiny_model(), tiny_train(), log=lines.append, stop=stop)
    assert result.stopped == "interrupted" and result.best_val_loss is None
    assert any(line.startswith(f"stopped (interrupted) at step {result.step:,}") and "; not validated yet;" in line
               for line in lines), lines[-3:]
    card = model_card(chargen.load(tmp_path / "run"))
    assert "not validated yet" in card and "n/a" not in card
