"""The training loop: batches from a feed (contiguous streams with truncated BPTT, the LSTM
state carried and detached from one chunk to the next; or length-bucketed items, each from
a zero state), AdamW, clipping, a learning-rate schedule scaled to the batch, periodic
validation, and checkpoints that make ``resume`` continue exactly where training stopped.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from . import __version__, board, checkpoint, faults, finetune, memory
from .autosize import choose_size, probe_speed, regularisation
from .budget import VAL_SHARE, TimeBudget, ValidationCost, ValidationPlan, fit_to_time, plan_validation
from .checkpoint import Progress, TrainerState
from .corpus import Corpus
from .device import resolve_device, resolve_precision
from .distributed import SINGLE, Ranks
from .errors import ChargenError
from .evaluate import LN2
from .feeds import Batch, LinesFeed, StreamFeed
from .lines import IGNORE, write_item_hashes
from .model import CharLSTM, ModelConfig, detach_state
from .modes import StopReason, mode_of
from .sample import DEFAULTS as SAMPLING
from .sample import collect, sample_text
from .schedule import BatchScaling, WarmupDecay, format_schedule

DEFAULT_EPOCHS = 10
TIMED_PLAN = 10**12  # steps asked for by --max-time alone: more than any budget allows
MAX_SAMPLE_CHARS = 100_000  # the sample printed at each validation: past this, a long wait for a glimpse
PRECISION_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}  # autocast dtype -> name
MAX_EPOCHS = 1e9  # a bound that keeps every step count an exact integer
MAX_SEED = 2**32 - 1  # what every generator (numpy's, torch's, a rank's offset) takes as it is


@dataclass
class TrainConfig:
    batch_size: int = 32
    bptt: int = 128
    variable_bptt: bool = False
    bucket_factor: int = 500  # lines mode: batches per length-sorted superbatch
    # The learning rate comes from a reference setting tuned at base_batch_size, carried
    # to batch_size by lr_scaling (see chargen.schedule): LEGW by default.
    lr_scaling: str = "legw"
    base_batch_size: int = 32
    base_lr: float = 3e-3
    base_warmup_epochs: float | None = None  # None: warmup_steps updates at base_batch_size
    warmup_steps: int = 100
    decay: str = "cosine"
    weight_decay: float | None = None  # None: as the epochs of the run call for (chargen.autosize)
    clip: float = 1.0
    nonfinite_retries: int = 3  # NaN/inf losses survived (back to the checkpoint, half the lr) before giving up
    epochs: float | None = None  # the plan is --steps, else --epochs, else DEFAULT_EPOCHS
    steps: int | None = None
    max_time: float | None = None  # seconds for this invocation; the plan shrinks to fit
    eval_every: int = 250
    patience: int | None = None  # stop after this many whole-text validations without a better loss
    log_every: int = 10
    sample_chars: int = 200
    seed: int = 1234
    device: str = "auto"
    precision: str = "auto"  # bf16 autocast where the hardware has it, else fp32
    init_from: str | None = None  # a run or model folder whose weights a new run starts from (chargen.finetune)
    tensorboard: bool = False  # mirror the metrics and samples to TensorBoard under RUN_DIR/tb (chargen.board)

    def __post_init__(self) -> None:
        for name in ("batch_size", "bptt", "bucket_factor", "eval_every", "log_every"):
            if getattr(self, name) <= 0:
                raise ChargenError(f"--{name.replace('_', '-')} must be positive, not {getattr(self, name)}")
        for name in ("epochs", "steps", "max_time", "clip"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ChargenError(f"--{name.replace('_', '-')} must be positive and finite, not {value}")
        for name in ("epochs", "base_warmup_epochs"):
            if (getattr(self, name) or 0) > MAX_EPOCHS:
                raise ChargenError(f"--{name.replace('_', '-')} must be at most {MAX_EPOCHS:g}, "
                                   f"not {getattr(self, name)}")
        # Past these AdamW diverges at the first step, or decay flips the weights' sign.
        if not 0 < self.base_lr < 1:
            raise ChargenError(f"--base-lr must be between 0 and 1 (the default is 3e-3), not {self.base_lr}")
        if self.epochs is not None and self.steps is not None:
            raise ChargenError("give --epochs or --steps, not both")
        if self.nonfinite_retries < 0:
            raise ChargenError(f"nonfinite_retries must be 0 or more, not {self.nonfinite_retries}")
        if self.weight_decay is not None and not 0 <= self.weight_decay <= 1:
            raise ChargenError(f"--weight-decay must be 0 to 1, not {self.weight_decay}")
        if not 0 <= self.sample_chars <= MAX_SAMPLE_CHARS:
            raise ChargenError(f"--sample-chars must be 0 to {MAX_SAMPLE_CHARS:,}, not {self.sample_chars}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ChargenError(f"--seed must be 0 to {MAX_SEED:,}, not {self.seed}")
        if self.patience is not None and self.patience < 1:
            raise ChargenError(f"--patience must be 1 or more, not {self.patience}")
        if self.warmup_steps < 0:
            raise ChargenError(f"--warmup-steps must be 0 or more, not {self.warmup_steps}")
        self.scaling(1)  # validates the reference and the scheme
        WarmupDecay(self.base_lr, self.warmup_steps, 1, self.decay)  # validates the decay

    def scaling(self, base_steps_per_epoch: int) -> BatchScaling:
        """The reference setting; a warmup given in steps becomes epochs at the base batch."""
        warmup = self.base_warmup_epochs
        if warmup is None:
            warmup = self.warmup_steps / base_steps_per_epoch
        return BatchScaling(self.lr_scaling, self.base_batch_size, self.base_lr, warmup)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


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


def requested_steps(config: TrainConfig, steps_per_epoch: int) -> int:
    if config.steps is not None:
        return config.steps
    if config.epochs is None and config.max_time is not None:
        return TIMED_PLAN  # the budget decides: fitted to --max-time after the first steps
    epochs = config.epochs if config.epochs is not None else DEFAULT_EPOCHS
    return max(1, round(epochs * steps_per_epoch))


def param_groups(model: CharLSTM, weight_decay: float) -> list[dict]:
    """Decay matrices only; biases and the like are left alone."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices, "weight_decay": weight_decay}, {"params": others, "weight_decay": 0.0}]


