"""--max-time: validation held to a share of the budget (a fixed sample during the run, the
whole text at the end), and a timed run planned over the whole budget."""

import json
import sys
import threading
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chargen import load_corpus, train
from chargen.budget import MIN_SAMPLE, TimeBudget, ValidationCost, ValidationPlan, plan_validation
from chargen.config import DEFAULT_EPOCHS, TrainConfig
from chargen.feeds import StreamFeed
from chargen.model import CharLSTM
from chargen.prepare import TIMED_PLAN, requested_steps
from conftest import make_text, tiny_model, tiny_train


def planned_seconds(plan: ValidationPlan, steps_left: int, whole: int, cost: ValidationCost) -> float:
    during = steps_left // plan.every if plan.every <= steps_left else 0
    return during * cost.seconds(whole if plan.sample is None else plan.sample) + cost.seconds(whole)


def test_the_whole_text_every_time_when_it_fits():
    cost = ValidationCost(per_target=1e-5, fixed=0.1)  # whole text: 1.1 s
    assert plan_validation(100.0, 1000, 100, 100_000, cost) == ValidationPlan(100)


def test_a_sample_when_the_whole_text_does_not_fit():
    cost = ValidationCost(per_target=1e-5, fixed=0.1)  # whole: 1.1 s; 10 validations + the final
    plan = plan_validation(6.0, 1000, 100, 100_000, cost)
    assert plan.every == 100 and MIN_SAMPLE <= plan.sample < 100_000
    assert planned_seconds(plan, 1000, 100_000, cost) <= 6.0


def test_fewer_validations_when_even_the_smallest_sample_does_not_fit():
    cost = ValidationCost(per_target=1e-4, fixed=0.0)  # the smallest sample: 0.82 s; whole: 10 s
    plan = plan_validation(12.0, 1000, 10, 100_000, cost)
    assert plan.sample == MIN_SAMPLE and plan.every > 10
    assert planned_seconds(plan, 1000, 100_000, cost) <= 12.0
    assert plan_validation(10.5, 1000, 10, 100_000, cost).every > 1000  # none fits: at the end only


def test_patience_spaces_out_whole_validations_instead_of_sampling():
    """--patience compares each validation with the best, so every one is on the whole text."""
    cost = ValidationCost(per_target=1e-5, fixed=0.1)  # whole: 1.1 s; 10 validations + the final
    assert plan_validation(6.0, 1000, 100, 100_000, cost).sample is not None
    plan = plan_validation(6.0, 1000, 100, 100_000, cost, whole_only=True)
    assert plan.sample is None and plan.every > 100
    assert planned_seconds(plan, 1000, 100_000, cost) <= 6.0
    assert plan_validation(100.0, 1000, 100, 100_000, cost, whole_only=True) == ValidationPlan(100)  # all fit


def test_a_run_keeps_its_sample():
    cost = ValidationCost(per_target=1e-5, fixed=0.0)
    plan = plan_validation(3.0, 500, 50, 200_000, cost, sample=12_345)
    assert plan.sample == 12_345


@settings(max_examples=300, deadline=None)
@given(allowance=st.floats(0.0, 1000.0), steps_left=st.integers(0, 100_000), eval_every=st.integers(1, 5000),
       whole=st.integers(2, 10_000_000), per_target=st.floats(1e-9, 1e-3), fixed=st.floats(0.0, 5.0),
       whole_only=st.booleans())
def test_the_plan_keeps_within_the_allowance_whenever_the_final_validation_does(allowance, steps_left, eval_every,
                                                                                whole, per_target, fixed, whole_only):
    cost = ValidationCost(per_target, fixed)
    plan = plan_validation(allowance, steps_left, eval_every, whole, cost, whole_only=whole_only)
    assert plan.every >= eval_every and (plan.sample is None or 1 <= plan.sample <= whole)
    assert plan.sample is None or not whole_only
    if cost.seconds(whole) <= allowance:  # the final whole validation is never given up
        assert planned_seconds(plan, steps_left, whole, cost) <= allowance * (1 + 1e-9) + 1e-12


