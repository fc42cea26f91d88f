"""Fine-tuning (--init-from): a new run starts from an earlier run's or model folder's weights,
keeps its vocabulary's ids, gives the new text's new characters rows of their own, records
where it came from, refuses a different mode or shape, and resumes like any run."""

import hashlib
import json
from dataclasses import replace

import pytest
import torch

import chargen
from chargen import checkpoint, finetune, load_corpus, train
from chargen.cli import main
from chargen.export import export_model
from chargen.model import CharLSTM
from chargen.storage import load_tensors
from conftest import config_json, interrupt_at, make_text, name_list, tiny_model, tiny_train

NEW_CHARS = "Zé@"


@pytest.fixture(scope="module")
def source(tmp_path_factory, trained_run):
    """The tiny trained run, exported as a model folder (a run folder works the same)."""
    return export_model(trained_run, tmp_path_factory.mktemp("source") / "model")


@pytest.fixture(scope="module")
def new_text(tmp_path_factory):
    """Another text of the same kind, with characters the source never saw."""
    lines = make_text(300, seed=5).splitlines()
    lines[::7] = [line.replace("the", "Zhe").replace("e", "é") + " @" for line in lines[::7]]
    path = tmp_path_factory.mktemp("new") / "new.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_source_vocabulary_keeps_its_ids_and_the_new_characters_get_mean_rows(source, new_text):
    src = finetune.read_source(source)
    corpus = load_corpus(new_text)
    tokenizer, new = finetune.merged_tokenizer(src.tokenizer, corpus.tokenizer)
    assert new == sorted(NEW_CHARS) and tokenizer.chars == [*src.tokenizer.chars, *sorted(NEW_CHARS)]
    assert (tokenizer.encode("the king") == src.tokenizer.encode("the king")).all()  # old prompts encode the same
    model = CharLSTM(finetune.model_for(src, None, corpus.mode, tokenizer.vocab_size))
    finetune.load_source_weights(model, src)
    weights, _ = load_tensors(src.weights)
    old = src.model.vocab_size
    for name, value in weights.items():
        if name in finetune.VOCAB_ROWS:
            got = model.state_dict()[name]
            assert torch.equal(got[:old], value)
            expected = value[4:].min() if name == "head.bias" else value[4:].mean(dim=0)
            assert all(torch.equal(row, expected) for row in got[old:])
        else:
            assert torch.equal(model.state_dict()[name], value), name


def test_a_fine_tuned_run_records_its_source_and_learns_faster_than_from_scratch(source, new_text, tmp_path):
    config = tiny_train(steps=8, eval_every=8, sample_chars=0)
    tuned = train(load_corpus(new_text), tmp_path / "tuned", None, replace(config, init_from=str(source)))
    scratch = train(load_corpus(new_text), tmp_path / "scratch", tiny_model(), config)
    assert tuned.best_val_loss < scratch.best_val_loss - 0.3
    saved = config_json(tmp_path / "tuned")
    digest = hashlib.sha256(checkpoint.weights_path(source).read_bytes()).hexdigest()
    assert saved["init_from"] == {"path": str(source), "weights": "model.safetensors", "weights_sha256": digest,
                                  "new_chars": "".join(sorted(NEW_CHARS))}
    assert saved["train"]["base_lr"] == 3e-3 and config_json(tmp_path / "scratch")["train"]["base_lr"] == 6e-3
    assert saved["model"]["hidden"] == 24 and saved["model"]["vocab_size"] == 4 + len(
        finetune.read_source(source).tokenizer.chars) + len(NEW_CHARS)
    model = chargen.load(tmp_path / "tuned", device="cpu")
    assert model.tokenizer.chars[-3:] == sorted(NEW_CHARS)
    assert len(model.generate("Zhe @", length=20, seed=1)) == len("Zhe @") + 20  # the new characters prime and sample


def test_a_different_mode_or_shape_is_refused_in_one_line(source, new_text, tmp_path, capsys):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(name_list(200)) + "\n")
    with pytest.raises(chargen.ChargenError, match="stream mode.*lines mode.*--mode stream"):
        train(load_corpus(names, mode="lines"), tmp_path / "a", None, tiny_train(init_from=str(source)))
    with pytest.raises(chargen.ChargenError, match="--hidden 32 differs.*24"):
        train(load_corpus(new_text), tmp_path / "b", tiny_model(hidden=32), tiny_train(init_from=str(source)))
    code = main(["train", str(new_text), "--out", str(tmp_path / "c"), "--init-from", str(tmp_path / "nowhere"),
                 "--steps", "2", "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "nowhere" in err[0] and not (tmp_path / "c").exists()


def test_a_fine_tuned_run_resumes_exactly(source, new_text, tmp_path):
    """Stopped midway and resumed (the text recoded to the run's merged vocabulary again),
    it ends on the uninterrupted run's weights, bit for bit."""
    config = tiny_train(steps=10, eval_every=5, sample_chars=0, precision="fp32", init_from=str(source))
    train(load_corpus(new_text), tmp_path / "whole", None, config)
    stopped = train(load_corpus(new_text), tmp_path / "half", None, config, on_event=interrupt_at(4))
    assert stopped.stopped == "interrupted" and stopped.step < 10
    train(load_corpus(new_text), tmp_path / "half", None, replace(config, init_from=None), resume=True)
    whole, _ = load_tensors(tmp_path / "whole" / checkpoint.WEIGHTS)
    half, _ = load_tensors(tmp_path / "half" / checkpoint.WEIGHTS)
    assert all(torch.equal(whole[k], half[k]) for k in whole)
    assert config_json(tmp_path / "half")["init_from"]["path"] == str(source)


def test_the_cli_fine_tunes_in_the_sources_mode(source, tmp_path, capsys):
    """A list of names would be read in lines mode; fine-tuning a stream model reads it as
    a stream, as the source was trained. --init-from with --resume is refused."""
    names = tmp_path / "names.txt"
    names.write_text("\n".join(name_list(300)) + "\n")
    flags = ["--batch-size", "4", "--bptt", "16", "--eval-every", "4", "--device", "cpu", "--quiet"]
    run = ["train", str(names), "--out", str(tmp_path / "run")]
    assert main([*run, "--init-from", str(source), "--steps", "4", *flags]) == 0
    assert json.loads((tmp_path / "run" / checkpoint.CONFIG).read_text())["mode"] == "stream"
    capsys.readouterr()
    assert main([*run, "--resume", "--init-from", str(source), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--init-from starts a new run" in err[0]
