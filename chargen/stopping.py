"""When the training loop stops before its plan, and when it saves by the clock: Ctrl-C,
SIGTERM or the app's Stop button (``StopSignals``), those or ``--max-time`` agreed across
ranks (``StopPolicy``), and ``--save-every`` (``SaveClock``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import torch

from .budget import TimeBudget
from .distributed import Ranks
from .modes import StopReason


class StopSignals:
    """SIGINT and SIGTERM (or ``stop``, set from another thread: the app's Stop button) ask
    the loop to stop after the current step and save, instead of killing it mid-write.
    (Only the main thread can install signal handlers.)"""

    def __init__(self, log: Callable[[str], None], stop: threading.Event | None = None) -> None:
        self._stop = stop or threading.Event()
        self._log = log
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self._stop.is_set()

    def _handle(self, signum: int, frame: object) -> None:
        if not self.requested:
            self._log(f"{signal.Signals(signum).name}: stopping after this step and saving a checkpoint")
        self._stop.set()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class StopPolicy:
    """When the loop ends before its plan: Ctrl-C or SIGTERM, the app's stop event, or
    --max-time. Distributed, the ranks agree at log steps only (an agreement is a sync)."""

    def __init__(self, signals: StopSignals, budget: TimeBudget, ranks: Ranks, device: torch.device) -> None:
        self.signals, self.budget, self.ranks, self.device = signals, budget, ranks, device
        (self.asked,) = ranks.any((signals.requested,), device)
        self.out_of_time = False

    def should_stop(self, at_log_step: bool) -> bool:
        out_of_time = self.budget.out_of_time()
        if self.ranks.active and not at_log_step:
            return False
        self.out_of_time, self.asked = self.ranks.any((out_of_time, self.signals.requested), self.device)
        return self.out_of_time

    @property
    def reason(self) -> StopReason:
        return "interrupted" if self.asked else "time" if self.out_of_time else "done"


class SaveClock:
    """--save-every: whether its minutes have passed since the last checkpoint (on any rank:
    they all save together)."""

    def __init__(self, minutes: float | None, ranks: Ranks, device: torch.device) -> None:
        self.seconds, self.ranks, self.device = None if minutes is None else 60 * minutes, ranks, device
        self.last = time.perf_counter()

    def saved(self) -> None:
        self.last = time.perf_counter()

    def due(self) -> bool:
        if self.seconds is None:
            return False
        return self.ranks.any((time.perf_counter() - self.last >= self.seconds,), self.device)[0]