def make_feed(corpus: Corpus, config: TrainConfig, device: torch.device,
              ranks: Ranks = SINGLE) -> StreamFeed | LinesFeed:
    if mode_of(corpus.mode).items:
        return LinesFeed(corpus.train_items, corpus.val_items, config.batch_size, config.bucket_factor,
                         config.seed, device, ranks)
    return StreamFeed(corpus.train_ids, corpus.val_ids, config.batch_size, config.bptt, config.variable_bptt,
                      device, ranks)


def run_config(model_config: ModelConfig, config: TrainConfig, corpus: Corpus, default_prime: str, n_params: int,
               autocast_dtype: torch.dtype | None) -> dict:
    return {
        "chargen_version": __version__,
        "mode": corpus.mode,
        "model": model_config.to_dict(),
        "train": asdict(config),
        "corpus": corpus.source,
        "default_prime": default_prime,
        "parameters": n_params,
        "precision_used": PRECISION_NAMES[autocast_dtype],
    }


def check_resume(saved: dict, corpus: Corpus, model_config: ModelConfig | None, config: TrainConfig) -> ModelConfig:
    """The saved run must match what it is asked to continue with."""
    for key in ("sha256", "val_sha256", "val_fraction"):
        if saved["corpus"].get(key) != corpus.source.get(key):
            raise ChargenError(
                f"this run was trained on {saved['corpus'].get('path')} with a different text or "
                "validation split; resume with the same file and split, or start a new run (--force)"
            )
    if saved.get("mode", "stream") != corpus.mode:
        raise ChargenError(f"this run was trained in {saved.get('mode', 'stream')} mode; resume it with --mode "
                           f"{saved.get('mode', 'stream')}")
    saved_model = ModelConfig.from_dict(saved["model"])
    if model_config is not None and replace(model_config, vocab_size=saved_model.vocab_size) != saved_model:
        raise ChargenError("the model settings differ from the saved run's; drop them to resume as saved")
    for name in mode_of(corpus.mode).resume_layout:
        if getattr(config, name) != saved["train"].get(name):
            raise ChargenError(
                f"--{name.replace('_', '-')} differs from the saved run's ({saved['train'].get(name)}); "
                "the batches would not line up, so resume with the saved value"
            )
    return saved_model


