"""The training loop: batches from a feed (contiguous streams with truncated BPTT, the LSTM
state carried and detached from one chunk to the next; or length-bucketed items, each from
a zero state), AdamW, clipping, a learning-rate schedule scaled to the batch, periodic
validation, and checkpoints that make ``resume`` continue exactly where training stopped.
Everything before the first step is ``chargen.prepare``'s.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import board, checkpoint, faults
from .best_on_sample import BestOnSample
from .budget import FINAL_SLACK, NONE_FITS, TimeBudget, ValidationClock, ValidationCost
from .checks import MAX_SEED
from .config import TrainConfig
from .corpus import Corpus
from .distributed import SINGLE, Ranks
from .errors import ChargenError
from .evaluate import bpc
from .feeds import Batch
from .lines import IGNORE
from .model import CharLSTM, ModelConfig, State, detach_state, zero_streams
from .modes import StopReason
from .prepare import PreparedRun, planned_steps, prepare_run, record_now
from .record import write_record
from .sample import DEFAULTS as SAMPLING
from .sample import collect, sample_text
from .stopping import SaveClock, StopPolicy, StopSignals
from .storage import MetricsLog, save_tensors
from .timed_plan import TimedPlan


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    total_steps: int
    epoch: float
    best_val_loss: float | None
    last_val_loss: float | None
    stopped: StopReason
    history: list[dict] = field(default_factory=list)
    model: CharLSTM | None = field(default=None, repr=False)  # the trained model, latest weights


# --- the loop ----------------------------------------------------------------------------
def train(
    corpus: Corpus,
    run_dir: str | Path,
    model_config: ModelConfig | None = None,
    config: TrainConfig | None = None,
    *,
    resume: bool = False,
    resume_from: int | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
    progress_bar: bool = False,
    on_event: Callable[[dict], None] | None = None,
    stop: threading.Event | None = None,
    ranks: Ranks = SINGLE,
    started: float | None = None,
) -> TrainResult:
    """Train (or with ``resume``, continue) the run in ``run_dir`` on ``corpus``; with
    ``resume_from`` as well, from the resume point kept at that step (``config.keep``).

    ``on_event`` gets every metrics event as it is written (train, val) and the samples
    drawn at each validation (``{"event": "sample", "texts": [...]}``, not written);
    setting ``stop`` ends the run after the current step, with a checkpoint, like Ctrl-C.
    Under torchrun, ``ranks`` (``chargen.distributed.from_environment``) says which process
    this is: ``config.batch_size`` is the global batch, and only rank 0 writes or logs.
    A --max-time budget counts from ``started`` (a ``time.perf_counter()``; default: now):
    the CLI starts it before it reads the text, so that the budget is the command's."""
    if not ranks.main:  # one voice: rank 0 logs, shows progress and reports events
        log, progress_bar, on_event = None, False, None
    run = prepare_run(corpus, Path(run_dir), model_config, config or TrainConfig(), resume=resume,
                      resume_from=resume_from, force=force, log=log, ranks=ranks, started=started)
    return Trainer(run, log=log, progress_bar=progress_bar, on_event=on_event).fit(stop)