def test_a_sample_is_the_same_characters_every_time(corpus_file):
    corpus = load_corpus(corpus_file, val_fraction=0.4)
    feed = StreamFeed(corpus.train_ids, corpus.val_ids, 4, 16, False, "cpu")
    model = CharLSTM(replace(tiny_model(), vocab_size=corpus.tokenizer.vocab_size))
    (a, scored), (b, _) = feed.evaluate(model, 3000), feed.evaluate(model, 3000)
    whole, all_scored = feed.evaluate(model)
    assert a == b and 3000 <= scored < all_scored and a != whole
    assert all_scored == feed.n_val_streams * (feed.val_streams.length - 1)


def test_a_timed_run_validates_on_a_sample_and_reports_the_whole_text(tmp_path, monkeypatch):
    """When the plan says sample (here forced, so the test does not hang on this machine's
    speed; the planning itself is tested above): samples during the run, the whole text at
    the end, and only that competes for best."""
    import chargen.budget

    monkeypatch.setattr(sys.modules["chargen.timed_plan"], "plan_validation",
                        lambda *args, **kwargs: ValidationPlan(100, 3000))
    text, val = tmp_path / "train.txt", tmp_path / "val.txt"
    text.write_text(make_text(600, seed=1))
    val.write_text(make_text(600, seed=2))
    corpus = load_corpus(text, val_path=val)
    result = train(corpus, tmp_path / "run", tiny_model(), tiny_train(steps=None, max_time=3.0, eval_every=5,
                                                                      sample_chars=0))
    vals = [e for e in result.history if e["event"] == "val"]
    assert vals[-1]["whole"] and vals[-1]["chars"] >= len(corpus.val_ids) - 64
    during = [e for e in vals[:-1] if e["step"] > chargen.budget.TimeBudget.FIRST_FIT]  # after the first fit
    assert during and not any(e["whole"] or e["best"] for e in during)
    assert {e["chars"] for e in during} == {during[0]["chars"]} and 3000 <= during[0]["chars"] < vals[-1]["chars"]
    assert result.best_val_loss == pytest.approx(vals[-1]["val_loss"])
    summary = json.loads((tmp_path / "run" / "config.json").read_text())["summary"]
    assert 0 < summary["validation_seconds"] < 3.0


def test_a_timed_run_without_epochs_is_planned_over_the_whole_budget(tmp_path):
    """No default epoch count ends a --max-time run early: on a tiny text it trains far
    past DEFAULT_EPOCHS."""
    assert requested_steps(TrainConfig(max_time=60), 100) == TIMED_PLAN
    assert requested_steps(TrainConfig(max_time=60, epochs=2), 100) == 200
    assert requested_steps(TrainConfig(), 100) == DEFAULT_EPOCHS * 100
    text = tmp_path / "tiny.txt"
    text.write_text(make_text(12, seed=5))
    corpus = load_corpus(text)
    result = train(corpus, tmp_path / "run", tiny_model(hidden=16, layers=1),
                   tiny_train(steps=None, max_time=4.0, batch_size=2, bptt=8, eval_every=50, sample_chars=0))
    assert result.epoch > DEFAULT_EPOCHS and result.total_steps < TIMED_PLAN
    assert np.isfinite(result.best_val_loss)


def test_a_run_out_of_time_before_its_plan_is_fitted_names_no_total(tmp_path):
    """Stopped by the clock before the first fit, the closing line shows no placeholder plan
    (it once read "at step 1 of 1,000,000,000,000"), and with no time left for a final
    validation, it says so instead of running one past the budget."""
    text = tmp_path / "tiny.txt"
    text.write_text(make_text(12, seed=5))
    lines = []
    result = train(load_corpus(text), tmp_path / "run", tiny_model(hidden=16, layers=1),
                   tiny_train(steps=None, max_time=0.001, batch_size=2, bptt=8, sample_chars=0), log=lines.append)
    assert result.stopped == "time" and result.step < TimeBudget.FIRST_FIT
    assert any(line.startswith("no final validation: ") for line in lines)
    closing = next(line for line in lines if line.startswith("stopped (time)"))
    assert closing.startswith(f"stopped (time) at step {result.step:,}; not validated yet")
    assert f"{TIMED_PLAN:,}" not in closing