# --- the loop ----------------------------------------------------------------------------
def train(
    corpus: Corpus,
    run_dir: str | Path,
    model_config: ModelConfig | None = None,
    config: TrainConfig | None = None,
    *,
    resume: bool = False,
    force: bool = False,
    log: Callable[[str], None] | None = None,
    progress_bar: bool = False,
    on_event: Callable[[dict], None] | None = None,
    stop: threading.Event | None = None,
    ranks: Ranks = SINGLE,
) -> TrainResult:
    """Train (or with ``resume``, continue) the run in ``run_dir`` on ``corpus``.

    ``on_event`` gets every metrics event as it is written (train, val) and the samples
    drawn at each validation (``{"event": "sample", "texts": [...]}``, not written);
    setting ``stop`` ends the run after the current step, with a checkpoint, like Ctrl-C.
    Under torchrun, ``ranks`` (``chargen.distributed.from_environment``) says which process
    this is: ``config.batch_size`` is the global batch, and only rank 0 writes or logs."""
    trainer = Trainer(corpus, Path(run_dir), model_config, config or TrainConfig(), resume=resume, force=force,
                      log=log, progress_bar=progress_bar, on_event=on_event, ranks=ranks)
    return trainer.fit(stop)


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
    """One training run: set up, or resumed from its checkpoint, by the constructor; trained
    by ``fit``. The pieces of a step are methods, in the order ``fit`` calls them."""

    def __init__(self, corpus: Corpus, run_dir: Path, model_config: ModelConfig | None, config: TrainConfig, *,
                 resume: bool, force: bool, log: Callable[[str], None] | None, progress_bar: bool,
                 on_event: Callable[[dict], None] | None, ranks: Ranks) -> None:
        check_distributed(corpus, config, ranks)
        if config.tensorboard:
            board.check_available()
        self.mode = mode_of(corpus.mode)
        if not ranks.main:  # one voice: rank 0 logs, shows progress and reports events
            log, progress_bar, on_event = None, False, None
        self.corpus, self.run_dir, self.config, self.ranks = corpus, run_dir, config, ranks
        self.log, self.on_event, self.progress_bar = log or (lambda message: None), on_event, progress_bar
        self.device = resolve_device(config.device)
        saved = checkpoint.read_config(run_dir) if resume else {}
        self.autocast_dtype, precision_note = self._precision(saved.get("precision_used"))
        self.source, self.init_record = None, saved.get("init_from")
        if resume:
            self.model_config = check_resume(saved, corpus, model_config, config)
            self.tokenizer = checkpoint.read_tokenizer(run_dir)
            if self.init_record:  # a fine-tuned run: the text's ids in the run's merged vocabulary
                corpus = self.corpus = finetune.adopt_vocabulary(corpus, self.tokenizer)
            if self.tokenizer.chars != corpus.tokenizer.chars:  # (the corpus's ids are in its own vocabulary)
                raise ChargenError(f"{run_dir}/{checkpoint.TOKENIZER} does not match the text's characters; "
                                   "resume with the run's own folder and text, or start a new run (--force)")
            self.default_prime = saved.get("default_prime", "")
        else:
            if config.init_from:
                self.source = finetune.read_source(config.init_from)
                tokenizer, new_chars = finetune.merged_tokenizer(self.source.tokenizer, corpus.tokenizer)
                model_config = finetune.model_for(self.source, model_config, corpus.mode, tokenizer.vocab_size)
                corpus = self.corpus = finetune.adopt_vocabulary(corpus, tokenizer)
                self.init_record = self.source.record(new_chars)
            self.tokenizer = corpus.tokenizer
            self.default_prime = first_prime(corpus)
        self.feed = make_feed(corpus, config, self.device, ranks)
        self.probe_seconds, self.sizing = 0.0, []  # (the sizing's start-up lines)
        if resume:
            self.config = config = replace(config, weight_decay=config.weight_decay if config.weight_decay is not None
                                           else saved["train"].get("weight_decay", 0.01))
        else:
            self.model_config = self._fit_model(model_config)
            config = self.config
        # Refuse a model the machine cannot hold before building it, with the figures.
        need = memory.estimate(self.model_config, *self.feed.largest_batch())
        ranks.check_on_main(lambda: memory.check_fits(need, self.device, memory.available_bytes(self.device)))
        self._build()
        self._start_or_resume(resume, force, need.parameters)
        self._plan_schedule()
        self.metrics = checkpoint.MetricsLog(run_dir / checkpoint.METRICS)
        self.board = board.Board(run_dir, self.state.progress.step if resume else None) \
            if config.tensorboard and ranks.main else None
        self.history: list[dict] = []
        self.budget: TimeBudget | None = None  # fit's, while it runs
        self.whole_validated_at, self.last_scoring = -1, (0.0, 0)  # the last whole validation; seconds, targets
        self.check_every_step = self.device.type == "cpu" and not ranks.active
        self._log_start(resume, precision_note)

    # --- set-up --------------------------------------------------------------------------
    def _precision(self, saved: str | None) -> tuple[torch.dtype | None, str]:
        """The autocast dtype. A resumed ``auto`` run keeps the precision it trained in, where
        that still runs, rather than timing again (a close call could flip, and then the
        resume would no longer be exact)."""
        dtype, note = None, ""
        if self.config.precision == "auto" and saved in PRECISION_NAMES.values():
            try:
                dtype, note = resolve_precision(saved, self.device)
                note += ", as the run trained so far"
            except ChargenError:  # it does not run on this machine: choose afresh
                pass
        if not note:
            dtype, note = resolve_precision(self.config.precision, self.device)
        if self.ranks.active:  # one precision for all: rank 0's (auto times bf16 on each rank)
            dtypes = [None, torch.bfloat16, torch.float16]
            dtype = dtypes[self.ranks.from_main(dtypes.index(dtype), self.device)]
        if self.device.type == "cuda":  # TF32 tensor cores for the fp32 matrix products
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        return dtype, note

    def _fit_model(self, asked: ModelConfig | None) -> ModelConfig:
        """A new run's model: the size asked for or, with --max-time and none asked for, the
        size chosen for the budget; dropout and weight decay, where not given, as the run's
        epochs call for (chargen.autosize). Rank 0 decides; every rank builds the same."""
        config = self.config
        model = replace(asked or ModelConfig(), vocab_size=self.tokenizer.vocab_size)
        if asked is not None and model.dropout is not None and config.weight_decay is not None:
            return model
        start, epochs = time.perf_counter(), 0.0
        if self.ranks.main:
            model, epochs = self._size_for_budget(model, choose=asked is None)
        layers, hidden, millis = (self.ranks.from_main(v, self.device)
                                  for v in (model.layers, model.hidden, round(epochs * 1000)))
        epochs, model = millis / 1000, replace(model, layers=layers, hidden=hidden)
        params = memory.parameter_count(model)
        per_char = params / self.feed.epoch_targets
        fitting = regularisation(epochs, params, self.feed.epoch_targets)
        dropout = fitting.dropout if model.dropout is None else model.dropout
        weight_decay = fitting.weight_decay if config.weight_decay is None else config.weight_decay
        self.config = replace(config, weight_decay=weight_decay)
        given = [f"--{name}" for name, value in (("dropout", model.dropout), ("weight-decay", config.weight_decay))
                 if value is not None]
        self.sizing.append(f"regularisation for {epochs:.3g} epochs at {per_char:.2g} parameters per character of "
                           f"the text (exposure {epochs * per_char:.3g}): dropout {dropout:g}, weight decay "
                           f"{weight_decay:g}" + (f" ({' and '.join(given)} as given)" if given else
                                                  f" ({fitting.note})" if fitting.note else ""))
        self.probe_seconds = time.perf_counter() - start
        return replace(model, dropout=dropout)

    def _size_for_budget(self, model: ModelConfig, choose: bool) -> tuple[ModelConfig, float]:
        """The size (chosen when ``choose``) and the epochs it will see: those planned, or
        with --max-time, those the probed speed allows in it (if fewer)."""
        config, feed = self.config, self.feed
        steps = requested_steps(config, feed.steps_per_epoch)
        planned = math.inf if steps >= TIMED_PLAN else steps / feed.steps_per_epoch * feed.epoch_targets
        if config.max_time is None:
            return model, planned / feed.epoch_targets
        seconds, (time_steps, batch) = config.max_time * (1 - VAL_SHARE), feed.typical_batch()

        def probe(candidate: ModelConfig) -> float:
            return probe_speed(candidate, batch, time_steps, self.device, self.autocast_dtype) * self.ranks.world

        if not choose:
            return model, min(planned, probe(model) * seconds) / feed.epoch_targets
        choice = choose_size(probe, seconds, feed.epoch_targets, model, time_steps * batch, planned)
        self.sizing.append(f"model: {choice.config.layers}x{choice.config.hidden}, chosen for --max-time "
                           f"{config.max_time:g} (--hidden, --layers or --dropout to choose yourself): {choice.reason}")
        return choice.config, choice.chars / feed.epoch_targets

    def _build(self) -> None:
        """The model (and its DDP wrapper), AdamW, the gradient scaler and the data RNG."""
        config = self.config
        torch.manual_seed(config.seed)
        self.model = CharLSTM(self.model_config)
        if self.source is not None:
            finetune.load_source_weights(self.model, self.source)
        self.model.to(self.device)
        # DDP averages the ranks' gradients: one step over the global batch. (The same seed
        # gave every rank the same weights; DDP checks that by broadcasting rank 0's.)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.net = DDP(self.model, device_ids=device_ids) if self.ranks.active else self.model
        optimizer = torch.optim.AdamW(param_groups(self.model, config.weight_decay), lr=config.base_lr,
                                      betas=(0.9, 0.99))
        # fp16 autocast needs its gradients scaled against underflow; bf16 and fp32 do not.
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.autocast_dtype is torch.float16)
        requested = requested_steps(config, self.feed.steps_per_epoch)
        self.state = TrainerState(self.model, optimizer, np.random.default_rng(config.seed), scaler,
                                  Progress(total_steps=requested, requested_steps=requested))
        self.my_streams = self.ranks.block(config.batch_size)  # a checkpoint holds all streams' state

    def _start_or_resume(self, resume: bool, force: bool, n_params: int) -> None:
        """A new run folder, or the resume point of the run in it."""
        run_dir, ranks, progress = self.run_dir, self.ranks, self.state.progress
        if resume:
            if ranks.main and (stale := checkpoint.remove_stale_temps(run_dir)):
                self.log(f"removed {stale} partial file{'s' * (stale > 1)} left by a process stopped mid-write")
            ranks.check_on_main(lambda: checkpoint.check_room(run_dir, 4 * n_params * checkpoint.RESUME_COPIES))
            requested = progress.requested_steps
            self.state.load(run_dir, self.device, self.my_streams)
            if progress.requested_steps != requested:  # a new plan was asked for
                progress.requested_steps = progress.total_steps = requested
        else:
            def start_folder() -> None:
                checkpoint.prepare_new_run(run_dir, force, 4 * n_params * checkpoint.NEW_RUN_COPIES)
                checkpoint.write_tokenizer(run_dir, self.tokenizer)
                if self.mode.items:
                    write_item_hashes(run_dir / checkpoint.ITEMS, self.corpus.train_items.strings(self.tokenizer))

            ranks.check_on_main(start_folder)
        if ranks.active:  # different dropout on every rank, as over one batch
            torch.manual_seed(self.config.seed + 7919 * ranks.rank + progress.step)

    def _plan_schedule(self) -> None:
        config, feed, progress = self.config, self.feed, self.state.progress
        self.scaling = config.scaling(feed.steps_per_epoch_at(config.base_batch_size))
        # A short plan gets a short warmup: at most half of it.
        self.schedule = self.scaling.schedule(config.batch_size, feed.steps_per_epoch, progress.total_steps,
                                              config.decay, max_warmup_steps=progress.requested_steps // 2)
        self.config_record = run_config(self.model_config, config, self.corpus, self.default_prime,
                                        self.model.num_parameters(), self.autocast_dtype)
        if self.init_record:
            self.config_record["init_from"] = self.init_record
        self.write_config()

    def _log_start(self, resume: bool, precision_note: str) -> None:
        config, feed, progress, corpus = self.config, self.feed, self.state.progress, self.corpus
        if "mode_reason" in corpus.source:  # --mode auto chose
            other = "stream" if self.mode.items else "lines"
            self.log(f"mode: {corpus.mode}: {corpus.source['mode_reason']} (--mode {other} to override)")
        for line in corpus.source.get("skipped", []):
            self.log(line)
        if "files" in corpus.source:
            kind = "their items pooled" if self.mode.items else "each a document, ended by a document break"
            self.log(f"corpus: {len(corpus.source['files']):,} files, {corpus.source['chars']:,} characters, {kind}")
        self.log(f"{'resuming' if resume else 'training'} {self.run_dir}: {feed.describe()}, vocabulary "
                 f"{self.tokenizer.vocab_size}, {self.model.num_parameters():,} parameters, device {self.device} "
                 f"({precision_note})")
        if self.init_record:
            self.log(finetune.describe(self.init_record, self.model_config, corpus.mode, resume))
        for line in self.sizing:
            self.log(line)
        if progress.total_steps >= TIMED_PLAN:
            self.log(f"plan: steps of {feed.batch_description()} for {config.max_time:g} s, from step "
                     f"{progress.step:,} (the number of steps is fitted to the time after the first few)")
        else:
            self.log(f"plan: {progress.total_steps:,} steps of {feed.batch_description()} "
                     f"({progress.total_steps / feed.steps_per_epoch:.2f} epochs), from step {progress.step:,}"
                     + (f", at most {config.max_time:g} s" if config.max_time else ""))
        if progress.total_steps < TIMED_PLAN:  # (a timed plan's schedule is shown once fitted)
            self.log(format_schedule(self.scaling.describe(config.batch_size, feed.steps_per_epoch, self.schedule)))
        if self.schedule.warmup_steps < round(self.scaling.warmup_epochs(config.batch_size) * feed.steps_per_epoch):
            self.log(f"warmup cut to {self.schedule.warmup_steps:,} steps: half of this short plan")
        if config.patience is not None:
            so_far = f" ({progress.since_best} so far)" if progress.since_best else ""
            self.log(f"early stop: after {config.patience} validations on the whole validation text without a better "
                     f"loss{so_far}")

    # --- the loop ------------------------------------------------------------------------
    def fit(self, stop: threading.Event | None = None) -> TrainResult:
        progress, config, feed = self.state.progress, self.config, self.feed
        budget = self.budget = TimeBudget(config.max_time, progress, spent=self.probe_seconds)
        self.val_plan = ValidationPlan(config.eval_every)  # refitted to --max-time with the plan
        budget.next_fit = progress.step + min(TimeBudget.FIRST_FIT, config.eval_every)  # (before the first validation)
        self.validated_at = progress.step // config.eval_every * config.eval_every  # (or would have been)
        self.next_validation = self.validated_at + config.eval_every
        self.window = LogWindow(self.device)
        shown_total = progress.total_steps if progress.total_steps < TIMED_PLAN else None  # (not fitted yet)
        self.bar = tqdm(total=shown_total, initial=progress.step, unit="step", dynamic_ncols=True,
                        disable=not self.progress_bar, file=sys.stderr,
                        mininterval=0.5 if sys.stderr.isatty() else 30)
        self.model.train()
        saved_at, early = -1, None
        with StopSignals(self.log, stop) as signals, self.bar:
            policy = StopPolicy(signals, budget, self.ranks, self.device)
            while progress.step < progress.total_steps and not policy.asked:
                # the batch, and its learning rate
                batch = feed.next(progress, self.state.rng)
                if batch.new_epoch or not feed.carries_state:  # an epoch (or an item) starts from zero
                    self.state.carry = None
                lr = self.set_lr(batch)
                # forward; on one CPU process the check costs nothing, so a bad step is caught
                # before it is taken; on a GPU (no per-step sync) and across ranks, at the next log
                loss = self.forward(batch)
                if self.check_every_step and not torch.isfinite(loss):
                    self.recover("training loss")
                    continue
                # backward and update
                self.update(loss, batch)
                now = budget.tick(progress)
                self.window.add(loss, batch.targets)
                if config.max_time is not None and progress.step == budget.next_fit:
                    self.fit_plan(budget, now, batch)
                # log
                at_end = progress.step == progress.total_steps
                if (progress.step % config.log_every == 0 or at_end) and not self.log_window(lr, now):
                    self.recover("training loss")
                    continue
                # validate and checkpoint
                if progress.step >= self.next_validation or at_end:
                    if not self.validate_and_save(budget, now, whole=at_end):
                        self.recover("validation loss")
                        continue
                    saved_at = progress.step
                    if self.out_of_patience() and not at_end:
                        early = "patience"
                        break
                # stop
                if policy.should_stop(at_log_step=progress.step % config.log_every == 0):
                    break
        return self.finish(early or policy.reason, saved_at)

    def out_of_patience(self) -> bool:
        patience = self.config.patience
        return patience is not None and self.state.progress.since_best >= patience

    def set_lr(self, batch: Batch) -> float:
        # A shorter chunk (variable BPTT, or the last of an epoch) gets a proportionally
        # smaller step, as in AWD-LSTM: its mean loss rests on fewer characters.
        lr = self.schedule.lr_at(self.state.progress.step) * batch.lr_scale * self.state.progress.lr_factor
        for group in self.state.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def forward(self, batch: Batch) -> torch.Tensor:
        dtype = self.autocast_dtype
        with torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, self.state.carry = self.net(batch.x, self.state.carry)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.y.flatten(), ignore_index=IGNORE)
        if batch.rank_share != 1.0:
            loss = loss * batch.rank_share
        return faults.loss(self.state.progress.step + 1, loss)

    def update(self, loss: torch.Tensor, batch: Batch) -> None:
        self.state.optimizer.zero_grad(set_to_none=True)
        self.state.scaler.scale(loss * batch.loss_weight if batch.loss_weight != 1.0 else loss).backward()
        self.state.scaler.unscale_(self.state.optimizer)  # (each of these three is a no-op or plain call unless fp16)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip)
        self.state.scaler.step(self.state.optimizer)
        self.state.scaler.update()
        self.state.carry = detach_state(self.state.carry) if self.feed.carries_state else None
        self.state.progress.step += 1
        self.state.progress.chars_seen += batch.targets
        self.bar.update(1)

    def log_window(self, lr: float, now: float) -> bool:
        """The log line of the window; False when its mean loss is not finite."""
        window, ranks = self.window, self.ranks
        # The loop's only read from the device (and, distributed, its only sum of losses).
        mean_loss = (ranks.sum(window.loss_sum) / (window.steps * ranks.world)).item()
        if not math.isfinite(mean_loss):
            return False
        chars_per_s = window.chars / max(1e-9, now - window.start)
        self.record({"event": "train", "total_steps": self.state.progress.total_steps, "loss": mean_loss,
                     "bpc": mean_loss / LN2, "lr": lr, "chars_per_s": round(chars_per_s),
                     "elapsed": round(self.state.progress.train_seconds, 2)})
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", bpc=f"{mean_loss / LN2:.3f}", chars_s=f"{chars_per_s:,.0f}",
                             lr=f"{lr:.2e}")
        window.clear(now)
        return True

    def fit_plan(self, budget: TimeBudget, now: float | None = None, batch: Batch | None = None) -> None:
        """Refit the plan, and the validations within it, to what is left of --max-time.
        Until a validation has been timed, guess one as a forward pass over the validation
        text: about half a training step's time per character (a third to a half, measured)."""
        progress, config, whole = self.state.progress, self.config, self.feed.val_targets
        step_seconds = budget.step_seconds(progress)
        cost = budget.cost or ValidationCost(step_seconds / (2 * batch.targets), 0.0)
        total, plan = progress.total_steps, self.val_plan
        for _ in range(2):  # the validations depend on the steps left, and the steps on them
            plan = plan_validation(budget.validation_allowance(), max(0, total - progress.step), config.eval_every,
                                   whole, cost, self.val_plan.sample, whole_only=config.patience is not None)
            during = cost.seconds(whole if plan.sample is None else plan.sample)
            total = fit_to_time(progress.requested_steps, progress.step, budget.seconds_left(), step_seconds, during,
                                plan.every, cost.seconds(whole))
        total = self.ranks.from_main(total, self.device)  # every rank follows rank 0's clock and plan
        plan = ValidationPlan(self.ranks.from_main(plan.every, self.device),
                              self.ranks.from_main(-1 if plan.sample is None else plan.sample, self.device))
        plan = plan if plan.sample != -1 else ValidationPlan(plan.every)
        first, old = progress.total_steps >= TIMED_PLAN, self.val_plan
        if abs(total - progress.total_steps) > progress.total_steps // 100:
            self.log(f"plan fitted to --max-time {config.max_time:g}: {total:,} steps "
                     f"({step_seconds * 1000:.0f} ms a step, {cost.seconds(whole):.1f} s a validation)")
        steps_left = total - progress.step
        if (plan.sample, plan.every > steps_left) != (old.sample, old.every > steps_left):  # a new kind of plan
            self.log(describe_validation(plan, whole, steps_left))
        self.val_plan, budget.next_fit = plan, progress.step + max(1, (total - progress.step) // 10)
        self.next_validation = max(progress.step + 1, self.validated_at + plan.every)
        progress.total_steps = self.schedule.total_steps = self.bar.total = total
        if first:  # the schedule's length is known only now
            self.log(format_schedule(self.scaling.describe(config.batch_size, self.feed.steps_per_epoch,
                                                           self.schedule)))
        self.bar.refresh()

    def validate_and_save(self, budget: TimeBudget, now: float, whole: bool) -> bool:
        """A validation (on the plan's sample, unless ``whole``) and a checkpoint; False,
        with nothing saved, when the validation loss is not finite."""
        if not math.isfinite(self.validate(None if whole else self.val_plan.sample)):
            return False
        self.save()
        self.validated_at = self.state.progress.step
        self.next_validation = self.validated_at + self.val_plan.every
        scoring, scored = self.last_scoring
        budget.cost = ValidationCost(scoring / max(1, scored), time.perf_counter() - now - scoring)
        if self.config.max_time is not None and self.state.progress.step < self.state.progress.total_steps:
            self.fit_plan(budget)
        self.window.start = budget.resume_ticking()  # validation is not training time
        return True

    def finish(self, stopped: StopReason, saved_at: int) -> TrainResult:
        progress = self.state.progress
        if stopped == "time" and self.whole_validated_at != progress.step:  # the figure is the whole text's
            self.validate()
            saved_at = -1  # (the summary in config.json follows)
        if saved_at != progress.step:
            self.save()
        best = "n/a" if progress.best_val_loss is None else f"{progress.best_val_loss / LN2:.4f}"
        spent = "" if self.config.max_time is None else \
            f"; validation took {self.budget.val_seconds:.1f} s ({self.budget.val_seconds / self.config.max_time:.1%})"
        if stopped == "patience":
            at = "" if progress.best_step is None else f" at step {progress.best_step:,}"  # (older runs lack it)
            self.log(f"stopped early at step {progress.step:,} of {progress.total_steps:,}: no better validation loss "
                     f"in {progress.since_best} validations; best val bpc {best}{at}, "
                     f"kept in {self.run_dir / checkpoint.BEST} (what sample, eval and export use){spent}")
        else:
            verb = "finished" if stopped == "done" else f"stopped ({stopped})"
            self.log(f"{verb} at step {progress.step:,} of {progress.total_steps:,}; best val bpc {best}{spent}; "
                     f"checkpoint in {self.run_dir}" + ("" if stopped == "done" else "; continue with --resume"))
        if self.board is not None:
            self.board.close()
        return TrainResult(self.run_dir, progress.step, progress.total_steps, self.epoch(), progress.best_val_loss,
                           progress.last_val_loss, stopped, self.history, self.model.eval())

    # --- validation, checkpoints, recovery ----------------------------------------------
    def epoch(self) -> float:
        return self.state.progress.epoch + self.feed.epoch_fraction(self.state.progress.position)

    def record(self, event: dict) -> None:
        event = {"event": event.pop("event"), "step": self.state.progress.step, "epoch": round(self.epoch(), 4)} | event
        if self.ranks.main:
            self.metrics.write(event)
        if self.board is not None:
            self.board.event(event)
        self.history.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def write_config(self) -> None:
        if self.ranks.main:
            config = self.config
            lr_record = self.scaling.describe(config.batch_size, self.feed.steps_per_epoch, self.schedule)
            checkpoint.write_config(self.run_dir, self.config_record | {"lr_schedule": lr_record,
                                                                        "summary": summary(self.state.progress)})

    def validate(self, sample: int | None = None) -> float:
        """The validation loss, on the whole text or (``sample``) on a fixed part of it. Only
        the whole text's figure competes for the best weights."""
        progress, start = self.state.progress, time.perf_counter()
        val_loss, scored = self.feed.evaluate(self.model, sample)
        self.last_scoring = (time.perf_counter() - start, scored)
        if not math.isfinite(val_loss):
            return val_loss  # the caller goes back to the last checkpoint; nothing is saved
        progress.last_val_loss, whole = val_loss, sample is None
        is_best = whole and (progress.best_val_loss is None or val_loss < progress.best_val_loss)
        if whole:
            self.whole_validated_at = progress.step
            progress.since_best = 0 if is_best else progress.since_best + 1
        if is_best:
            progress.best_val_loss, progress.best_step = val_loss, progress.step
            if self.ranks.main:
                checkpoint.save_tensors(self.run_dir / checkpoint.BEST, self.model.state_dict(),
                                        {"step": progress.step})
        self.record({"event": "val", "val_loss": val_loss, "val_bpc": val_loss / LN2, "best": is_best,
                     "whole": whole, "chars": scored, "elapsed": round(progress.train_seconds, 2)})
        part = "" if whole else f" on {scored:,} of its {self.feed.val_targets:,} chars"
        self.log(f"step {progress.step:,}  epoch {self.epoch():.2f}  val loss {val_loss:.4f}  "
                 f"val bpc {val_loss / LN2:.4f}{part}{'  (best)' if is_best else ''}")
        if self.config.sample_chars and self.ranks.main:
            self.show_samples()
        self.model.train()
        spent = time.perf_counter() - start
        progress.val_seconds += spent
        if self.budget is not None:
            self.budget.val_seconds += spent
        return val_loss

    def show_samples(self) -> None:
        """Lines mode: a few items; a stream: one passage."""
        n, items = self.mode.samples_shown, self.mode.items
        pieces = sample_text(self.model, self.tokenizer, self.default_prime, self.config.sample_chars, num_samples=n,
                             temperature=SAMPLING.temperature, seed=self.config.seed + self.state.progress.step,
                             items=items)
        texts = collect(pieces, n)
        self.log(f"--- sample{'s' if n > 1 else ''} ---\n" + "\n".join(texts) + "\n---")
        event = {"event": "sample", "step": self.state.progress.step, "texts": texts}
        if self.board is not None:
            self.board.event(event)
        if self.on_event is not None:
            self.on_event(event)

    def save(self) -> None:
        carry = self.state.carry
        full_carry = carry if carry is None else tuple(self.ranks.gather_streams(part) for part in carry)
        if self.ranks.main:
            self.state.save(self.run_dir, asdict(self.config), full_carry)
        self.write_config()

    def recover(self, where: str) -> None:
        """A NaN or inf ``where``: never train on it. Go back to the last checkpoint with half
        the learning rate, or stop with a clear message once that has not helped."""
        config, progress = self.config, self.state.progress
        tries, factor = progress.nonfinite + 1, progress.lr_factor / 2
        advice = f"lower --base-lr (now {config.base_lr:g}) or --clip, or try --precision fp32"
        if tries > config.nonfinite_retries:
            raise ChargenError(f"the {where} became NaN or infinite again at step {progress.step:,} after "
                               f"{config.nonfinite_retries} returns to a checkpoint at lower learning rates; {advice}")
        if not (self.run_dir / checkpoint.TRAINER).exists():
            raise ChargenError(f"the {where} became NaN or infinite at step {progress.step:,}, before the first "
                               f"checkpoint; {advice}, and start again with --force")
        bad_step = progress.step
        self.state.load(self.run_dir, self.device, self.my_streams)
        progress.nonfinite, progress.lr_factor = tries, factor
        self.validated_at, self.next_validation = progress.step, progress.step + self.val_plan.every
        self.log(f"the {where} became NaN or infinite at step {bad_step:,}: back to the checkpoint at step "
                 f"{progress.step:,} with the learning rate x{factor:g} ({tries} of {config.nonfinite_retries})")
        self.record({"event": "nonfinite", "where": where, "at_step": bad_step, "lr_factor": factor})
        self.window.clear()  # the window's losses were partly NaN, and partly from steps now undone
        self.bar.n = progress.step
        self.bar.refresh()
        self.model.train()


def check_distributed(corpus: Corpus, config: TrainConfig, ranks: Ranks) -> None:
    # (Streams are split in equal blocks; lines mode deals out each batch's items.)
    if ranks.active and not mode_of(corpus.mode).items and config.batch_size % ranks.world:
        raise ChargenError(f"--batch-size {config.batch_size} (the global batch) does not divide among "
                           f"{ranks.world} processes; use a multiple of {ranks.world}")


def first_prime(corpus: Corpus) -> str:
    """What samples start from: a stream starts best after a line break; an item starts
    from <bos> (no prime)."""
    if mode_of(corpus.mode).items:
        return ""
    return "\n" if "\n" in corpus.tokenizer else corpus.tokenizer.decode(corpus.train_ids[:1])


def describe_validation(plan: ValidationPlan, whole: int, steps_left: int) -> str:
    if plan.sample is None:
        return f"validation: every {plan.every:,} steps on the whole validation text"
    if plan.every > steps_left:
        return f"validation: on the whole text at the end only, to keep it within {VAL_SHARE:.0%} of --max-time"
    return (f"validation: every {plan.every:,} steps on a sample of {plan.sample:,} of its {whole:,} characters, and "
            f"on the whole text at the end, to keep it within {VAL_SHARE:.0%} of --max-time")


def summary(progress: Progress) -> dict:
    best = progress.best_val_loss
    return {
        "step": progress.step,
        "total_steps": progress.total_steps,
        "chars_seen": progress.chars_seen,
        "train_seconds": round(progress.train_seconds, 2),
        "validation_seconds": round(progress.val_seconds, 2),
        "best_val_loss": best,
        "best_val_bpc": None if best is None else best / LN2,
        "best_step": progress.best_step,
    }
