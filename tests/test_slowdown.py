"""--max-time when the machine changes speed under the run (other work on the same cores):
the plan refitted to the speed of the latest steps, a validation's cost scaled with them,
the final validation kept within the budget (a sample, said so, when the whole text would
not fit), and the run ending within 2% of its budget. The machine is slowed through the
fault seams (``faults.Faults.slow``), so these tests do not depend on this one's speed."""

import json
import time

import pytest

from benchmarks import slowdown
from benchmarks.slowdown import BUDGET, Case
from chargen import load_corpus
from chargen.budget import (
    FINAL_MARGIN,
    MIN_SAMPLE,
    NONE_FITS,
    RECENT_STEPS,
    TimeBudget,
    ValidationCost,
    final_reserve,
    final_validation,
)
from chargen.trainer_state import Progress
from conftest import make_text, tiny_model, tiny_train


def on_time(wall: float) -> bool:
    return abs(wall - BUDGET) <= 0.02 * BUDGET


def timed_run(tmp_path, n_lines: int, val_fraction: float, share: float, factor: float, whole_final: bool = False):
    """A BUDGET-second run whose whole validation takes ``share`` of the budget, on a machine
    ``factor`` times slower from halfway: (result, log lines, wall seconds, its folder). A second try
    where the first missed the 2% line: a shared host's pause during the final validation
    (after which nothing can be replanned) missed it once in about ten runs, at 94.6% and
    102.7% in CI, while a budget that does not hold (110% before) misses every time. Likewise,
    with ``whole_final``, where the first scored its final validation on a sample (a pause while
    the slower validations were timed would make the whole text look too dear to fit), where a
    final validation planned at the old cost never fits. (Samples in most tries of CI's AVX2
    pass on 2026-12-05 came from the fault itself: see benchmarks.slowdown.SlowMachine.)"""
    first = timed_try(tmp_path / "first", n_lines, val_fraction, share, factor)
    if on_time(first[2]) and (final_is_whole(first[0]) or not whole_final):
        return first
    return timed_try(tmp_path / "second", n_lines, val_fraction, share, factor)


def final_is_whole(result) -> bool:
    final = [e for e in result.history if e["event"] == "val"][-1]
    return final["step"] == result.step and final["whole"]


def timed_try(folder, n_lines: int, val_fraction: float, share: float, factor: float):
    """benchmarks.slowdown's try, on the tests' own text and tiny model (hidden 64)."""
    result, lines, wall = slowdown.timed_try(folder, make_text(n_lines, seed=3), Case(0, val_fraction, share, factor),
                                             tiny_model(hidden=64), tiny_train(steps=None, max_time=BUDGET,
                                                                               eval_every=50, sample_chars=0))
    return result, lines, wall, folder


def step_millis(lines: list[str]) -> list[float]:
    """The step times the plan was fitted to, in order."""
    return [float(line.split("(")[1].split(" ms")[0]) for line in lines if line.startswith("plan fitted")]


def test_a_machine_that_halves_its_speed_halfway_ends_on_time_with_its_final_validation_whole(tmp_path):
    """Steps and validations take twice as long from halfway: the plan is refitted to the
    new speed (the schedule still finishes its decay), the final validation's time is kept
    at the new cost (before, a run stopped by the clock scored the whole text after the
    deadline: 110% of the budget), and the run ends within 2% of its budget."""
    result, lines, wall, _ = timed_run(tmp_path, 1500, 0.3, share=0.015, factor=2.0, whole_final=True)
    assert on_time(wall), (wall, lines)
    millis = step_millis(lines)
    assert millis[-1] >= 1.6 * min(millis), millis  # refitted to the slower steps
    assert result.step >= 0.99 * result.total_steps  # the schedule ran to its end
    assert final_is_whole(result), result.history[-3:]
    assert result.best_val_loss is not None and not any("final validation" in line for line in lines)