class LogWindow:
    """The losses and characters since the last log line, summed on the device (so the
    loop reads from it only at log steps)."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), device=device)
        self.steps = self.chars = 0
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, chars: int) -> None:
        self.loss_sum += loss.detach()
        self.steps += 1
        self.chars += chars

    def clear(self, now: float | None = None) -> None:
        self.loss_sum.zero_()
        self.steps = self.chars = 0
        if now is not None:
            self.start = now


class Trainer:
    """The loop of one prepared run (chargen.prepare): ``fit`` trains it. The pieces of a
    step are methods, in the order ``fit`` calls them; this object holds only what the loop
    changes (the clock, the log window, the progress bar, the events written)."""

    def __init__(self, run: PreparedRun, *, log: Callable[[str], None] | None = None, progress_bar: bool = False,
                 on_event: Callable[[dict], None] | None = None) -> None:
        self.run = run
        progress, config, main = run.state.progress, run.config, run.ranks.main
        self.log, self.on_event = log or (lambda message: None), on_event
        self.metrics = MetricsLog(run.run_dir / checkpoint.METRICS)
        self.board = board.Board(run.run_dir, progress.step if run.resumed else None) \
            if config.tensorboard and main else None
        self.history: list[dict] = []
        # (the first fit of the plan to --max-time comes before the first validation)
        self.budget = TimeBudget(config.max_time, progress, spent=time.perf_counter() - run.started,
                                 first_fit=min(TimeBudget.FIRST_FIT, config.eval_every), early_fit=not run.ranks.active)
        self.clock = ValidationClock.starting(progress.step, config.eval_every)  # (refitted with the plan)
        self.window, self.best_on_sample = LogWindow(run.device), BestOnSample()
        shown_total = planned_steps(progress)
        self.bar = tqdm(total=shown_total, initial=progress.step, unit="step", dynamic_ncols=True,
                        disable=not (progress_bar and main), file=sys.stderr,
                        mininterval=0.5 if sys.stderr.isatty() else 30)
        self.check_every_step = run.device.type == "cpu" and not run.ranks.active
        self.save_clock = SaveClock(run.config.save_every, run.ranks, run.device)
        samples = self.draw_samples if run.config.sample_chars and main else None
        self.timed = TimedPlan(run, self.budget, self.clock, self.bar, self.log, self.score, samples)

    def fit(self, stop: threading.Event | None = None) -> TrainResult:
        progress, config, feed, budget = self.run.state.progress, self.run.config, self.run.feed, self.budget
        self.window.clear(budget.resume_ticking())  # (the clock starts now, not when the trainer was made)
        self.run.model.train()
        saved_at, early = -1, None
        with StopSignals(self.log, stop) as signals, self.bar:
            policy = StopPolicy(signals, budget, self.run.ranks, self.run.device)
            while progress.step < progress.total_steps and not policy.asked:
                # the batch, and its learning rate
                batch = feed.next(progress, self.run.state.rng)
                self.run.state.carry = starting_state(batch, self.run.state.carry)
                lr = self.set_lr(batch)
                # forward; on one CPU process the check costs nothing, so a bad step is caught
                # before it is taken; on a GPU (no per-step sync) and across ranks, at the next log
                loss = self.forward(batch)
                if self.check_every_step and not torch.isfinite(loss):
                    self.recover("training loss")
                    continue
                # backward and update
                self.update(loss, batch)
                faults.slow("step", budget.last_tick)
                now = budget.tick(progress)
                self.window.add(loss, batch.targets)
                if config.max_time is not None and budget.fit_due(progress, now):
                    self.window.start += self.timed.fit()
                    self.run = self.timed.run  # (its regularisation may be refitted to the plan)
                # log
                at_end = progress.step == progress.total_steps
                if (progress.step % config.log_every == 0 or at_end) and not self.log_window(lr, now):
                    self.recover("training loss")
                    continue
                # validate and checkpoint
                if progress.step >= self.clock.next_at or at_end:
                    sample = self.timed.final_sample() if at_end else self.clock.plan.sample
                    if not self.validate_and_save(budget, now, sample):
                        self.recover("validation loss")
                        continue
                    saved_at = progress.step
                    if self.out_of_patience() and not at_end:
                        early = "patience"
                        break
                # checkpoint by the clock, at a log step: its window's loss was just found finite
                if progress.step % config.log_every == 0 and saved_at != progress.step and self.save_clock.due():
                    self.save()
                    saved_at = progress.step
                    self.log(f"checkpoint at step {progress.step:,} (--save-every {config.save_every:g} min)")
                # stop
                if policy.should_stop(at_log_step=progress.step % config.log_every == 0):
                    break
        return self.finish(early or policy.reason, saved_at)

    def out_of_patience(self) -> bool:
        patience = self.run.config.patience
        return patience is not None and self.run.state.progress.since_best >= patience

    def set_lr(self, batch: Batch) -> float:
        # A shorter chunk (variable BPTT, or the last of an epoch) gets a proportionally
        # smaller step, as in AWD-LSTM: its mean loss rests on fewer characters.
        state = self.run.state
        lr = self.run.schedule.lr_at(state.progress.step) * batch.lr_scale * state.progress.lr_factor
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def forward(self, batch: Batch) -> torch.Tensor:
        run, dtype = self.run, self.run.autocast_dtype
        with torch.autocast(run.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, run.state.carry = run.net(batch.x, run.state.carry)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.y.flatten(), ignore_index=IGNORE)
        if batch.rank_share != 1.0:
            loss = loss * batch.rank_share
        return faults.loss(run.state.progress.step + 1, loss)

    def update(self, loss: torch.Tensor, batch: Batch) -> None:
        state = self.run.state
        state.optimizer.zero_grad(set_to_none=True)
        state.scaler.scale(loss * batch.loss_weight if batch.loss_weight != 1.0 else loss).backward()
        state.scaler.unscale_(state.optimizer)  # (each of these three is a no-op or plain call unless fp16)
        torch.nn.utils.clip_grad_norm_(self.run.model.parameters(), self.run.config.clip)
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.carry = detach_state(state.carry) if self.run.feed.carries_state else None
        state.progress.step += 1
        state.progress.chars_seen += batch.targets
        self.bar.update(1)

    def log_window(self, lr: float, now: float) -> bool:
        """The log line of the window; False when its mean loss is not finite."""
        window, ranks = self.window, self.run.ranks
        # The loop's only read from the device (and, distributed, its only sum of losses).
        mean_loss = (ranks.sum(window.loss_sum) / (window.steps * ranks.world)).item()
        if not math.isfinite(mean_loss):
            return False
        chars_per_s = window.chars / max(1e-9, now - window.start)
        self.record({"event": "train", "total_steps": planned_steps(self.run.state.progress), "loss": mean_loss,
                     "bpc": bpc(mean_loss), "lr": lr, "chars_per_s": round(chars_per_s),
                     "elapsed": round(self.run.state.progress.train_seconds, 2)})
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", bpc=f"{bpc(mean_loss):.3f}", chars_s=f"{chars_per_s:,.0f}",
                             lr=f"{lr:.2e}")
        window.clear(now)
        return True

    def validate_and_save(self, budget: TimeBudget, now: float, sample: int | None) -> bool:
        """A validation (on ``sample`` targets, None: the whole text; NONE_FITS: none) and a
        checkpoint; False, with nothing saved, when the validation loss is not finite."""
        if sample != NONE_FITS and not math.isfinite(self.validate(sample)):
            return False
        self.save()
        progress = self.run.state.progress
        self.clock.validated_at = progress.step
        self.clock.next_at = self.clock.validated_at + self.clock.plan.every
        scoring, scored = self.clock.scoring
        if sample != NONE_FITS:
            budget.measured(ValidationCost(scoring / max(1, scored), time.perf_counter() - now - scoring), progress)
        if self.run.config.max_time is not None and progress.step < progress.total_steps:
            self.timed.fit()
        self.window.start = budget.resume_ticking()  # validation is not training time
        return True

    def finish(self, stopped: StopReason, saved_at: int) -> TrainResult:
        progress = self.run.state.progress
        if stopped == "time" and progress.step not in (self.clock.whole_at, self.clock.final_at):
            if (sample := self.timed.final_sample()) != NONE_FITS:
                self.validate(sample)
            saved_at = -1  # (the summary in config.json follows)
        saved_at = -1 if rescore_best_on_sample(self) else saved_at
        if saved_at != progress.step:
            self.save()
        best = self.figures()
        # (a run stopped before its plan was fitted to --max-time has no total worth showing)
        of = "" if planned_steps(progress) is None else f" of {progress.total_steps:,}"
        max_time, val_seconds = self.run.config.max_time, self.budget.val_seconds
        spent = "" if max_time is None else f"; validation took {val_seconds:.1f} s ({val_seconds / max_time:.1%})"
        if stopped == "patience":
            at = "" if progress.best_step is None else f" at step {progress.best_step:,}"  # (older runs lack it)
            self.log(f"stopped early at step {progress.step:,}{of}: no better validation loss "
                     f"in {progress.since_best} validations; {best}{at}, "
                     f"kept in {self.run.run_dir / checkpoint.BEST} (what sample, eval and export use){spent}")
        else:
            verb = "finished" if stopped == "done" else f"stopped ({stopped})"
            self.log(f"{verb} at step {progress.step:,}{of}; {best}{spent}; "
                     f"checkpoint in {self.run.run_dir}" + ("" if stopped == "done" else "; continue with --resume"))
        if self.board is not None:
            self.board.close()
        return TrainResult(self.run.run_dir, progress.step, progress.total_steps, self.epoch(), progress.best_val_loss,
                           progress.last_val_loss, stopped, self.history, self.run.model.eval())

    def figures(self) -> str:
        """The closing line's figures: the best validation, and a final one on a sample."""
        best_loss, step = self.run.state.progress.best_val_loss, self.run.state.progress.step
        best = "not validated yet" if best_loss is None else f"best val bpc {bpc(best_loss):.4f}"
        last = next((e for e in reversed(self.history) if e["event"] == "val"), None)
        if last is None or last["whole"] or last["step"] != step:
            return best
        sampled = f"val bpc {last['val_bpc']:.4f} at the end on a sample of {last['chars']:,} characters"
        return sampled if best_loss is None else f"{best}; {sampled}"

    # --- validation, checkpoints, recovery ----------------------------------------------
    def epoch(self) -> float:
        return self.run.state.progress.epoch + self.run.feed.epoch_fraction(self.run.state.progress.position)

    def record(self, event: dict) -> None:
        event = {"event": event.pop("event"), "step": self.run.state.progress.step,
                 "epoch": round(self.epoch(), 4)} | event
        if self.run.ranks.main:
            self.metrics.write(event)
        if self.board is not None:
            self.board.event(event)
        self.history.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def write_config(self) -> None:
        if self.run.ranks.main:
            write_record(self.run.run_dir, record_now(self.run))

    def score(self, sample: int | None) -> tuple[float, int]:
        """The validation loss on the whole text or a sample, and the targets scored."""
        start = time.perf_counter()
        scored = self.run.feed.evaluate(self.run.model, sample)
        faults.slow("validation", start)
        return scored

    def validate(self, sample: int | None = None) -> float:
        """The validation loss, on the whole text or (``sample``) on a fixed part of it. Only
        the whole text's figure competes for the best weights."""
        progress, start = self.run.state.progress, time.perf_counter()
        val_loss, scored = self.score(sample)
        self.clock.scoring = (time.perf_counter() - start, scored)
        if not math.isfinite(val_loss):
            return val_loss  # the caller goes back to the last checkpoint; nothing is saved
        progress.last_val_loss, whole = val_loss, sample is None
        is_best = whole and keep_if_best(self.run, val_loss, progress.step, self.run.model.state_dict())
        if whole:
            self.clock.whole_at = progress.step
            progress.since_best = 0 if is_best else progress.since_best + 1
        elif sample == self.clock.plan.sample:  # (the run's own sample, not a final one sized to the time)
            self.timed.rescore = self.best_on_sample.seen(val_loss, progress.step, self.run.model)
        self.record({"event": "val", "val_loss": val_loss, "val_bpc": bpc(val_loss), "best": is_best,
                     "whole": whole, "chars": scored, "elapsed": round(progress.train_seconds, 2)})
        part = "" if whole else f" on {scored:,} of its {self.run.feed.val_targets:,} chars"
        self.log(f"step {progress.step:,}  epoch {self.epoch():.2f}  val loss {val_loss:.4f}  "
                 f"val bpc {bpc(val_loss):.4f}{part}{'  (best)' if is_best else ''}")
        if self.run.config.sample_chars and self.run.ranks.main:
            self.show_samples()
        self.run.model.train()
        count_validation(self, start)
        return val_loss

    def draw_samples(self) -> list[str]:
        """Lines mode: a few items; a stream: one passage."""
        run, step = self.run, self.run.state.progress.step
        n = run.mode.samples_shown
        pieces = sample_text(run.model, run.tokenizer, run.default_prime, run.config.sample_chars, num_samples=n,
                             temperature=SAMPLING.temperature, seed=(run.config.seed + step) % (MAX_SEED + 1),
                             items=run.mode.items)
        texts = collect(pieces, n)
        self.run.model.train()
        return texts

    def show_samples(self) -> None:
        run, step, texts = self.run, self.run.state.progress.step, self.draw_samples()
        if run.mode.items:  # (a line of short items: a long run's log stays readable)
            self.log("--- samples: " + " · ".join(texts))
        else:
            self.log("--- sample ---\n" + "\n".join(texts) + "\n---")
        event = {"event": "sample", "step": step, "texts": texts}
        if self.board is not None:
            self.board.event(event)
        if self.on_event is not None:
            self.on_event(event)

    def save(self) -> None:
        carry = self.run.state.carry
        full_carry = carry if carry is None else tuple(self.run.ranks.gather_streams(part) for part in carry)
        if self.run.ranks.main:
            self.run.state.save(self.run.run_dir, asdict(self.run.config), full_carry, self.run.config.keep)
        self.write_config()
        self.save_clock.saved()

    def recover(self, where: str) -> None:
        """A NaN or inf ``where``: never train on it. Go back to the last checkpoint with half
        the learning rate, or stop with a clear message once that has not helped."""
        config, progress = self.run.config, self.run.state.progress
        tries, factor = progress.nonfinite + 1, progress.lr_factor / 2
        advice = f"lower --base-lr (now {config.base_lr:g}) or --clip, or try --precision fp32"
        if tries > config.nonfinite_retries:
            raise ChargenError(f"the {where} became NaN or infinite again at step {progress.step:,} after "
                               f"{config.nonfinite_retries} returns to a checkpoint at lower learning rates; {advice}")
        if not (self.run.run_dir / checkpoint.TRAINER).exists():
            raise ChargenError(f"the {where} became NaN or infinite at step {progress.step:,}, before the first "
                               f"checkpoint; {advice}, and start again with --force")
        bad_step = progress.step
        self.run.state.load(self.run.run_dir, self.run.device, self.run.my_streams)
        progress.nonfinite, progress.lr_factor = tries, factor
        self.budget.restart(progress)
        self.clock.validated_at, self.clock.next_at = progress.step, progress.step + self.clock.plan.every
        self.log(f"the {where} became NaN or infinite at step {bad_step:,}: back to the checkpoint at step "
                 f"{progress.step:,} with the learning rate x{factor:g} ({tries} of {config.nonfinite_retries})")
        self.record({"event": "nonfinite", "where": where, "at_step": bad_step, "lr_factor": factor})
        self.window.clear()  # the window's losses were partly NaN, and partly from steps now undone
        self.bar.n = progress.step
        self.bar.refresh()
        self.run.model.train()


