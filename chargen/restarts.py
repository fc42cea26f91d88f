"""Warm restarts for a timed run that far outlasts its text.

A run's dropout follows its exposure (chargen.autosize.regularisation) up to MAX_DROPOUT,
reached at an exposure of 1,000; past that nothing more holds a model back, and a run given
far more time than its text needs memorises it while its learning rate is still near the
peak: a list of 4,645 names for 30 minutes (1x256, dropout 0.6, exposure 19,500, one cosine
over 258,086 steps) did best at step 7,255, 1.8823, while 60 s on the same host (8,303 steps,
its rate decayed by the end) scored 1.8640.

Such a plan is cut into cycles, each a warmup and a decay twice as long as the one before
(chargen.schedule.cycle_bounds), so its cycles end, the rate decayed, at exposures a doubling
apart from FIRST_CYCLE_EXPOSURE on: whichever suits the text, one ends near it, and the run
keeps the best of its validations (the whole text's, or a sample's: chargen.best_on_sample).
"""

from __future__ import annotations

import math

from .autosize import regularisation
from .prepare import PreparedRun
from .schedule import MAX_CYCLES

# Plans past this exposure restart (below it, one decay: Alice at 1,500 did best so, with 0.6)
RESTART_EXPOSURE = 2000.0
FIRST_CYCLE_EXPOSURE = 500.0  # the least a first cycle is given (the names did best at 250-550)


def cycles_for(exposure: float) -> int:
    """How many cycles a plan of ``exposure`` is cut into: the most that leave its first
    FIRST_CYCLE_EXPOSURE at least; one at or below RESTART_EXPOSURE."""
    if exposure <= RESTART_EXPOSURE:
        return 1
    return max(1, min(MAX_CYCLES, int(math.log2(exposure / FIRST_CYCLE_EXPOSURE + 1))))


def plan_cycles(run: PreparedRun, total_steps: int) -> tuple[int, str]:
    """The cycles of a new timed run's plan of ``total_steps``, where chargen chose its
    dropout (a run whose regularisation is the user's keeps one decay), and the line that
    says so (empty for one)."""
    if "dropout" not in run.chosen or run.config.decay == "none":
        return 1, ""
    epochs = total_steps / run.feed.steps_per_epoch
    fitting = regularisation(epochs, run.record.parameters, run.feed.epoch_targets, run.line)
    exposure = fitting.exposure
    cycles = cycles_for(exposure) if fitting.dropout > 0 else 1  # (none: a model too big to memorise in its run)
    if cycles == 1:
        return 1, ""
    return cycles, (f"warm restarts: the plan's exposure ({exposure:.3g}) is past {RESTART_EXPOSURE:g}, where dropout "
                    f"alone no longer holds the model back: {cycles} cycles of warmup and decay, each twice as "
                    "long as the one before; the best validation is kept")
