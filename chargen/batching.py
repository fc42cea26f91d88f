"""One sampling loop per model for every live generation: continuous batching, as LLM
servers do it, for a character LSTM.

A ``Generation`` is a ``Sampler`` (its rows' LSTM state, its random stream, its texts) with
its options and length. It joins the loop at the next tick and is stepped with every other
generation of the model as one batch: one LeanStep for all rows, then each row's draw by
``pick`` with its own options from its own sampler's random stream. It leaves once it has
its length, its items have all ended, or it is cancelled (Stop, or the browser went
away); its sampler then holds its state, so a Continue joins again from there.

Because the step computes each row the same way whatever the batch (chargen.model: oneDNN's
products on packed weights, the cell on whole tiles) and each row draws from its own
stream, a text is the same, character for character, as the text the same seed gives
alone, whatever else is in the batch (tests/test_batching.py; on a CPU, where the app
samples: on a GPU the kernels may differ by batch size, unchecked). A long text costs its
row of the batch and nothing more: a new request's first character waits for one tick, not
for the others to finish. The rows are joined into one batch (``Rows``) once and kept
from tick to tick until a generation joins or leaves.

Bounds: at most ``max_rows`` rows are stepped; beyond them generations wait, first come
first served, up to ``max_waiting``; beyond that they are refused with a message. The loop
runs on a thread of its own, which sleeps while there is nothing to do and ends after
``idle_seconds`` of it (the next request starts it again).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

import torch

from .errors import ChargenError
from .model import LeanStep
from .sample import Sampler, SamplingOptions, pick_prepared, prepare, row_options

LOOP_THREADS = max(1, torch.get_num_threads() // 2)  # intra-op threads of a sampling loop (see _run)
NOTIFY_EVERY = 0.05  # seconds between a generation's updates (the first and the last are at once)
# ...and fewer as more texts share the loop: each update costs the web server a message, and
# its thread takes the GIL the loop needs, so a loop's updates are held to about this many a second.
UPDATES_PER_SECOND = 100


@dataclass(eq=False)
class Generation:
    """``sampler`` drawing ``options.length`` more steps in a loop; ``version`` counts its
    updates, for a consumer to wait on (``wait`` in a thread, ``changed`` in asyncio)."""

    sampler: Sampler
    options: SamplingOptions
    steps: int = 0  # taken in this generation
    status: str = "waiting"  # waiting, running, finished, cancelled or failed
    error: str | None = None
    version: int = 0
    cancel_requested: bool = False
    _notified: float = 0.0
    per_row: tuple = field(init=False, repr=False)  # the options as ``pick`` takes them
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _futures: list = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.per_row = row_options(self.options, self.rows, self.sampler.device)

    @property
    def rows(self) -> int:
        return self.sampler.num_samples

    @property
    def done(self) -> bool:
        return self.status in ("finished", "cancelled", "failed")

    @property
    def complete(self) -> bool:
        return self.steps >= self.options.length or all(self.sampler.ended)

    def cancel(self) -> None:
        """Leave the loop at its next tick (the sampler keeps the state reached)."""
        self.cancel_requested = True

    def wait_done(self, timeout: float) -> bool:
        """Block until the generation has left the loop (or ``timeout``); whether it has."""
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)

    def wait(self, seen: int, timeout: float | None = None) -> int:
        """Block until the version is past ``seen`` (or ``timeout``); the version now."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout)
            return self.version

    async def changed(self, seen: int) -> int:
        """``wait`` for asyncio: no thread is held while it waits."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            if self.version != seen:
                return self.version
            self._futures.append((loop, future))
        await future
        return self.version

    def notify(self) -> None:
        with self._cond:
            self.version += 1
            self._notified = time.perf_counter()
            self._cond.notify_all()
            futures, self._futures = self._futures, []
        for loop, future in futures:
            with contextlib.suppress(RuntimeError):  # (that event loop has closed: nobody waits)
                loop.call_soon_threadsafe(_resolve, future)

    def end(self, status: str, error: str | None = None) -> None:
        self.status, self.error = status, error
        self.notify()


LOOPS: weakref.WeakSet[SharedLoop] = weakref.WeakSet()


@atexit.register
def close_loops() -> None:
    for loop in list(LOOPS):
        loop.close()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Rows:
    """The running generations' rows joined into one batch: pending ids, LSTM state, options
    and a buffer for the random draws. Kept from tick to tick while no generation joins or
    leaves, so a tick does not join and split every row's state again; ``write_back`` gives
    each sampler its rows before the batch changes."""

    def __init__(self, members: list[Generation]) -> None:
        self.members = members
        samplers = [g.sampler for g in members]
        ends = list(itertools.accumulate(g.rows for g in members))
        self.spans = list(zip([0, *ends[:-1]], ends, strict=True))
        vocab = samplers[0].vocab_size
        if len(samplers) == 1:  # (alone: nothing to join)
            self.pending, self.state = samplers[0].pending, samplers[0].state
            self.options = prepare(*members[0].per_row, vocab)
        else:
            self.pending = torch.cat([s.pending for s in samplers])
            self.state = tuple(torch.cat(parts, 1) for parts in zip(*(s.state for s in samplers), strict=True))
            self.options = prepare(*(torch.cat(parts) for parts in zip(*(g.per_row for g in members), strict=True)),
                                   vocab)
        self.race = torch.empty(ends[-1], vocab, dtype=samplers[0].race_dtype, device=samplers[0].device)

    def write_back(self) -> None:
        for g, (start, end) in zip(self.members, self.spans, strict=True):
            g.sampler.pending = self.pending[start:end]
            g.sampler.state = tuple(part[:, start:end] for part in self.state)


class SharedLoop:
    """The loop of one model: ``submit`` a generation; it is stepped with all the others."""

    def __init__(self, step: LeanStep, max_rows: int = 256, max_waiting: int = 256,
                 idle_seconds: float = 30.0) -> None:
        self.step = step
        self.max_rows, self.max_waiting, self.idle_seconds = max_rows, max_waiting, idle_seconds
        self._lock = threading.Condition()  # (over an RLock: _leave takes it inside _admit)
        self._waiting: deque[Generation] = deque()
        self._running: list[Generation] = []
        self._rows: Rows | None = None  # the batch of the last tick (the loop's thread only)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.ticks = 0
        LOOPS.add(self)

    @property
    def rows(self) -> int:
        return sum(g.rows for g in self._running)

    def submit(self, generation: Generation) -> Generation:
        """Queue ``generation`` to join at the next tick; a ChargenError if the loop is full.
        Its prime is fed here, on the caller's thread, not on the loop's time."""
        if generation.rows > self.max_rows:
            raise ChargenError(f"{generation.rows} samples at once is more than this server steps "
                               f"({self.max_rows}); ask for fewer")
        sampler = generation.sampler
        sampler.start()
        if len(sampler.state) == 2:  # (a sampler on nn.LSTM's path: the loop's step carries more)
            sampler.state = self.step.begin(sampler.state)
        with self._lock:
            if self._closed:
                raise ChargenError("The server is shutting down; try again in a minute.")
            if self._beyond_rows() >= self.max_waiting and not self._fits(generation):
                raise ChargenError(f"The server is busy: {len(self._running)} texts are being written and "
                                   f"{self._beyond_rows()} are waiting. Try again in a minute.")
            self._waiting.append(generation)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="chargen-sampling", daemon=True)
                self._thread.start()
            self._lock.notify()
        return generation

    def _beyond_rows(self) -> int:
        """Queued generations that will not be admitted at the next tick (rows are full)."""
        rows = self.rows
        for i, g in enumerate(self._waiting):
            if rows + g.rows > self.max_rows:
                return len(self._waiting) - i
            rows += g.rows
        return 0

    def _fits(self, generation: Generation) -> bool:
        """Whether ``generation`` would join at the next tick if queued now."""
        return self._beyond_rows() == 0 and self.rows + sum(g.rows for g in self._waiting) + generation.rows \
            <= self.max_rows

    def close(self, timeout: float = 2.0) -> None:
        """Stop every generation and the loop's thread (at exit: a thread still inside torch
        when the interpreter ends would abort the process)."""
        with self._lock:
            self._closed = True
            for g in self._running + list(self._waiting):
                g.cancel()
            thread = self._thread
            self._lock.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        # Torch's thread count is per thread, and a new thread's team of intra-op threads
        # costs more than it gives at sampling's small products: on 2 cores one such thread
        # drew 1 row twice as fast with one intra-op thread as with two, 8 rows too. The
        # loop takes half the cores; the web server and the clients' streams keep the rest.
        torch.set_num_threads(LOOP_THREADS)
        try:
            while (running := self._admit()) is not None:
                try:
                    self._tick(running)
                except Exception as e:  # (one bad step fails its generations, not the server)
                    self._leave(running, "failed", f"generation failed: {type(e).__name__}: {e}")
        except BaseException as e:  # the loop itself broke: nothing may wait on it for ever
            with self._lock:
                self._thread = None
                stranded = self._running + list(self._waiting)
                self._waiting.clear()
            self._leave(stranded, "failed", f"the sampling loop stopped: {type(e).__name__}: {e}")
            raise

    def _leave(self, generations: list[Generation], status: str, error: str | None = None) -> None:
        """Take ``generations`` out of the loop. Their samplers keep copies of their rows'
        state (not views of the batch's, which would keep the whole batch in memory)."""
        with self._lock:
            if self._rows is not None:  # (every sampler gets its rows before any leaves)
                self._rows.write_back()
                self._rows = None
            for g in generations:
                if g in self._running:
                    self._running.remove(g)
                state = g.sampler.state
                if state is not None:
                    g.sampler.state = tuple(part.clone() for part in state)
                g.end(status, error)

    def _admit(self) -> list[Generation] | None:
        """This tick's generations: the cancelled and the complete leave, the waiting join
        while rows allow. None (and the thread ends) after idle_seconds with nothing."""
        with self._lock:
            while True:
                for g in [g for g in self._running if g.cancel_requested or g.complete]:
                    self._leave([g], "finished" if g.complete else "cancelled")
                for g in [g for g in self._waiting if g.cancel_requested or g.complete]:
                    self._waiting.remove(g)  # (one with nothing to draw takes no step, as alone)
                    self._leave([g], "finished" if g.complete else "cancelled")
                rows = self.rows
                while self._waiting and rows + self._waiting[0].rows <= self.max_rows:
                    g = self._waiting.popleft()
                    g.status, rows = "running", rows + g.rows
                    self._running.append(g)
                if self._running:
                    return list(self._running)
                if self._closed or (not self._lock.wait(self.idle_seconds) and not self._waiting):
                    self._thread = None
                    return None

    @torch.inference_mode()
    def _tick(self, running: list[Generation]) -> None:
        rows = self._rows
        if rows is None or rows.members != running:  # a generation joined (one that left wrote back)
            if rows is not None:
                rows.write_back()
            rows = self._rows = Rows(running)
        logits, rows.state = self.step(rows.pending, rows.state)
        logits = logits.index_fill(-1, running[0].sampler.banned, float("-inf"))  # (one model: one mode)
        for g, (start, end) in zip(running, rows.spans, strict=True):
            g.sampler.race_into(rows.race[start:end])
        rows.pending = pick_prepared(logits, rows.options, rows.race)
        drawn = rows.pending.tolist()
        now = time.perf_counter()
        every = max(NOTIFY_EVERY, len(running) / UPDATES_PER_SECOND)
        for g, (start, end) in zip(running, rows.spans, strict=True):
            g.sampler.append(drawn[start:end])
            g.steps += 1
            if g.steps == 1 or g.complete or now - g._notified >= every:
                g.notify()
        self.ticks += 1