def test_a_final_validation_that_would_not_fit_scores_a_sample_and_says_so(tmp_path):
    """Scoring the whole text takes 12% of the budget (validation's share is 5%; the final
    one is kept 1.25 times its estimate and may spill 1% more, 7.25% in all: at 8% a run whose
    cost probe ran a tenth fast fitted the whole text): the run validates once, at the end, on
    the largest sample that fits in its share, says so, and keeps that figure out of the best
    weights' race; it still ends within 2% of its budget."""
    result, lines, wall, folder = timed_run(tmp_path, 2000, 0.4, share=0.12, factor=1.0)
    assert on_time(wall), (wall, lines)
    vals = [e for e in result.history if e["event"] == "val"]
    assert [e["step"] for e in vals] == [result.step] and not vals[0]["whole"] and not vals[0]["best"]
    assert MIN_SAMPLE <= vals[0]["chars"] < len(load_corpus(folder / "text.txt", val_fraction=0.4).val_ids)
    said = next(line for line in lines if line.startswith("the final validation scores a sample of"))
    assert "does not compete for the best weights" in said
    assert result.best_val_loss is None and result.last_val_loss == pytest.approx(vals[0]["val_loss"])
    closing = next(line for line in lines if line.startswith(("stopped (time)", "finished")))
    assert f"at the end on a sample of {vals[0]['chars']:,} characters" in closing
    summary = json.loads((folder / "run" / "config.json").read_text())["summary"]
    assert summary["best_val_loss"] is None


def test_the_commands_budget_counts_its_reading_of_the_text(tmp_path, monkeypatch):
    """`chargen train --max-time B` takes B seconds of the command, not B after the text is
    read: a text that takes 1.5 s to read (a slow disk) leaves the run 1.5 s less, and the
    command still ends within 2% of its budget (before, 119%)."""
    from chargen import cli

    def slow_read(*args, **kwargs):
        time.sleep(1.5)
        return read(*args, **kwargs)

    read = cli.load_corpus
    monkeypatch.setattr(cli, "load_corpus", slow_read)
    text = tmp_path / "text.txt"
    text.write_text(make_text(1500, seed=3))
    import torch._dynamo  # noqa: F401  (Python's imports come before the command, as in a fresh process)

    def command(run: str) -> float:
        start = time.perf_counter()
        code = cli.main(["train", str(text), "--out", str(tmp_path / run), "--max-time", str(BUDGET), "--hidden",
                         "64", "--embedding", "8", "--batch-size", "4", "--bptt", "16", "--eval-every", "50",
                         "--device", "cpu", "--quiet", "--sample-chars", "0"])
        assert code == 0
        return time.perf_counter() - start

    wall = command("first")
    assert on_time(wall) or on_time(command("second")), wall  # (a second try: see timed_run)


def test_the_final_validation_is_whole_a_sample_or_none_by_the_time_left():
    cost = ValidationCost(per_target=1e-4, fixed=0.5)  # the whole 100,000: 10.5 s
    assert final_validation(10.5, 100_000, cost) is None
    assert final_validation(5.5, 100_000, cost) == 50_000
    assert final_validation(0.5 + 1e-4 * (MIN_SAMPLE - 1), 100_000, cost) == NONE_FITS
    assert final_validation(0.2, 100_000, ValidationCost(1e-4, 0.0)) == NONE_FITS
    assert final_validation(0.6, 2_000, cost) == NONE_FITS  # (a small text: whole or nothing)
    # the slack buys the whole text or the smallest sample, never a bigger sample
    assert final_validation(10.0, 100_000, cost, slack=0.6) is None
    assert final_validation(5.5, 100_000, cost, slack=1.0) == 50_000
    assert final_validation(1.0, 100_000, cost, slack=0.5) == MIN_SAMPLE
    assert final_validation(1.0, 100_000, cost, slack=0.1) == NONE_FITS


