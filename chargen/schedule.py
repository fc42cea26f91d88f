"""Learning-rate schedules as pure functions of the step, so a resumed run replays them
exactly from the step number alone, and the batch-size scaling rules that set them.

``BatchScaling`` holds a reference setting tuned at one batch size (base batch B0, base
peak learning rate lr0, base warmup W0 in epochs) and derives the schedule for a batch
B = k * B0 by one of three rules:

- ``legw`` (linear-epoch gradual warmup; You et al. 2019, "Large-Batch Training for LSTM
  and Beyond"): peak lr0 * sqrt(k), warmup k * W0 epochs.
- ``linear`` (Goyal et al. 2017): peak lr0 * k, warmup W0 epochs.
- ``none``: peak lr0, warmup W0 epochs.

What LEGW's rule comes to, derived: an epoch at batch k * B0 takes 1/k as many updates as
at B0 (the same characters, k times as many per update), so k * W0 epochs at batch k * B0
is W0 * steps_per_epoch(B0) updates: the *same number of updates* as the base run's
warmup. This is the paper's reading too: it scales the learning rate curve drawn against
epochs by k in length and sqrt(k) in height, and against updates that leaves the warmup's
length where it was while the peak rises. Linear and no scaling keep the warmup fixed in
epochs, so at k times the batch they warm up in 1/k as many updates.

The decay runs from the end of the warmup to the end of the plan. Every run in a
comparison trains the same number of epochs E (as the paper's comparisons do), so a decay
stretched k times in epochs as well would not end inside them; here the decay fills what
the warmup leaves: (E - k * W0) epochs under LEGW, (E - W0) under the others. In updates
at batch k * B0 that is 1/k of the base run's decay, less what the longer warmup (in
epochs) took from it. The exponential decay is set the same way, by where it ends (a
tenth of the peak by default) rather than by a fixed period.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import ChargenError

DECAYS = ("cosine", "linear", "poly", "exp", "none")
SCALINGS = ("legw", "linear", "none")
POLY_POWER = 2.0


@dataclass
class WarmupDecay:
    """Linear warmup from 0 to ``peak_lr`` over ``warmup_steps``, then a decay to
    ``final_fraction * peak_lr`` at ``total_steps``: cosine; linear; poly (quadratic, the
    polynomial decay of the LEGW paper's LSTM runs); exp (a constant factor per step); or
    none (flat at the peak)."""

    peak_lr: float
    warmup_steps: int
    total_steps: int
    decay: str = "cosine"
    final_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not self.peak_lr > 0:
            raise ChargenError(f"the peak learning rate must be positive, not {self.peak_lr}")
        if self.warmup_steps < 0:
            raise ChargenError(f"--warmup-steps must be 0 or more, not {self.warmup_steps}")
        if self.decay not in DECAYS:
            raise ChargenError(f"--decay must be one of {', '.join(DECAYS)}, not {self.decay!r}")
        if not 0.0 <= self.final_fraction <= 1.0:
            raise ChargenError(f"the final lr fraction must be in [0, 1], not {self.final_fraction}")
        if self.decay == "exp" and self.final_fraction == 0:
            raise ChargenError("an exponential decay never reaches 0: give a final lr fraction above 0")

    def lr_at(self, step: int) -> float:
        """The learning rate for update number ``step`` (counting from 0)."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.decay == "none":
            return self.peak_lr
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        floor = self.final_fraction
        if self.decay == "exp":
            return self.peak_lr * floor**progress
        if self.decay == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        elif self.decay == "poly":
            shape = (1.0 - progress) ** POLY_POWER
        else:
            shape = 1.0 - progress
        return self.peak_lr * (floor + (1.0 - floor) * shape)

    def describe(self) -> dict:
        return {"kind": "warmup_decay", **asdict(self)}


@dataclass(frozen=True)
class BatchScaling:
    """A reference setting tuned at ``base_batch_size`` and the rule (``scheme``) that
    carries it to other batch sizes. The batch is the global one: every stream of every
    process."""

    scheme: str = "legw"
    base_batch_size: int = 32
    base_lr: float = 3e-3
    base_warmup_epochs: float = 0.0

    def __post_init__(self) -> None:
        if self.scheme not in SCALINGS:
            raise ChargenError(f"--lr-scaling must be one of {', '.join(SCALINGS)}, not {self.scheme!r}")
        if not (isinstance(self.base_batch_size, int) and self.base_batch_size > 0):
            raise ChargenError(f"--base-batch-size must be a positive whole number, not {self.base_batch_size}")
        if not self.base_lr > 0:
            raise ChargenError(f"--base-lr must be positive, not {self.base_lr}")
        if not self.base_warmup_epochs >= 0:
            raise ChargenError(f"--base-warmup-epochs must be 0 or more, not {self.base_warmup_epochs}")

    def ratio(self, batch_size: int) -> float:
        """k = B / B0: any positive ratio, a whole multiple or not, above 1 or below."""
        if not (isinstance(batch_size, int) and batch_size > 0):
            raise ChargenError(f"the batch size must be a positive whole number, not {batch_size}")
        return batch_size / self.base_batch_size

    def peak_lr(self, batch_size: int) -> float:
        k = self.ratio(batch_size)
        factor = {"legw": math.sqrt(k), "linear": k, "none": 1.0}[self.scheme]
        return self.base_lr * factor

    def warmup_epochs(self, batch_size: int) -> float:
        k = self.ratio(batch_size)
        return self.base_warmup_epochs * (k if self.scheme == "legw" else 1.0)

    def schedule(
        self,
        batch_size: int,
        steps_per_epoch: int,
        total_steps: int,
        decay: str = "cosine",
        final_fraction: float = 0.1,
        max_warmup_steps: int | None = None,
    ) -> WarmupDecay:
        """The step-by-step schedule for a run at ``batch_size`` whose epoch is
        ``steps_per_epoch`` updates and whose plan is ``total_steps`` updates; the warmup
        is cut to ``max_warmup_steps`` if it would be longer."""
        if steps_per_epoch <= 0:
            raise ChargenError(f"an epoch must have at least one step, not {steps_per_epoch}")
        warmup = round(self.warmup_epochs(batch_size) * steps_per_epoch)
        if max_warmup_steps is not None:
            warmup = min(warmup, max_warmup_steps)
        return WarmupDecay(self.peak_lr(batch_size), warmup, total_steps, decay, final_fraction)

    def describe(self, batch_size: int, steps_per_epoch: int, schedule: WarmupDecay) -> dict:
        """What the rule made of the reference, for config.json and the start-up line."""
        total = schedule.total_steps
        return {
            **asdict(self),
            "batch_size": batch_size,
            "k": self.ratio(batch_size),
            "peak_lr": schedule.peak_lr,
            "warmup_steps": schedule.warmup_steps,
            "warmup_epochs": schedule.warmup_steps / steps_per_epoch,
            "decay": schedule.decay,
            "decay_steps": max(0, total - schedule.warmup_steps),
            "decay_epochs": max(0, total - schedule.warmup_steps) / steps_per_epoch,
            "final_lr": schedule.lr_at(total),
            "total_steps": total,
        }


def format_schedule(info: dict) -> str:
    """One line for the start of training."""
    return (
        f"lr: {info['scheme']} scaling of {info['base_lr']:g} at batch {info['base_batch_size']} "
        f"to batch {info['batch_size']} (k={info['k']:g}): peak {info['peak_lr']:.3g}, warmup "
        f"{info['warmup_steps']:,} steps ({info['warmup_epochs']:.3g} epochs), {info['decay']} decay over "
        f"{info['decay_steps']:,} steps ({info['decay_epochs']:.3g} epochs) to {info['final_lr']:.3g}"
    )
