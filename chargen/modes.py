"""The two ways of reading a corpus, and what differs between them outside the data layer
(which has ``StreamFeed`` and ``LinesFeed`` for the rest): one place to look instead of
``if mode == "lines"`` in the trainer, the API, the CLI and the app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ModeName = Literal["stream", "lines"]
StopReason = Literal["done", "time", "interrupted", "patience"]  # the plan ran out; --max-time; Ctrl-C or Stop;
# --patience validations without a better loss


@dataclass(frozen=True)
class Mode:
    name: ModeName
    items: bool  # every sample is an item, from <bos> to its <eos>; a prime is how each starts
    samples_shown: int  # samples printed at each validation
    default_samples: int  # `chargen sample` without --num-samples
    resume_layout: tuple[str, ...]  # training settings a resume must keep, or the batches would not line up
    description: str  # for people: what a sample is
    prime_hint: str  # for people: what the prime box is for


STREAM = Mode("stream", items=False, samples_shown=1, default_samples=1,
              resume_layout=("batch_size", "bptt", "variable_bptt"),
              description="one stream of text", prime_hint="text to continue")
LINES = Mode("lines", items=True, samples_shown=8, default_samples=10,
             resume_layout=("batch_size", "bucket_factor"),
             description="lines (one item per line)", prime_hint="prefix every item starts with (may be empty)")
MODES = {mode.name: mode for mode in (STREAM, LINES)}


def mode_of(name: str) -> Mode:
    """The mode a run folder or corpus names (a run from before modes is a stream)."""
    return MODES.get(name or "stream", STREAM)
