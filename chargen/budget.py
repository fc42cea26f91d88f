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
best, scores the whole text when that fits in the time left (and in VAL_SHARE of the budget,
as planned); else the largest sample that fits, said so, and then it does not compete for
the best weights (the whole text's figures and a sample's do not compare; the run's own
sample's figures compare with each other: chargen.best_on_sample).

Machines slow down under a run (other work on the same cores): the plan is refitted to the
speed of the latest steps, not the invocation's mean, and a validation's measured cost is
scaled by how much slower steps have become since it was timed (never down); training stops
early enough to leave the final validation its time.
"""

from __future__ import annotations

import math
import time
from collections import deque
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
NONE_FITS = 0  # final_validation's answer when not even the smallest sample fits
# The most of the budget a final validation is given when the smallest sample does not fit
# in VAL_SHARE: a run of a few seconds on a slow machine still ends with a figure.
FINAL_MOST_SHARE = 0.2
# What the final validation may run past the budget, as a share of it, to score the whole
# text rather than a sample, or the smallest sample rather than none: a step slower than the
# rest (a page fault, other work) can eat the time kept for it, and half the 2% a run may end
# off its budget is better spent than a figure lost. (A sample is sized to the time left.)
FINAL_SLACK = 0.01
# The final validation is planned at this times its estimate: one a fifth off still fits
# whole, and what goes unused is a fifth of the final's time (itself at most 5% of the budget).
FINAL_MARGIN = 1.25
# The fewest steps the current speed is read over: a fit or two after a machine slows, the
# plan knows, and one slow step (a page fault, a checkpoint's flush) does not swing it.
RECENT_STEPS = 20


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


def final_validation(seconds: float, whole: int, cost: ValidationCost, slack: float = 0.0) -> int | None:
    """What the last validation can score within ``seconds``: the whole text (None) when it
    fits, else the targets of the largest sample that does, or NONE_FITS when not even
    MIN_SAMPLE (or the whole text, if smaller) does. ``slack`` more seconds may be spent, but
    only on scoring the whole text rather than a sample, or the smallest sample rather than
    none: a sample is sized to ``seconds``."""
    smallest = min(MIN_SAMPLE, whole)
    if cost.seconds(whole) <= seconds + slack:
        return None
    fits = int((seconds - cost.fixed) / cost.per_target) if cost.per_target > 0 else 0
    return fits if fits >= smallest else smallest if cost.seconds(smallest) <= seconds + slack else NONE_FITS


def final_reserve(allowance: float, whole: int, cost: ValidationCost, most: float) -> float:
    """The seconds a timed run keeps for its final validation: the whole text's, or the
    largest sample's within ``allowance`` (what is left of VAL_SHARE of the budget), times
    FINAL_MARGIN. Where not even the smallest sample fits in that, the smallest one's, if
    it fits in ``most``: a run should end with a figure."""
    smallest = FINAL_MARGIN * cost.seconds(min(MIN_SAMPLE, whole))
    if allowance < smallest <= most:
        allowance = smallest
    final = final_validation(allowance / FINAL_MARGIN, whole, cost)
    return 0.0 if final == NONE_FITS else FINAL_MARGIN * cost.seconds(whole if final is None else final)


@dataclass(frozen=True)
class ValidationPlan:
    """How often to validate during the run, and on how many targets (None: all)."""

    every: int
    sample: int | None = None


def plan_validation(allowance: float, steps_left: int, eval_every: int, whole: int, cost: ValidationCost,
                    sample: int | None = None, whole_only: bool = False, final_seconds: float | None = None
                    ) -> ValidationPlan:
    """The validations of the rest of a run within ``allowance`` seconds, the final one
    included (``final_seconds``; by default the whole text's): every ``eval_every`` steps on
    the whole text if that fits; else on a sample (``sample``, once a run has one: the curve
    then compares like with like; or as big as fits, but at least MIN_SAMPLE targets), spaced
    out further if even that does not fit, and none before the end if not even one does.
    ``whole_only`` (--patience, which compares each validation with the best) spaces out
    whole ones instead of sampling."""
    allowance -= cost.seconds(whole) if final_seconds is None else final_seconds
    count = steps_left // eval_every  # validations before the end
    if sample is None and (count == 0 or allowance >= count * cost.seconds(whole)):
        return ValidationPlan(eval_every)
    if whole_only:
        return spaced_out(allowance, steps_left, eval_every, cost.seconds(whole), None)
    if sample is None:
        fits = int((allowance / max(1, count) - cost.fixed) / cost.per_target) if cost.per_target > 0 else whole
        sample = min(whole, max(fits, MIN_SAMPLE))
        if sample == whole:  # (a text smaller than the smallest sample: spaced out, whole)
            return spaced_out(allowance, steps_left, eval_every, cost.seconds(whole), None)
    return spaced_out(allowance, steps_left, eval_every, cost.seconds(sample), sample)


def spaced_out(allowance: float, steps_left: int, eval_every: int, one: float, sample: int | None) -> ValidationPlan:
    """Validations of ``one`` second each, as often as ``allowance`` allows (at most every
    ``eval_every`` steps), or none before the end if not even one fits."""
    if allowance < one:
        return ValidationPlan(END_ONLY, sample)
    return ValidationPlan(max(eval_every, math.ceil(steps_left * one / allowance)), sample)


def describe_validation(plan: ValidationPlan, whole: int, steps_left: int) -> str:
    if plan.every > steps_left:
        return f"validation: at the end only, to keep it within {VAL_SHARE:.0%} of --max-time"
    if plan.sample is None:
        return f"validation: every {plan.every:,} steps on the whole validation text"
    return (f"validation: every {plan.every:,} steps on a sample of {plan.sample:,} of its {whole:,} characters, and "
            f"on the whole text at the end, to keep it within {VAL_SHARE:.0%} of --max-time")


class TimeBudget:
    """``--max-time`` for this invocation, and the clock of training time (validation is
    not training time). It keeps what validation has cost so far, to hold it to VAL_SHARE."""

    FIRST_FIT = 25  # steps timed before the first fit
    # ... or fewer (2 at least), once this share of the budget has gone: a budget of a few
    # seconds, much of it taken by set-up, would otherwise end before its plan had a reserve
    # for the final validation
    FIRST_FIT_SHARE = 0.1

    def __init__(self, max_time: float | None, progress: Progress, spent: float = 0.0, first_fit: int = FIRST_FIT,
                 early_fit: bool = True) -> None:
        self.max_time = max_time
        self.next_fit = progress.step + first_fit  # the step at which the plan is next fitted to the time
        self.early_fit = early_fit  # (by the clock: one process only, as ranks must fit at the same step)
        self.last_tick = time.perf_counter()
        self.start = self.last_tick - spent  # (set-up is the budget's too: the size probe, a checkpoint read)
        self.start_step, self.start_chars = progress.step, progress.chars_seen
        self.cost: ValidationCost | None = None  # measured at each validation
        self.cost_step_seconds = 0.0  # what a step took when it was
        self.val_seconds = 0.0  # spent on validation (and its samples) in this invocation
        self.reserve = 0.0  # seconds kept for the final validation: training stops that much before the end
        self.marks = [(progress.step, progress.train_seconds)]  # (step, training seconds) at each fit
        self.ticks: deque[tuple[int, float]] = deque(maxlen=RECENT_STEPS + 1)  # the same, at the latest steps
        self.last_step_seconds = 0.0

    def tick(self, progress: Progress) -> float:
        """A step ended: count its time as training; returns the time now."""
        now = time.perf_counter()
        progress.train_seconds += now - self.last_tick
        self.last_tick = now
        self.ticks.append((progress.step, progress.train_seconds))
        return now

    def resume_ticking(self) -> float:
        self.last_tick = time.perf_counter()
        return self.last_tick

    def fit_due(self, progress: Progress, now: float) -> bool:
        """Whether the plan is to be fitted to the time after this step."""
        if progress.step >= self.next_fit:
            return True
        first = len(self.marks) == 1 and self.early_fit and progress.step - self.start_step >= 2
        return first and now - self.start >= self.FIRST_FIT_SHARE * self.max_time

    def out_of_time(self) -> bool:
        return self.max_time is not None and time.perf_counter() - self.start >= self.max_time - self.reserve

    def mark(self, progress: Progress) -> None:
        """The plan is being fitted: the speed from here on is the next fit's to read."""
        self.marks.append((progress.step, progress.train_seconds))

    def restart(self, progress: Progress) -> None:
        """The loop went back to a checkpoint (its progress with it): marks after it mean nothing."""
        self.marks = [(step, seconds) for step, seconds in self.marks if step <= progress.step]
        self.ticks.clear()

    def step_seconds(self, progress: Progress) -> float:
        """Seconds a training step takes now: over the steps since the latest mark that
        leaves at least RECENT_STEPS, or since the start of this invocation."""
        step, seconds = next(((step, seconds) for step, seconds in reversed(self.marks)
                              if progress.step - step >= RECENT_STEPS), self.marks[0])
        if progress.step > step and progress.train_seconds > seconds:
            self.last_step_seconds = (progress.train_seconds - seconds) / (progress.step - step)
        return self.last_step_seconds

    def validation_cost(self, progress: Progress) -> ValidationCost:
        """What a validation costs now: the last one's, scaled by how much slower steps are
        now than then (never down: the speed of twenty steps is noisier than a validation's
        timing, and where steps read 1.4 times faster than when a validation was timed, the
        final one planned at its cost scaled down ran 2-3% past the budget; a cost read too
        high costs a smaller sample); before any, a guess: a forward pass over the validation
        text, about half a training step's time per character (a third to a half, measured)."""
        step_seconds = self.step_seconds(progress)
        if self.cost is None:
            targets_per_step = (progress.chars_seen - self.start_chars) / max(1, progress.step - self.start_step)
            return ValidationCost(step_seconds / (2 * max(1.0, targets_per_step)), 0.0)
        scale = max(1.0, step_seconds / self.cost_step_seconds) if self.cost_step_seconds > 0 else 1.0
        return ValidationCost(self.cost.per_target * scale, self.cost.fixed * scale)

    def measured(self, cost: ValidationCost, progress: Progress) -> None:
        """A validation (or the first timing of one) cost this, while steps took what the
        latest RECENT_STEPS took: not the invocation's mean, whose first steps (allocation,
        kernels chosen) took 1.7 times a warm one's under oneDNN's AVX2 kernels; a cost timed
        at the first fit was then scaled down by that much, and a final validation planned
        from it ran 3% past the budget."""
        self.cost, self.cost_step_seconds = cost, self.latest_step_seconds(progress)

    def latest_step_seconds(self, progress: Progress) -> float:
        """Seconds a step took over the latest RECENT_STEPS (or as many as there were)."""
        if len(self.ticks) < 2:
            return self.step_seconds(progress)
        (first, start), (last, end) = self.ticks[0], self.ticks[-1]
        return (end - start) / (last - first) if last > first else self.step_seconds(progress)

    def seconds_left(self) -> float:
        return self.max_time - (time.perf_counter() - self.start)

    def final_reserve(self, whole: int, cost: ValidationCost, rescore: bool = False) -> float:
        """Seconds to keep for the final validation (``final_reserve``): what is left of
        VAL_SHARE of the budget, or at most FINAL_MOST_SHARE of it for the smallest sample.
        With ``rescore``, a whole text's more where both fit in what is left of the share: the
        best weights on the validation sample scored whole too (chargen.best_on_sample)."""
        left = VAL_SHARE * self.max_time - self.val_seconds
        reserve = final_reserve(left, whole, cost, FINAL_MOST_SHARE * self.max_time)
        again = FINAL_MARGIN * cost.seconds(whole)
        return reserve + again if rescore and reserve + again <= left else reserve

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
    final_at: int = -1  # the step of the final validation (of a timed run, maybe a sample or none)
    scoring: tuple[float, int] = (0.0, 0)  # the last validation's scoring: seconds, targets

    @classmethod
    def starting(cls, step: int, eval_every: int) -> ValidationClock:
        at = step // eval_every * eval_every
        return cls(ValidationPlan(eval_every), at, at + eval_every)

    def validated(self, step: int) -> None:
        self.validated_at, self.next_at = step, step + self.plan.every

    def replan(self, plan: ValidationPlan, step: int) -> None:
        self.plan, self.next_at = plan, max(step + 1, self.validated_at + plan.every)
