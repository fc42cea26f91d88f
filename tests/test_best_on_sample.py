"""A timed run that validates on a sample of its validation text keeps the best weights by
that sample, and where the curve turned up before the end, scores them on the whole text and
keeps them if they beat the last weights (chargen/best_on_sample.py)."""

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import slowdown
from benchmarks.slowdown import BUDGET, Case
from chargen import checkpoint
from chargen.best_on_sample import BestOnSample
from chargen.storage import load_tensors
from chargen.train import rescore_fits
from conftest import tiny_model, tiny_train

ROOT = Path(__file__).resolve().parents[1]


def test_the_best_sampled_validation_keeps_a_copy_of_its_weights():
    model, best = torch.nn.Linear(2, 2), BestOnSample()
    assert not best.turned_up
    best.seen(1.5, 10, model)
    with torch.no_grad():
        model.weight.fill_(7.0)
    best.seen(1.2, 20, model)
    with torch.no_grad():
        model.weight.fill_(9.0)  # the copy is not the model's own tensor
    best.seen(1.3, 30, model)
    assert (best.loss, best.step, best.last_loss, best.turned_up) == (1.2, 20, 1.3, True)
    with best.loaded(model):
        assert torch.equal(model.weight, torch.full((2, 2), 7.0))
    assert torch.equal(model.weight, torch.full((2, 2), 9.0))
    best.seen(1.1, 40, model)
    assert not best.turned_up and best.step == 40


class FakeBudget:  # (the TimeBudget as rescore_fits reads it)
    def __init__(self, left: float) -> None:
        self.left = left

    def seconds_left(self) -> float:
        return self.left


def test_the_rescore_is_fitted_to_what_the_final_validation_took_and_said_when_skipped():
    """The rescore scores the same text with the same model as the final validation just
    did: it fits where that time is left, or within the final validation's slack (1% of the
    budget) past it; where it does not, one line says why (the timed run below holds its budget)."""
    lines = []
    best = BestOnSample(loss=1.2, step=300, last_loss=1.3)
    trainer = SimpleNamespace(run=SimpleNamespace(config=SimpleNamespace(max_time=100.0)), best_on_sample=best,
                              clock=SimpleNamespace(scoring=(2.0, 50_000)), budget=FakeBudget(2.5), log=lines.append)
    assert rescore_fits(trainer) and not lines
    trainer.budget.left = 1.2  # 0.8 s past the budget: within its slack
    assert rescore_fits(trainer) and not lines
    trainer.budget.left = 0.9
    assert not rescore_fits(trainer)
    assert lines == ["the weights of step 300, the best on the validation sample (1.2000 there, 1.3000 at the last), "
                     "are not scored on the whole text: that would take about 2.0 s, and 0.9 s of --max-time 100 "
                     "are left"]
    trainer.run.config.max_time = None  # an untimed run always rescores
    assert rescore_fits(trainer)


def test_a_run_that_overfits_keeps_its_best_weights_by_the_sample(tmp_path):
    """The training text is random letters where an "a" is always followed by a "b"; the
    validation text is random letters alone. A 1x128 model without dropout learns the letters'
    frequencies, which hold in both, and the rule, which does not, ever more surely: its
    validation loss (on a sample of the 12,000-character validation text: the whole costs 0.5%
    of the budget, too dear at every validation) falls, then rises. The last weights are scored
    whole, then the best sample's weights, which do better and are kept as the best; the run
    still ends within 2% of its budget. Before, the last weights were the run's best."""
    rng = random.Random(5)
    text = "".join(rng.choices("abcdefgh", k=15_000)).replace("a", "ab") + "".join(rng.choices("abcdefgh", k=12_000))
    case = Case(0, val_fraction=0.45, share=0.005, factor=1.0)
    model = tiny_model(hidden=128, layers=1, dropout=0.0)
    training = tiny_train(steps=None, max_time=BUDGET, eval_every=50, sample_chars=0, base_lr=0.01)
    result, lines, wall = slowdown.timed_try(tmp_path / "try", text, case, model, training)
    assert abs(wall - BUDGET) <= 0.02 * BUDGET, (wall, lines)
    run_dir = tmp_path / "try" / "run"
    vals = [e for e in result.history if e["event"] == "val"]
    sampled = [e for e in vals if not e["whole"]]
    # it turned up (sampled validations are spaced by their 5% of the budget: 8-9 natively here, 4 once capped to AVX2)
    assert len(sampled) >= 3 and min(e["val_loss"] for e in sampled) < sampled[-1]["val_loss"]
    last = vals[-1]
    assert last["whole"] and last["step"] == result.step
    again = result.history[-1]
    assert again["event"] == "best_on_sample" and again["weights_step"] < result.step and again["best"]
    assert again["val_loss"] < last["val_loss"] and result.best_val_loss == pytest.approx(again["val_loss"])
    said = next(line for line in lines if line.startswith(f"the weights of step {again['weights_step']:,}, the best"))
    assert "(best)" in said
    _, meta = load_tensors(run_dir / checkpoint.BEST)
    assert meta["step"] == again["weights_step"]
    summary = json.loads((run_dir / "config.json").read_text())["summary"]
    assert summary["best_val_loss"] == pytest.approx(again["val_loss"])
    # benchmarks.run_summary counts it as the run's best, and shows it in the curve's table
    done = subprocess.run([sys.executable, "-m", "benchmarks.run_summary", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"best validation loss (whole text): {again['val_loss']:.4f}" in done.stdout
    assert f"(the weights of step {again['weights_step']:,})" in done.stdout
