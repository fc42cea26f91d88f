"""Warm restarts for a timed run that far outlasts its text (chargen/restarts.py): the
schedule's cycles, how many a plan gets, and a run that restarts, said in its log and kept
in its record so that a resume replays the same rates."""

import json
import math

import pytest

from chargen import ModelConfig, load_corpus, train
from chargen.errors import ChargenError
from chargen.restarts import RESTART_EXPOSURE, cycles_for
from chargen.schedule import MAX_CYCLES, WarmupDecay, cycle_bounds
from chargen.storage import load_tensors, save_tensors
from conftest import make_text, tiny_train


def test_each_cycle_is_twice_as_long_as_the_one_before_and_ends_decayed():
    assert cycle_bounds(310, 5) == [0, 10, 30, 70, 150, 310]
    assert cycle_bounds(1000, 1) == [0, 1000]
    schedule = WarmupDecay(1.0, 4, 310, cycles=5, final_fraction=0.1)
    for start, end in zip([0, 10, 30, 70, 150], [10, 30, 70, 150, 310], strict=True):
        warmup = min(4, (end - start) // 2)
        assert schedule.lr_at(start) == pytest.approx(1.0 / warmup)  # a warmup again from each start
        assert schedule.lr_at(start + warmup) == pytest.approx(1.0)
        assert schedule.lr_at(end - 1) < 0.2  # ... and a decay to near the floor by each end
    assert schedule.lr_at(310) == pytest.approx(0.1) and schedule.lr_at(10**6) == pytest.approx(0.1)
    single = WarmupDecay(1.0, 4, 310)  # one cycle: the cosine as it always was
    assert single.lr_at(157) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 153 / 306)))
    for bad in (0, MAX_CYCLES + 1, 2.5, "3"):
        with pytest.raises(ChargenError, match="cycles"):
            WarmupDecay(1.0, 4, 310, cycles=bad)


def test_a_plan_restarts_only_past_the_exposure_where_dropout_stops_rising():
    assert cycles_for(100.0) == cycles_for(RESTART_EXPOSURE) == 1
    assert cycles_for(RESTART_EXPOSURE + 1) == 2
    assert cycles_for(4_400.0) == 3  # the names at 411 s: a first cycle of about 630
    assert cycles_for(19_500.0) == 5  # ... at 30 minutes
    assert cycles_for(1e12) == MAX_CYCLES


def restarts_run(tmp_path, dropout):
    """A 1x48 on 300 characters for 4 s: an exposure of thousands on any machine."""
    train_file, val_file = tmp_path / "train.txt", tmp_path / "val.txt"
    train_file.write_text(make_text(20, seed=3)[:300])
    val_file.write_text(make_text(10, seed=4)[:300])
    corpus, lines = load_corpus(train_file, val_path=val_file), []
    config = tiny_train(steps=None, max_time=4.0, sample_chars=0, eval_every=20)
    model = ModelConfig(hidden=48, layers=1, embedding=8, dropout=dropout)
    result = train(corpus, tmp_path / "run", model, config, log=lines.append)
    return result, lines


def test_a_run_far_past_its_text_restarts_and_keeps_its_cycles_for_a_resume(tmp_path):
    result, lines = restarts_run(tmp_path, None)
    said = next(line for line in lines if line.startswith("warm restarts: the plan's exposure"))
    cycles = int(said.split(": ")[2].split(" cycles")[0])
    assert cycles >= 2 and f"in {cycles} cycles, each twice as long" in next(s for s in lines if s.startswith("lr: "))
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["lr_schedule"]["cycles"] == cycles
    rates = [e["lr"] for e in result.history if e["event"] == "train"]
    peak = max(rates)
    fell = next(i for i, lr in enumerate(rates) if i > rates.index(peak) and lr < 0.5 * peak)
    assert max(rates[fell:]) > 0.9 * peak  # the rate rose again: a restart
    _, meta = load_tensors(tmp_path / "run" / "trainer" / "state.safetensors")
    assert meta["progress"]["cycles"] == cycles


def test_a_run_whose_dropout_is_given_keeps_one_decay(tmp_path):
    _, lines = restarts_run(tmp_path, 0.3)
    assert not any(line.startswith("warm restarts") for line in lines)
    assert "cycles" not in next(line for line in lines if line.startswith("lr: "))


def test_a_hand_edited_cycle_count_is_refused_on_resume(tmp_path):
    restarts_run(tmp_path, None)
    state = tmp_path / "run" / "trainer" / "state.safetensors"
    tensors, meta = load_tensors(state)
    meta["progress"]["cycles"] = 10**9
    save_tensors(state, tensors, meta)
    corpus = load_corpus(tmp_path / "train.txt", val_path=tmp_path / "val.txt")
    with pytest.raises(ChargenError, match="cycles"):
        train(corpus, tmp_path / "run", None, tiny_train(steps=None, max_time=2.0, sample_chars=0), resume=True)