def starting_state(batch: Batch, carry: State | None) -> State | None:
    """The state a batch starts from: none at an epoch's start (and for items, which carry
    none), else the carried one with the state of the streams the feed resets zeroed."""
    if batch.new_epoch:
        return None
    return carry if carry is None or batch.fresh is None else zero_streams(carry, batch.fresh)


def rescore_best_on_sample(trainer: Trainer) -> bool:
    """Where the run validated on a sample and that curve turned up before the end, the
    weights of its best scored on the whole text too, after the last weights' final
    validation, where it was whole and the time is left: kept as the best if they do
    better (chargen.best_on_sample). Whether they were scored."""
    best, run = trainer.best_on_sample, trainer.run
    progress = run.state.progress
    due = best.turned_up and best.step < progress.step == trainer.clock.whole_at
    if not run.ranks.from_main(int(due and rescore_fits(trainer)), run.device):  # (every rank scores, or none)
        return False
    start = time.perf_counter()
    with best.loaded(run.model):
        val_loss, scored = trainer.score(None)
    run.model.train()
    is_best = math.isfinite(val_loss) and keep_if_best(run, val_loss, best.step, best.weights)
    # (an event of its own: a validation curve by step would show older weights at the last step)
    trainer.record({"event": "best_on_sample", "val_loss": val_loss, "val_bpc": bpc(val_loss), "best": is_best,
                    "chars": scored, "weights_step": best.step, "sample_loss": best.loss})
    trainer.log(f"the weights of step {best.step:,}, the best on the validation sample ({best.loss:.4f} there, "
                f"{best.last_loss:.4f} at the last), score val loss {val_loss:.4f} on the whole text"
                f"{'  (best)' if is_best else ''}")
    count_validation(trainer, start)
    return True


