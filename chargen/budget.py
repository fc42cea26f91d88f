"""``--max-time``: the clock of training time, the plan fitted to the deadline, and
validation kept to a small share of the budget.

The plan (so the learning-rate schedule) is refitted to what the measured seconds per step
and per validation leave, so the schedule finishes its decay by the deadline instead of
being cut off at its peak. Without ``--epochs`` or ``--steps`` a timed run is planned over
the whole budget: no default epoch count ends it early.

Validation is for steering, and it costs time the model could have trained: during a timed
run, validation and its samples take at most ``VAL_SHARE`` of the budget. When scoring the
whole validation text at every ``--eval-every`` would take more, each validation during the
run scores a fixed sample of it (the same characters every time, so the curve compares
like with like), and if even the smallest useful sample is too dear, validations are spaced
out. The last validation, whose figure the run reports and whose weights are kept as the
best, always scores the whole text.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .trainer_state import Progress

VAL_SHARE = 0.05
# The share of that planned for: a validation's cost is known only once one has run (the
# first is a guess), and samples and checkpoints vary; 2x512 in the budget sweep, planned to
# the full 5%, took 5.3%.
PLANNED_SHARE = 0.9
# The smallest sample worth scoring. One stretch of 8,192 characters of Shakespeare scores
# within 0.07 nats (one standard deviation, the shipped model over 30 stretches) of the whole
# validation text; a sample here is spread over the validation streams, and being the same
# characters every time, its offset from the whole stays put while the curve falls.
MIN_SAMPLE = 8192
END_ONLY = 2**62  # ValidationPlan.every when none fits before the final one, however the plan grows


def fit_to_time(total: int, step: int, seconds_left: float, step_seconds: float, eval_seconds: float,
                eval_every: int, final_seconds: float | None = None) -> int:
    """The largest plan (never above ``total``) whose remaining steps and validations fit in
    ``seconds_left``: ``eval_seconds`` every ``eval_every`` steps, and ``final_seconds``
    (the whole validation text; by default the same) at the end."""
    final = eval_seconds if final_seconds is None else final_seconds
    per_step = step_seconds + eval_seconds / eval_every
    fit = int((seconds_left - final) / per_step)
    return max(step + 1, min(total, step + fit))


@dataclass(frozen=True)
class ValidationCost:
    """What one validation costs: seconds per target scored, and seconds besides (the
    samples shown, the checkpoint written with it)."""

    per_target: float
    fixed: float

    def seconds(self, targets: int) -> float:
        return targets * self.per_target + self.fixed


@dataclass(frozen=True)
class ValidationPlan:
    """How often to validate during the run, and on how many targets (None: all)."""

    every: int
    sample: int | None = None


def plan_validation(allowance: float, steps_left: int, eval_every: int, whole: int, cost: ValidationCost,
                    sample: int | None = None, whole_only: bool = False) -> ValidationPlan:
    """The validations of the rest of a run within ``allowance`` seconds, the final whole
    one included: every ``eval_every`` steps on the whole text if that fits; else on a
    sample (``sample``, once a run has one: the curve then compares like with like; or as
    big as fits, but at least MIN_SAMPLE targets), spaced out further if even that does not
    fit, and none before the end if not even one does. ``whole_only`` (--patience, which
    compares each validation with the best) spaces out whole ones instead of sampling."""
    allowance -= cost.seconds(whole)  # the final validation: always the whole text
    count = steps_left // eval_every  # validations before the end
    if sample is None and (count == 0 or allowance >= count * cost.seconds(whole)):
        return ValidationPlan(eval_every)
    if whole_only:
        return spaced_out(allowance, steps_left, eval_every, cost.seconds(whole), None)
    if sample is None:
        fits = int((allowance / max(1, count) - cost.fixed) / cost.per_target) if cost.per_target > 0 else whole
        sample = min(whole, max(fits, MIN_SAMPLE))
    return spaced_out(allowance, steps_left, eval_every, cost.seconds(sample), sample)


def spaced_out(allowance: float, steps_left: int, eval_every: int, one: float, sample: int | None) -> ValidationPlan:
    """Validations of ``one`` second each, as often as ``allowance`` allows (at most every
    ``eval_every`` steps), or none before the end if not even one fits."""
    if allowance < one:
        return ValidationPlan(END_ONLY, sample)
    return ValidationPlan(max(eval_every, math.ceil(steps_left * one / allowance)), sample)


class TimeBudget:
    """``--max-time`` for this invocation, and the clock of training time (validation is
    not training time). It keeps what validation has cost so far, to hold it to VAL_SHARE."""

    FIRST_FIT = 25  # steps timed before the first fit

    def __init__(self, max_time: float | None, progress: Progress, spent: float = 0.0, first_fit: int = FIRST_FIT
                 ) -> None:
        self.max_time = max_time
        self.next_fit = progress.step + first_fit  # the step at which the plan is next fitted to the time
        self.last_tick = time.perf_counter()
        self.start = self.last_tick - spent  # (what set-up already took of the budget: the speed probe)
        self.start_step, self.seconds_at_start = progress.step, progress.train_seconds
        self.cost: ValidationCost | None = None  # measured at each validation
        self.val_seconds = 0.0  # spent on validation (and its samples) in this invocation

    def tick(self, progress: Progress) -> float:
        """A step ended: count its time as training; returns the time now."""
        now = time.perf_counter()
        progress.train_seconds += now - self.last_tick
        self.last_tick = now
        return now

    def resume_ticking(self) -> float:
        self.last_tick = time.perf_counter()
        return self.last_tick

    def out_of_time(self) -> bool:
        return self.max_time is not None and time.perf_counter() - self.start >= self.max_time

    def step_seconds(self, progress: Progress) -> float:
        return (progress.train_seconds - self.seconds_at_start) / max(1, progress.step - self.start_step)

    def seconds_left(self) -> float:
        return self.max_time - (time.perf_counter() - self.start)

    def validation_allowance(self) -> float:
        """Seconds validation may still take in this invocation, with a margin."""
        return VAL_SHARE * PLANNED_SHARE * self.max_time - self.val_seconds


@dataclass
class ValidationClock:
    """When the loop validates next, and what its last validations took: the loop's one
    piece of validation timing state."""

    plan: ValidationPlan
    validated_at: int  # the step of the last validation (or where one would have been)
    next_at: int  # the step of the next
    whole_at: int = -1  # the step of the last validation on the whole text
    scoring: tuple[float, int] = (0.0, 0)  # the last validation's scoring: seconds, targets

    @classmethod
    def starting(cls, step: int, eval_every: int) -> ValidationClock:
        at = step // eval_every * eval_every
        return cls(ValidationPlan(eval_every), at, at + eval_every)

    def validated(self, step: int) -> None:
        self.validated_at, self.next_at = step, step + self.plan.every

    def replan(self, plan: ValidationPlan, step: int) -> None:
        self.plan, self.next_at = plan, max(step + 1, self.validated_at + plan.every)
