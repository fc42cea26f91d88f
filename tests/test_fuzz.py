"""Hostile input: fuzzed files train or get a clear error; damaged, mismatched, tampered or
pickled checkpoints are refused, and a pickle's payload never runs."""

import json
import pickle
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chargen
from benchmarks import fuzz
from chargen import ChargenError
from chargen.tokenizer import MAX_VOCAB, CharTokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_hostile_files_train_or_get_a_clear_error(tmp_path):
    """The benchmark's cases (random bytes, broken UTF-8, NULs, one huge line, mixed line
    endings, huge vocabularies, short lists), 150 of them, the same ones on every run."""
    outcomes = fuzz.run_cases(150, tmp_path, seed=0)
    assert sum(outcomes.values()) >= 100
    assert outcomes["trained"] > 0 and any(k.startswith("refused") for k in outcomes)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=300))
def test_tokenizer_round_trips_any_text(text):
    tokenizer = CharTokenizer.from_text(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    again = CharTokenizer.from_json(tokenizer.to_json())
    assert (again.encode(text) == tokenizer.encode(text)).all()


def test_vocabulary_cap(tmp_path):
    assert CharTokenizer.from_text(fuzz._valid_code_points(MAX_VOCAB - 4)).vocab_size == MAX_VOCAB
    with pytest.raises(ChargenError, match="100,000 distinct characters.*at most 20,000"):
        CharTokenizer.from_text(fuzz._valid_code_points(100_000))


@pytest.fixture()
def run_copy(tmp_path, trained_run) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    return run


def test_weights_of_another_shape_are_refused(run_copy):
    config = json.loads((run_copy / "config.json").read_text())
    config["model"]["hidden"] += 8
    (run_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ChargenError, match="does not fit the model in config.json"):
        chargen.load(run_copy)


@pytest.mark.parametrize("tamper", [
    lambda c: c.update(format="something else"),
    lambda c: c.update(format_version=99),
    lambda c: c.update(model="big"),
    lambda c: c["model"].update(hidden=-3),
    lambda c: c["model"].update(vocab_size=5),
    lambda c: c.pop("train"),
])
def test_tampered_config_is_refused(run_copy, tamper):
    config = json.loads((run_copy / "config.json").read_text())
    tamper(config)
    (run_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ChargenError):
        chargen.load(run_copy)


class Payload:
    """Unpickling this would create a file: proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", ["best.safetensors", "model.safetensors", "trainer/state.safetensors"])
def test_a_pickle_where_a_checkpoint_belongs_never_runs(run_copy, tmp_path, corpus_file, name):
    marker = tmp_path / "pwned"
    (run_copy / name).write_bytes(pickle.dumps({"model": Payload(marker)}))
    assert pickle.loads(pickle.dumps(Payload(tmp_path / "check"))) is None and (tmp_path / "check").exists()
    with pytest.raises(ChargenError, match="corrupt or not a checkpoint"):
        if name.startswith("trainer"):
            config = chargen.TrainConfig.from_dict(json.loads((run_copy / "config.json").read_text())["train"])
            chargen.train(chargen.load_corpus(corpus_file), run_copy, config=config, resume=True)
        else:
            chargen.load(run_copy, weights="best" if name.startswith("best") else "latest")
    assert not marker.exists()
