"""Fault seams: named points where the code asks whether a fault is to be injected there, so
tests (and the crash-safety harness) can make a loss NaN at a step, a write fail, the
process die mid-write, or the machine slow down, without patching torch or os or counting
calls into them.

    with faults.injected(Faults(loss=lambda step, loss: loss * float("nan") if step == 12 else loss)):
        train(...)

Outside ``injected`` every point is a no-op.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Faults:
    # (the step about to be taken, counted from 1; its training loss) -> the loss to use
    loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    # (the file being written, the stage: "write" before the data goes out, "rename" once
    # the temp file is complete and synced): may raise OSError, or end the process
    write: Callable[[Path, str], None] | None = None
    # (what just ran: "step" or "validation", the seconds it took): may sleep, as a machine
    # slowing down under the run would
    slow: Callable[[str, float], None] | None = None


NONE = Faults()
_active = NONE


@contextlib.contextmanager
def injected(faults: Faults) -> Iterator[None]:
    global _active
    previous, _active = _active, faults
    try:
        yield
    finally:
        _active = previous


def install(faults: Faults) -> None:
    """For a process that should run with ``faults`` to its end (a harness's child)."""
    global _active
    _active = faults


def loss(step: int, value: torch.Tensor) -> torch.Tensor:
    return value if _active.loss is None else _active.loss(step, value)


def slow(what: str, since: float) -> None:
    """``what`` ran from ``since`` (time.perf_counter) until now."""
    if _active.slow is not None:
        _active.slow(what, time.perf_counter() - since)


def write(path: Path, stage: str) -> None:
    if _active.write is not None:
        _active.write(path, stage)
