"""The web app's one training job: a run in a background thread, its events queued for the
page that started it, stopped only from that page.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .config import TrainConfig
from .corpus import load_corpus, min_train_chars
from .errors import ChargenError
from .evaluate import bpc
from .model import ModelConfig
from .train import TrainResult, train

STOPPED = {"done": "finished", "time": "reached its time budget", "interrupted": "stopped",
           "patience": "stopped early (no better validation loss)"}


@dataclass
class TrainingView:
    """What the page that started a training shows of it: a status line, the training curve
    (seconds, bits/char: the mean of each log window's steps, a point every few steps, where
    a short run validates only at its end), the last samples with their validation figure;
    ``finished`` once the run has ended."""

    status: str
    curve: list[tuple[float, float]] = field(default_factory=list)
    samples: str = ""
    finished: bool = False


class TrainingJob:
    """The one training run the server allows at a time, in a background thread; its
    events are queued for the page that started it to show."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.events: queue.Queue = queue.Queue()
        self.owner: str | None = None
        self.run_dir: Path | None = None  # the run training now, or last
        self.ends_at = 0.0
        self.result: TrainResult | None = None
        self.error: str | None = None

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, owner: str, text_path: Path, run_dir: Path, model_config: ModelConfig | None,
              config: TrainConfig, mode: str = "auto", uploaded: bool = False) -> str:
        """Starts the run; its mode ("stream" or "lines"), as asked or as the text decided.
        The text is read before it returns; an ``uploaded`` one is recorded by its file name
        and hash alone (its server path is nobody's business)."""
        with self._lock:
            if self.busy():
                left = max(0, round(self.ends_at - time.time()))
                raise ChargenError(f"a training job is already running on this server (about {left} s left); "
                                   "one runs at a time, so try again when it ends")
            corpus = load_corpus(text_path, mode=mode)
            need = min_train_chars(config.batch_size, config.bptt)
            if corpus.train_ids is not None and len(corpus.train_ids) < need:  # (said in the app's words, not flags)
                raise ChargenError(f"{text_path.name} has {len(corpus.train_ids):,} characters to train on; the app "
                                   f"trains on {need:,} at least: upload a longer text")
            if uploaded:
                corpus.source["path"] = text_path.name
            self.stop, self.events, self.owner = threading.Event(), queue.Queue(), owner
            self.result, self.error = None, None
            self.ends_at = time.time() + (config.max_time or 0)
            self.run_dir = run_dir
            self.thread = threading.Thread(target=self._run, args=(corpus, run_dir, model_config, config),
                                           daemon=True, name="chargen-train")
            self.thread.start()
            return corpus.mode

    def _run(self, corpus, run_dir, model_config, config) -> None:
        try:
            # (force: the folder is new, or a run of this app's that died before its first checkpoint)
            self.result = train(corpus, run_dir, model_config, config, on_event=self.events.put, stop=self.stop,
                                force=True)
        except ChargenError as e:
            self.error = str(e)
        except Exception as e:  # shown on the page; the server keeps serving
            self.error = f"training failed: {type(e).__name__}: {e}"

    def request_stop(self, owner: str) -> str:
        if not self.busy():
            return "No training is running."
        if owner != self.owner:
            return "The training running now was started from another page; only that page can stop it."
        self.stop.set()
        return "Stopping after this step; the checkpoint is being saved."

    def watch(self, name: str, view: TrainingView, poll: float) -> Iterator[TrainingView]:
        """``view`` updated from the run's events, each time something new came in, and
        once more, finished, when the run has ended."""
        started, last_train, last_val = time.time(), None, None
        while True:
            finished, changed = not self.busy(), False
            while not self.events.empty():
                event, changed = self.events.get(), True
                if event["event"] == "train":
                    last_train = event
                    view.curve.append((event["elapsed"], event["bpc"]))
                elif event["event"] == "val":
                    last_val = event
                elif event["event"] == "sample":
                    view.samples = samples_shown(event, last_val)
            if last_train is not None and changed:
                view.status = progress_line(name, last_train, time.time() - started)
            if finished:
                break
            if changed:
                yield view
            time.sleep(poll)
        view.status, view.finished = self.outcome(name), True
        yield view

    def outcome(self, name: str) -> str:
        if self.error or self.result is None:
            return f"**{name}**: {self.error or 'training ended without a result'}"
        best, last, model = self.result.best_val_loss, self.result.last_val_loss, self.result.model.config
        scored = f"best validation {bpc(best):.3f} bits/char" if best is not None else \
            "not validated yet" if last is None else f"validation {bpc(last):.3f} bits/char on a sample"
        return (f"**{name}** ({model.layers}x{model.hidden}, dropout {model.dropout:g}) "
                f"{STOPPED[self.result.stopped]} at step {self.result.step:,}; {scored}. "
                "It is in the Generate tab's list.")


def samples_shown(sample: dict, val: dict | None) -> str:
    scored = f" (validation {val['val_bpc']:.3f} bits/char)" if val and val["step"] == sample["step"] else ""
    return f"step {sample['step']:,}{scored}:\n" + "\n".join(sample["texts"])


def progress_line(name: str, event: dict, wall: float) -> str:
    step, total = event["step"], event.get("total_steps", event["step"])
    figures = f"loss {event['loss']:.3f} · {event['bpc']:.3f} bits/char · {event['chars_per_s']:,} chars/s"
    if total is None:  # (a timed run's first steps: its plan is fitted to the time after them)
        return f"**{name}**: step {step:,} · {figures} · fitting the plan to the time"
    eta = wall / step * (total - step) if step else 0
    return f"**{name}**: step {step:,} of {max(total, 1):,} · {figures} · about {eta:.0f} s left"
