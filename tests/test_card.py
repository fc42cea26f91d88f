"""`chargen export` writes a model card: the Hub's front matter (library, licence, tags, the
corpus and its hash, the validation bpc as a metric), a command that trains the model again,
a sample and how to load it; chargen.load ignores it. The shipped models carry theirs."""

import shlex
from pathlib import Path

import pytest
import yaml

import chargen
from chargen.card import CARD, card_text
from chargen.cli import build_parser, main
from conftest import config_json

ROOT = Path(__file__).resolve().parents[1]


def front_and_body(path: Path) -> tuple[dict, str]:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def command_in(body: str) -> str:
    return body.split("## Training")[1].split("```sh\n")[1].split("\n```")[0]


def test_export_writes_a_card_the_hub_reads_and_load_ignores(trained_run, tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["export", str(trained_run), str(out)]) == 0
    assert "with a model card (README.md)" in capsys.readouterr().out
    config = config_json(out)
    front, body = front_and_body(out / CARD)
    assert front["library_name"] == "chargen" and front["license"] == "mit"
    assert set(front["tags"]) >= {"char-level", "lstm", "text-generation"}
    assert front["corpus_sha256"] == config["corpus"]["sha256"]
    (metric,) = front["model-index"][0]["results"][0]["metrics"]
    assert metric["type"] == "bpc" and metric["value"] == pytest.approx(config["summary"]["best_val_bpc"], abs=1e-4)
    args = build_parser().parse_args(shlex.split(command_in(body))[1:])  # (a command chargen takes as it is)
    assert (args.hidden, args.layers, args.embedding) == tuple(config["model"][k] for k in ("hidden", "layers",
                                                                                           "embedding"))
    assert args.batch_size == config["train"]["batch_size"] and args.seed == config["train"]["seed"]
    sample = body.split("## A sample")[1].split("```\n")[1].split("\n```")[0]
    assert len(sample) > 100
    assert "chargen.load" in body and "chargen sample" in body
    assert chargen.load(out, device="cpu").generate("the ", 10, seed=1)  # (the card is not read)


def test_the_shipped_models_carry_their_cards():
    for name in ("shakespeare", "names"):
        folder = ROOT / "models" / name
        front, body = front_and_body(folder / CARD)
        config = config_json(folder)
        assert front["model-index"][0]["results"][0]["metrics"][0]["value"] == \
            pytest.approx(config["summary"]["best_val_bpc"], abs=1e-4)
        card = card_text(chargen.load(folder, device="cpu"), name)
        assert command_in(body) == command_in(card.split("\n---\n", 1)[1])