def rescore_fits(trainer: Trainer) -> bool:
    """Whether the rescore fits in what is left of --max-time: it takes what the final,
    whole validation just took (the same text, the same model: a better guess than a cost
    scaled by the steps' speed), and may run past the budget by what the final validation left
    of its slack (chargen.budget.FINAL_SLACK: one slack for both, so a run ends at most that far
    past its budget). Where it does not fit, the log says so (rank 0's: the others log nothing)."""
    max_time = trainer.run.config.max_time
    if max_time is None:
        return True
    takes, left = trainer.clock.scoring[0], trainer.budget.seconds_left()
    if takes <= left + FINAL_SLACK * max_time:
        return True
    best = trainer.best_on_sample
    trainer.log(f"the weights of step {best.step:,}, the best on the validation sample ({best.loss:.4f} there, "
                f"{best.last_loss:.4f} at the last), are not scored on the whole text: that would take about "
                f"{takes:.1f} s, and {max(0.0, left):.1f} s of --max-time {max_time:g} are left")
    return False


def keep_if_best(run: PreparedRun, val_loss: float, step: int, weights: dict[str, torch.Tensor]) -> bool:
    """Whether a whole-text figure beats the run's best: if so it is the best now, with its
    step, and the weights that scored it are ``best.safetensors`` (written by rank 0)."""
    progress = run.state.progress
    if progress.best_val_loss is not None and val_loss >= progress.best_val_loss:
        return False
    progress.best_val_loss, progress.best_step = val_loss, step
    if run.ranks.main:
        save_tensors(run.run_dir / checkpoint.BEST, weights, {"step": step})
    return True


def count_validation(trainer: Trainer, start: float) -> None:
    """The time since ``start`` (a ``perf_counter``) counted as validation's."""
    spent = time.perf_counter() - start
    trainer.run.state.progress.val_seconds += spent
    trainer.budget.val_seconds += spent