def test_a_run_keeps_time_for_a_final_figure_even_past_the_validation_share():
    """The final validation is kept within what is left of 5% of the budget, except that
    the smallest sample (or a small text whole) gets up to a fifth of it: a short run on a
    slow machine ends with a figure, not with none (the app's few-second runs did)."""
    cost = ValidationCost(per_target=1e-4, fixed=0.0)  # the whole 100,000: 10 s; the smallest 0.82 s
    assert final_reserve(20.0, 100_000, cost, most=40.0) == pytest.approx(FINAL_MARGIN * 10.0)
    assert final_reserve(5.0, 100_000, cost, most=40.0) == pytest.approx(5.0, rel=1e-3)  # a sample in 5 s
    assert final_reserve(0.5, 100_000, cost, most=40.0) == pytest.approx(FINAL_MARGIN * 1e-4 * MIN_SAMPLE)
    assert final_reserve(0.5, 100_000, cost, most=1.0) == 0.0  # not even that fits in the most
    assert final_reserve(0.0, 5_000, cost, most=1.0) == pytest.approx(FINAL_MARGIN * 0.5)  # a small text, whole


def test_the_speed_is_read_off_the_latest_steps_and_a_validation_cost_scales_with_it():
    progress = Progress(step=100, train_seconds=1.0)
    budget = TimeBudget(60.0, Progress())
    assert budget.step_seconds(progress) == pytest.approx(0.01)
    budget.measured(ValidationCost(2e-6, 0.1), progress)
    budget.mark(progress)  # a fit, and then the machine runs at half speed
    progress.step, progress.train_seconds = 100 + RECENT_STEPS, 1.0 + RECENT_STEPS * 0.02
    assert budget.step_seconds(progress) == pytest.approx(0.02)  # not the mean since the start (0.0125)
    assert budget.validation_cost(progress) == ValidationCost(pytest.approx(4e-6), pytest.approx(0.2))
    progress.step, progress.train_seconds = 90, 0.9  # back to a checkpoint: the marks after it mean nothing
    budget.restart(progress)
    assert budget.marks == [(0, 0.0)] and budget.step_seconds(progress) == pytest.approx(0.01)


def test_a_validation_timed_after_slow_first_steps_is_not_scaled_down_by_them():
    """The first steps of a run are slow (allocation, kernels chosen): a validation timed
    then pairs with the speed of the latest steps, not the mean since the start; and a cost
    is scaled up when steps slow down but never down when they read faster (a run planned its
    final validation at a cost scaled down by noisy step times and ran 2-3% past the budget)."""
    budget, progress = TimeBudget(60.0, Progress()), Progress()

    def steps(n: int, seconds: float) -> None:
        for _ in range(n):
            progress.step, progress.train_seconds = progress.step + 1, progress.train_seconds + seconds
            budget.last_tick = time.perf_counter()  # (tick adds the clock's own microseconds: hence rel below)
            budget.tick(progress)

    def costing(per_target: float, fixed: float) -> ValidationCost:
        return ValidationCost(pytest.approx(per_target, rel=1e-3), pytest.approx(fixed, rel=1e-3))

    steps(5, 0.05)  # warming up
    steps(RECENT_STEPS, 0.01)
    budget.measured(ValidationCost(2e-6, 0.1), progress)
    assert budget.cost_step_seconds == pytest.approx(0.01, rel=1e-3)  # the mean since the start: 0.018
    budget.mark(progress)
    steps(RECENT_STEPS, 0.01)
    assert budget.validation_cost(progress) == costing(2e-6, 0.1)
    budget.mark(progress)
    steps(RECENT_STEPS, 0.005)  # faster now: the cost stays as timed
    assert budget.validation_cost(progress) == costing(2e-6, 0.1)
    budget.mark(progress)
    steps(RECENT_STEPS, 0.03)  # slower: scaled up
    assert budget.validation_cost(progress) == costing(6e-6, 0.3)
