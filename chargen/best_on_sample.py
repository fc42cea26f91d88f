"""The best weights by a timed run's validation sample.

A timed run whose whole validation text is too dear to score at every validation scores a
fixed sample of it (chargen.budget), and a sample's figure does not compare with the whole
text's, so only the final, whole validation competed for the best weights: a long run whose
validation loss turned up late kept its last weights, worse than those it had passed (prose
for 30 minutes with 1x512: 1.3885 on the sample at step 9,752, 1.4088 at step 22,752, its
last weights 1.4309 on the whole text). The sample's figures compare with each other (the
same characters every time), so the weights of the best of them are kept, in memory; when the
curve has turned up by the end, the trainer scores them on the whole text as well, and the
better of them and the last weights is the run's best.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class BestOnSample:
    loss: float = math.inf  # the best sampled validation loss of this invocation
    step: int = -1  # ... its step
    weights: dict[str, torch.Tensor] | None = None  # ... its weights, on the CPU
    last_loss: float = math.inf  # the latest sampled validation loss

    def seen(self, loss: float, step: int, model: nn.Module) -> bool:
        """A validation on the run's sample: kept, with a copy of the weights, if the best.
        Whether the curve has turned up (``turned_up``)."""
        self.last_loss = loss
        if loss < self.loss:
            self.loss, self.step = loss, step
            self.weights = {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}
        return self.turned_up

    @property
    def turned_up(self) -> bool:
        """Whether the latest sampled validation did worse than the best: then the best's
        weights are worth scoring on the whole text at the end."""
        return self.weights is not None and self.last_loss > self.loss

    @contextlib.contextmanager
    def loaded(self, model: nn.Module) -> Iterator[None]:
        """The best weights in ``model`` within the block, its own after it."""
        assert self.weights is not None
        own = {name: value.detach().clone() for name, value in model.state_dict().items()}
        model.load_state_dict(self.weights)
        try:
            yield
        finally:
            model.load_state_dict(own)
