"""``--max-time`` in the training loop: the plan, and the validations within it, refitted
to the time left at the speed of the latest steps (chargen.budget has the arithmetic), and
the final validation fitted to what is left at the end; at the first fit, what the run left
to chargen (dropout, weight decay, peak learning rate) decided again for the fitted plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from tqdm import tqdm

from .autosize import base_lr_for, regularisation
from .budget import (
    FINAL_SLACK,
    MIN_SAMPLE,
    NONE_FITS,
    TimeBudget,
    ValidationClock,
    ValidationCost,
    ValidationPlan,
    describe_validation,
    final_validation,
    fit_to_time,
    plan_validation,
)
from .prepare import TIMED_PLAN, PreparedRun, plan_schedule, same_without_timing
from .schedule import format_schedule


class TimedPlan:
    """The plan of one timed run, refitted as it trains: the Trainer's clock and validation
    clock, which it changes, and how to score the validation text (for the first timing).
    Its ``run`` is the Trainer's, with the regularisation refitted at the first fit."""

    def __init__(self, run: PreparedRun, budget: TimeBudget, clock: ValidationClock, bar: tqdm,
                 log: Callable[[str], None], score: Callable[[int | None], tuple[float, int]],
                 samples: Callable[[], object] | None) -> None:
        self.run, self.budget, self.clock, self.bar, self.log = run, budget, clock, bar, log
        self.score, self.samples = score, samples
        self.rescore = False  # whether to keep time for the best weights on the sample, scored whole

    def fit(self) -> float:
        """Refit the plan, and the validations within it, to what is left of --max-time, at
        the speed of the latest steps; the final validation is planned as the whole text
        when that fits in what is left of VAL_SHARE of the budget, else as the largest
        sample that does, and its time is kept (training stops that much before the end). Returns the
        seconds spent timing a validation (neither training nor validation)."""
        progress, config, whole = self.run.state.progress, self.run.config, self.run.feed.val_targets
        budget = self.budget
        probed = self.time_validation() if budget.cost is None else 0.0
        step_seconds, cost = budget.step_seconds(progress), budget.validation_cost(progress)
        final_seconds = budget.final_reserve(whole, cost, self.rescore)
        total, plan = progress.total_steps, self.clock.plan
        for _ in range(2):  # the validations depend on the steps left, and the steps on them
            plan = plan_validation(budget.validation_allowance(), max(0, total - progress.step), config.eval_every,
                                   whole, cost, self.clock.plan.sample, whole_only=config.patience is not None,
                                   final_seconds=final_seconds)
            during = cost.seconds(whole if plan.sample is None else plan.sample)
            total = fit_to_time(progress.requested_steps, progress.step, budget.seconds_left(), step_seconds, during,
                                plan.every, final_seconds)
        total = self.run.ranks.from_main(total, self.run.device)  # every rank follows rank 0's clock and plan
        plan = ValidationPlan(self.run.ranks.from_main(plan.every, self.run.device),
                              self.run.ranks.from_main(-1 if plan.sample is None else plan.sample, self.run.device))
        plan = plan if plan.sample != -1 else ValidationPlan(plan.every)
        first, old = progress.total_steps >= TIMED_PLAN, self.clock.plan
        if abs(total - progress.total_steps) > progress.total_steps // 100:
            millis = f"{step_seconds * 1000:.{1 if step_seconds < 0.01 else 0}f}"
            self.log(f"plan fitted to --max-time {config.max_time:g}: {total:,} steps ({millis} ms a step, "
                     f"{cost.seconds(whole):.1f} s a validation)")
        steps_left = total - progress.step
        if (plan.sample, plan.every > steps_left) != (old.sample, old.every > steps_left):  # a new kind of plan
            self.log(describe_validation(plan, whole, steps_left))
        self.clock.plan, budget.next_fit = plan, progress.step + max(1, (total - progress.step) // 10)
        self.clock.next_at = max(progress.step + 1, self.clock.validated_at + plan.every)
        # (the clock is read after a step, distributed at log steps only: that many may run over)
        budget.reserve = final_seconds + step_seconds * (config.log_every if self.run.ranks.active else 1)
        budget.mark(progress)
        progress.total_steps = self.run.schedule.total_steps = self.bar.total = total
        if len(budget.marks) == 2:  # (the first fit: dropout, weight decay, peak rate, if chosen, follow the plan)
            self.run, refitted = refit_regularisation(self.run, total)
            if refitted:
                self.log(refitted)
        if first:  # the schedule's length is known only now
            self.log(format_schedule(self.run.scaling.describe(config.batch_size, self.run.feed.steps_per_epoch,
                                                           self.run.schedule)))
        self.bar.refresh()
        return probed

    def time_validation(self) -> float:
        """Time the scoring of a small sample and the samples a validation shows, before
        any validation has run: the final one is planned from them (a guess from the training
        speed was 30x off for small models). Like the size probe, it is the budget's but
        neither training nor validation."""
        progress, start = self.run.state.progress, time.perf_counter()
        _, scored = self.score(min(MIN_SAMPLE, self.run.feed.val_targets))
        scoring = time.perf_counter() - start
        if self.samples is not None:
            self.samples()
        spent = time.perf_counter() - start
        self.budget.measured(ValidationCost(scoring / max(1, scored), spent - scoring), progress)
        self.budget.last_tick += spent
        return spent

    def final_sample(self) -> int | None:
        """What the last validation scores: the whole text (None); in a timed run whose whole
        text would not fit in the time left, the largest sample that does, or NONE_FITS,
        either said in the log."""
        progress, whole = self.run.state.progress, self.run.feed.val_targets
        self.clock.final_at = progress.step
        if self.run.config.max_time is None:
            return None
        left, cost = self.budget.seconds_left(), self.budget.validation_cost(progress)
        sample = final_validation(left, whole, cost, slack=FINAL_SLACK * self.run.config.max_time)
        if sample is None:
            return None
        took = f"the whole text would take about {cost.seconds(whole):.1f} s, and {max(0.0, left):.1f} s of " \
               f"--max-time {self.run.config.max_time:g} are left"
        if sample == NONE_FITS:
            self.log(f"no final validation: {took}, too few to score even {min(MIN_SAMPLE, whole):,} characters")
        else:
            self.log(f"the final validation scores a sample of {sample:,} of the {whole:,} validation characters: "
                     f"{took} (a sample's figure does not compete for the best weights)")
        return sample


def refit_regularisation(run: PreparedRun, total_steps: int) -> tuple[PreparedRun, str]:
    """The run with what it left to chargen (dropout, weight decay, peak learning rate: autosize)
    decided again for the epochs of its fitted plan of ``total_steps`` (a few steps in, within the
    warmup), in the model, optimizer, schedule and record; and the line that says so (or "")."""
    if not run.chosen:
        return run, ""
    epochs, params = total_steps / run.feed.steps_per_epoch, run.record.parameters
    fitting = regularisation(epochs, params, run.feed.epoch_targets, run.line)
    dropout = fitting.dropout if "dropout" in run.chosen else run.model_config.dropout
    weight_decay = fitting.weight_decay if "weight_decay" in run.chosen else run.config.weight_decay
    base_lr = base_lr_for(epochs, params, run.feed.epoch_targets) if "base_lr" in run.chosen else run.config.base_lr
    changes = [f"{name} {new:g} (was {old:g})" for name, new, old in (
        ("dropout", dropout, run.model_config.dropout), ("weight decay", weight_decay, run.config.weight_decay),
        ("peak learning rate", base_lr, run.config.base_lr)) if new != old]
    if not changes:
        return run, ""
    run.model.set_dropout(dropout)
    run.state.optimizer.param_groups[0]["weight_decay"] = weight_decay  # (the matrices: see param_groups)
    model_config = replace(run.model_config, dropout=dropout)
    config = replace(run.config, weight_decay=weight_decay, base_lr=base_lr)
    scaling, schedule = plan_schedule(config, run.feed, run.state.progress)  # (the step sets the rate from it)
    record = replace(run.record, model=model_config, train=config)
    run = replace(run, model_config=model_config, config=config, record=record, scaling=scaling, schedule=schedule)
    note = fitting.note if "dropout" in run.chosen else ""  # (about the dropout: none where it was given)
    counted = f"{fitting.exposure:.3g}; {note}" if note else f"{fitting.exposure:.3g}"
    return run, (f"regularisation refitted to the plan of {total_steps:,} steps ({epochs:.3g} epochs, exposure "
                 f"{counted}): {', '.join(changes)}; {same_without_timing(run)}")