def test_no_placeholder_plan_reaches_a_log_an_event_a_file_or_the_app(tmp_path):
    """A timed run stopped (here by its stop event) before its plan is fitted to the time:
    its train events, config.json and the app's progress line show no step total."""
    from chargen import faults
    from chargen.job import progress_line

    text = tmp_path / "tiny.txt"
    text.write_text(make_text(200, seed=5))
    stop, events, lines = threading.Event(), [], []
    stop_at = faults.Faults(loss=lambda step, loss: (stop.set() if step == 12 else None) or loss)
    with faults.injected(stop_at):
        result = train(load_corpus(text), tmp_path / "run", tiny_model(),
                       tiny_train(steps=None, max_time=600, log_every=5, eval_every=100), stop=stop,
                       on_event=events.append, log=lines.append)
    assert result.stopped == "interrupted" and result.step == 12 < TimeBudget.FIRST_FIT
    trains = [e for e in events if e["event"] == "train"]
    assert trains and all(e["total_steps"] is None for e in trains)
    assert "fitting the plan to the time" in progress_line("run", trains[-1], 1.0)
    written = [(tmp_path / "run" / name).read_text() for name in ("config.json", "metrics.jsonl")]
    shown = "\n".join(lines + written + [progress_line("run", e, 1.0) for e in trains])
    assert str(TIMED_PLAN) not in shown.replace(",", "") and str(2**62) not in shown.replace(",", "")
    record = json.loads(written[0])
    assert record["summary"]["total_steps"] is None and record["lr_schedule"]["total_steps"] is None


def test_the_plan_keeps_a_margin_and_the_probe_counts_in_the_budget():
    """Validation is planned within 90% of its 5% (a validation's cost is known only once
    one has run), and what set-up spent (the speed probe) is already off the clock."""
    from chargen.budget import PLANNED_SHARE, VAL_SHARE, TimeBudget
    from chargen.trainer_state import Progress

    budget = TimeBudget(100.0, Progress())
    assert PLANNED_SHARE < 1 and budget.validation_allowance() == pytest.approx(VAL_SHARE * PLANNED_SHARE * 100.0)
    assert TimeBudget(100.0, Progress(), spent=7.0).seconds_left() == pytest.approx(93.0, abs=0.5)


def test_a_plan_of_no_more_validations_holds_whenever_the_last_one_was(tmp_path, monkeypatch):
    """Once the plan says "at the end only" (no allowance left), no validation comes before
    the end, however the plan grows at later refits."""
    calls, during, real_plan = [], [], plan_validation

    def plan(allowance, steps_left, eval_every, whole, cost, sample=None, whole_only=False, final_seconds=None):
        calls.append(steps_left)
        if len(calls) <= 2:
            return ValidationPlan(4, 3000)
        return real_plan(0.0, steps_left, eval_every, whole, cost, 3000)  # nothing left to spend

    monkeypatch.setattr(sys.modules["chargen.timed_plan"], "plan_validation", plan)
    text = tmp_path / "train.txt"
    text.write_text(make_text(600, seed=1))
    result = train(load_corpus(text), tmp_path / "run", tiny_model(),
                   tiny_train(steps=None, max_time=3.0, eval_every=4, sample_chars=0),
                   on_event=lambda e: during.append((len(calls) > 2, e)) if e["event"] == "val" else None)
    after = [e for switched, e in during if switched]
    assert len(calls) > 4 and not during[0][0]  # refitted several times; validated before the switch
    assert [e["step"] for e in after] == [result.step] and after[0]["whole"]
