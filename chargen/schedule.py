"""Learning-rate schedules as pure functions of the step, so a resumed run replays them
exactly from the step number alone. The trainer asks only ``lr_at(step)``; any object
with that method (and ``describe``) can stand in, which is how LEGW will plug in."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import ChargenError

DECAYS = ("cosine", "linear", "none")


@dataclass
class WarmupDecay:
    """Linear warmup from 0 to ``peak_lr`` over ``warmup_steps``, then a decay to
    ``final_fraction * peak_lr`` at ``total_steps`` (cosine, linear, or none)."""

    peak_lr: float
    warmup_steps: int
    total_steps: int
    decay: str = "cosine"
    final_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.peak_lr <= 0:
            raise ChargenError(f"--lr must be positive, not {self.peak_lr}")
        if self.warmup_steps < 0:
            raise ChargenError(f"--warmup-steps must be 0 or more, not {self.warmup_steps}")
        if self.decay not in DECAYS:
            raise ChargenError(f"decay must be one of {', '.join(DECAYS)}, not {self.decay!r}")
        if not 0.0 <= self.final_fraction <= 1.0:
            raise ChargenError(f"final lr fraction must be in [0, 1], not {self.final_fraction}")

    def lr_at(self, step: int) -> float:
        """The learning rate for update number ``step`` (counting from 0)."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        elif self.decay == "linear":
            shape = 1.0 - progress
        else:
            shape = 1.0
        floor = self.final_fraction * self.peak_lr
        return floor + (self.peak_lr - floor) * shape if self.decay != "none" else self.peak_lr

    def describe(self) -> dict:
        return {"kind": "warmup_decay", **asdict(self)}
