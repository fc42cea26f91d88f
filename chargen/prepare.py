"""A training run's set-up, everything before its first step: the text in the run's
vocabulary (a resumed or fine-tuned run's), the precision, the model's size, regularisation
and peak learning rate, the memory check, the model and optimizer, the run folder (new, or
the resume point read back), the schedule and the start-up report. ``prepare_run`` returns
it all as one fixed ``PreparedRun``; the loop (chargen.train) changes only the state in it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from . import board, checkpoint, finetune, memory
from .autosize import (
    CHARS_PER_PARAM,
    LADDER,
    base_lr_for,
    bits_per_char,
    by_characters,
    choose_size,
    counting,
    probe_config,
    probe_speed,
    regularisation,
    size_line,
    steps_line,
)
from .budget import VAL_SHARE
from .config import DEFAULT_EPOCHS, TrainConfig
from .corpus import Corpus
from .device import resolve_device, resolve_precision
from .distributed import SINGLE, Ranks
from .errors import ChargenError
from .evaluate import bpc
from .feeds import LinesFeed, StreamFeed
from .lines import write_item_hashes
from .model import CharLSTM, ModelConfig
from .modes import Mode, mode_of
from .record import CorpusInfo, InitFrom, RunRecord, Summary, write_record
from .schedule import BatchScaling, WarmupDecay, format_schedule
from .storage import atomic_link
from .tokenizer import CharTokenizer
from .trainer_state import Progress, TrainerState
from .version import __version__

TIMED_PLAN = 10**12  # steps asked for by --max-time alone: more than any budget allows
PRECISION_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}  # autocast dtype -> name
Log = Callable[[str], None]


@dataclass(frozen=True)
class PreparedRun:
    """A run ready for its first step. Fixed: the loop changes the state inside ``state``
    (and the schedule's length, once fitted to --max-time), never what is here; the one
    change, the regularisation refitted with a timed plan, makes a new one
    (``timed_plan.refit_regularisation``)."""

    run_dir: Path
    corpus: Corpus  # its ids in the run's vocabulary
    config: TrainConfig  # with the weight decay and peak learning rate chosen
    model_config: ModelConfig  # with the size and dropout chosen
    tokenizer: CharTokenizer
    default_prime: str
    device: torch.device
    autocast_dtype: torch.dtype | None
    ranks: Ranks
    feed: StreamFeed | LinesFeed
    model: CharLSTM
    net: torch.nn.Module  # the model, or its DDP wrapper
    state: TrainerState
    my_streams: slice  # this rank's block of the streams (a checkpoint holds all of them)
    scaling: BatchScaling
    schedule: WarmupDecay
    record: RunRecord  # config.json, less what changes as it trains (record_now)
    started: float  # (time.perf_counter) when set-up began: --max-time counts set-up, the size probe with it
    resumed: bool
    chosen: tuple[str, ...] = ()  # "dropout", "weight_decay", "base_lr": a new timed run's, refitted with its plan
    line: float = CHARS_PER_PARAM  # the text's size line (autosize.size_line), which the refit counts by

    @property
    def mode(self) -> Mode:
        return mode_of(self.corpus.mode)


@dataclass(frozen=True)
class RunText:
    """The text in the run's vocabulary, and where its weights start."""

    corpus: Corpus
    tokenizer: CharTokenizer
    default_prime: str
    model: ModelConfig | None  # asked for (a resumed run's: its own)
    init_from: InitFrom | None = None
    source: finetune.Source | None = None  # a new fine-tuning run's


def prepare_run(corpus: Corpus, run_dir: Path, model_config: ModelConfig | None, config: TrainConfig, *,
                resume: bool = False, resume_from: int | None = None, force: bool = False, log: Log | None = None,
                ranks: Ranks = SINGLE, started: float | None = None) -> PreparedRun:
    """Set up (or with ``resume``, read back: from the latest resume point, or the one kept
    at step ``resume_from``) the run in ``run_dir`` on ``corpus``; logs its start-up report
    through ``log``. --max-time counts from ``started`` (default: after torch's one-time
    imports here)."""
    import torch._dynamo  # noqa: F401  (AdamW's first construction in a process imports it: ~1 s)

    log, started = log or (lambda message: None), time.perf_counter() if started is None else started
    resume = resume or resume_from is not None
    check_distributed(corpus, config, ranks)
    if config.tensorboard:
        board.check_available()
    device = resolve_device(config.device)
    saved = checkpoint.check_resumable(run_dir) if resume else None
    source = checkpoint.resume_point(run_dir, resume_from) if resume else None
    dtype, precision_note = choose_precision(config.precision, device, ranks, saved.precision_used if saved else None)
    text = run_text(corpus, run_dir, saved, model_config, config)
    feed = make_feed(text.corpus, config, device, ranks)
    if saved is not None:
        decay = config.weight_decay if config.weight_decay is not None else saved.train.weight_decay
        model_config, config = text.model, replace(config, weight_decay=0.01 if decay is None else decay,
                                                   base_lr=config.base_lr or saved.train.scaling(1).base_lr)
        sizing, chosen, line = [], (), CHARS_PER_PARAM
    else:
        chosen = chosen_regularisation(text.model, config)
        model_config, config, sizing, line = fit_model(text.model, config, feed, text.corpus, device, dtype, ranks)
    # Refuse a model the machine cannot hold before building it, with the figures.
    need = memory.estimate(model_config, *feed.largest_batch())
    ranks.check_on_main(lambda: memory.check_fits(need, device, memory.available_bytes(device)))
    model, net, state = build(model_config, config, text.source, device, dtype, feed, ranks)
    record = replace(run_record(model_config, config, text.corpus, text.default_prime, model.num_parameters(), dtype),
                     init_from=text.init_from)
    my_streams = ranks.block(config.batch_size)
    start_or_resume(run_dir, source, force, need.parameters, state, record, text, device, ranks, my_streams, log)
    scaling, schedule = plan_schedule(config, feed, state.progress)
    run = PreparedRun(run_dir, text.corpus, config, model_config, text.tokenizer, text.default_prime, device, dtype,
                      ranks, feed, model, net, state, my_streams, scaling, schedule, record, started, resume, chosen,
                      line)
    if ranks.main:
        write_record(run_dir, record_now(run))
    if ranks.main:  # (one voice; and only rank 0's machine need hold the folder)
        for line in start_report(run, precision_note, sizing):
            log(line)
    return run


# --- the pieces, in the order prepare_run takes them ----------------------------------------
def check_distributed(corpus: Corpus, config: TrainConfig, ranks: Ranks) -> None:
    # (Streams are split in equal blocks; lines mode deals out each batch's items.)
    if ranks.active and not mode_of(corpus.mode).items and config.batch_size % ranks.world:
        raise ChargenError(f"--batch-size {config.batch_size} (the global batch) does not divide among "
                           f"{ranks.world} processes; use a multiple of {ranks.world}")


def choose_precision(precision: str, device: torch.device, ranks: Ranks, saved: str | None
                     ) -> tuple[torch.dtype | None, str]:
    """The autocast dtype, and why. A resumed ``auto`` run keeps the precision it trained in,
    where that still runs, rather than timing again (a close call could flip, and then the
    resume would no longer be exact)."""
    dtype, note = None, ""
    if precision == "auto" and saved in PRECISION_NAMES.values():
        try:
            dtype, note = resolve_precision(saved, device)
            note += ", as the run trained so far"
        except ChargenError:  # it does not run on this machine: choose afresh
            pass
    if not note:
        dtype, note = resolve_precision(precision, device)
    if ranks.active:  # one precision for all: rank 0's (auto times bf16 on each rank)
        dtypes = [None, torch.bfloat16, torch.float16]
        dtype = dtypes[ranks.from_main(dtypes.index(dtype), device)]
    if device.type == "cuda":  # TF32 tensor cores for the fp32 matrix products
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return dtype, note


def run_text(corpus: Corpus, run_dir: Path, saved: RunRecord | None, asked: ModelConfig | None,
             config: TrainConfig) -> RunText:
    """A resumed run's text in its own vocabulary; a fine-tuning run's in the source's, with
    the text's new characters appended; a new run's as it is."""
    if saved is not None:
        model = check_resume(saved, corpus, asked, config)
        tokenizer = checkpoint.read_tokenizer(run_dir)
        if saved.init_from:  # a fine-tuned run: the text's ids in the run's merged vocabulary
            corpus = finetune.adopt_vocabulary(corpus, tokenizer)
        if tokenizer.chars != corpus.tokenizer.chars:  # (the corpus's ids are in its own vocabulary)
            raise ChargenError(f"{run_dir}/{checkpoint.TOKENIZER} does not match the text's characters; "
                               "resume with the run's own folder and text, or start a new run in another --out")
        return RunText(corpus, tokenizer, saved.default_prime, model, saved.init_from)
    if not config.init_from:
        return RunText(corpus, corpus.tokenizer, first_prime(corpus), asked)
    source = finetune.read_source(config.init_from)
    tokenizer, new_chars = finetune.merged_tokenizer(source.tokenizer, corpus.tokenizer)
    asked = finetune.model_for(source, asked, corpus.mode, tokenizer.vocab_size)
    corpus = finetune.adopt_vocabulary(corpus, tokenizer)
    return RunText(corpus, corpus.tokenizer, first_prime(corpus), asked, source.record(new_chars), source)


def check_resume(saved: RunRecord, corpus: Corpus, model_config: ModelConfig | None, config: TrainConfig
                 ) -> ModelConfig:
    """The saved run must match what it is asked to continue with."""
    text = CorpusInfo.of(corpus.source)
    if (saved.corpus.sha256, saved.corpus.val_sha256, saved.corpus.val_fraction) != \
            (text.sha256, text.val_sha256, text.val_fraction):
        raise ChargenError(f"this run was trained on {saved.corpus.path} with a different text or validation split; "
                           "resume with the same file and split, or start a new run in another --out")
    if saved.mode.name != corpus.mode:
        raise ChargenError(f"this run was trained in {saved.mode.name} mode; resume it with --mode {saved.mode.name}")
    if model_config is not None and replace(model_config, vocab_size=saved.model.vocab_size) != saved.model:
        raise ChargenError("the model settings differ from the saved run's; drop them to resume as saved")
    for name in mode_of(corpus.mode).resume_layout:
        if getattr(config, name) != getattr(saved.train, name):
            raise ChargenError(
                f"--{name.replace('_', '-')} differs from the saved run's ({getattr(saved.train, name)}); "
                "the batches would not line up, so resume with the saved value"
            )
    return saved.model


def first_prime(corpus: Corpus) -> str:
    """What samples start from: a stream starts best after a line break; an item starts
    from <bos> (no prime)."""
    if mode_of(corpus.mode).items:
        return ""
    return "\n" if "\n" in corpus.tokenizer else corpus.tokenizer.decode(corpus.train_ids[:1])


def make_feed(corpus: Corpus, config: TrainConfig, device: torch.device,
              ranks: Ranks = SINGLE) -> StreamFeed | LinesFeed:
    if mode_of(corpus.mode).items:
        return LinesFeed(corpus.train_items, corpus.val_items, config.batch_size, config.bucket_factor,
                         config.seed, device, ranks)
    return StreamFeed(corpus.train_ids, corpus.val_ids, config.batch_size, config.bptt, config.variable_bptt,
                      device, ranks)


def planned_steps(progress: Progress) -> int | None:
    """The plan's steps, or None while a timed plan is not fitted yet (TIMED_PLAN is never shown)."""
    return progress.total_steps if progress.total_steps < TIMED_PLAN else None


def requested_steps(config: TrainConfig, steps_per_epoch: int) -> int:
    if config.steps is not None:
        return config.steps
    if config.epochs is None and config.max_time is not None:
        return TIMED_PLAN  # the budget decides: fitted to --max-time after the first steps
    epochs = config.epochs if config.epochs is not None else DEFAULT_EPOCHS
    return max(1, round(epochs * steps_per_epoch))


def text_ids(corpus: Corpus) -> np.ndarray:
    """The ids of the text a run trains on (a list's: its items', validation's among them)."""
    return corpus.train_ids if corpus.train_ids is not None else corpus.train_items.ids


def fit_model(asked: ModelConfig | None, config: TrainConfig, feed: StreamFeed | LinesFeed, corpus: Corpus,
              device: torch.device, dtype: torch.dtype | None, ranks: Ranks
              ) -> tuple[ModelConfig, TrainConfig, list[str], float]:
    """A new run's model: the size asked for or, with --max-time and none asked for, the
    size chosen for the budget; dropout, weight decay and peak learning rate, where not given,
    as the run's epochs call for (chargen.autosize), by the size line drawn for how predictable
    the text is. Rank 0 decides; every rank builds the same. Also the start-up lines that say
    so, and the line."""
    model = replace(asked or ModelConfig(), vocab_size=corpus.tokenizer.vocab_size)
    if asked is not None and None not in (model.dropout, config.weight_decay, config.base_lr):
        return model, config, [], CHARS_PER_PARAM
    bits = bits_per_char(text_ids(corpus))  # (the same on every rank: the same ids)
    line, epochs, sizing = size_line(bits), 0.0, []
    if ranks.main:
        model, epochs, sizing = size_for_budget(model, asked is None, config, feed, bits, device, dtype, ranks)
    layers, hidden, millis = (ranks.from_main(v, device) for v in (model.layers, model.hidden, round(epochs * 1000)))
    epochs, model = millis / 1000, replace(model, layers=layers, hidden=hidden)
    params = memory.parameter_count(model)
    fitting = regularisation(epochs, params, feed.epoch_targets, line)
    dropout = fitting.dropout if model.dropout is None else model.dropout
    weight_decay = fitting.weight_decay if config.weight_decay is None else config.weight_decay
    fine_tune = config.init_from is not None  # (from learnt weights: 3e-3)
    base_lr = config.base_lr or base_lr_for(math.inf if fine_tune else epochs, params, feed.epoch_targets)
    given = [f"--{name}" for name, value in (("dropout", model.dropout), ("weight-decay", config.weight_decay),
                                             ("base-lr", config.base_lr)) if value is not None]
    sizing.append(f"regularisation for {epochs:.3g} epochs at {params / feed.epoch_targets:.2g} parameters per "
                  f"character of the text (exposure {fitting.exposure:.3g}, {counting(bits)}; for the rate "
                  f"{by_characters(epochs, params, feed.epoch_targets):.3g}, by characters): dropout {dropout:g}, "
                  f"weight decay {weight_decay:g}, peak learning rate {base_lr:g}"
                  + (f" ({' and '.join(given)} as given)" if given else f" ({fitting.note})" if fitting.note else ""))
    return replace(model, dropout=dropout), replace(config, weight_decay=weight_decay, base_lr=base_lr), sizing, line


def chosen_regularisation(asked: ModelConfig | None, config: TrainConfig) -> tuple[str, ...]:
    """What of the regularisation a new run leaves to chargen and, with --max-time, to be
    decided again once the plan is fitted to the time: the start-up probe only guesses the
    speed, and the machine may be busier or quieter by the first steps."""
    if config.max_time is None:
        return ()
    given = {"dropout": None if asked is None else asked.dropout, "weight_decay": config.weight_decay,
             "base_lr": config.init_from or config.base_lr}  # (a fine-tune's rate is not the exposure's)
    return tuple(name for name, value in given.items() if value is None)


def same_without_timing(run: PreparedRun) -> str:
    """The flags that make a timed run's model, regularisation and precision without the clock."""
    model = run.model_config
    return (f"the same model and precision without timing: --hidden {model.hidden} --layers {model.layers} "
            f"--embedding {model.embedding} --dropout {model.dropout:g} --weight-decay {run.config.weight_decay:g} "
            f"--base-lr {run.config.base_lr:g} --precision {PRECISION_NAMES[run.autocast_dtype]}")


def size_for_budget(model: ModelConfig, choose: bool, config: TrainConfig, feed: StreamFeed | LinesFeed,
                    bits: float, device: torch.device, dtype: torch.dtype | None, ranks: Ranks
                    ) -> tuple[ModelConfig, float, list[str]]:
    """The size (chosen when ``choose``, by a line drawn for how predictable the text is: its
    ``bits`` a character) and the epochs it will see: those planned, or with --max-time, those
    the probed speed allows in it (if fewer); and the line that says what was chosen."""
    steps = requested_steps(config, feed.steps_per_epoch)
    planned = math.inf if steps >= TIMED_PLAN else steps / feed.steps_per_epoch * feed.epoch_targets
    if config.max_time is None:
        return model, planned / feed.epoch_targets, []
    seconds, (time_steps, batch), line = config.max_time * (1 - VAL_SHARE), feed.typical_batch(), size_line(bits)

    def probe(candidate: ModelConfig) -> float:
        timed = probe_config(candidate, feed.epoch_targets, line)
        return probe_speed(timed, batch, time_steps, device, dtype) * ranks.world

    if not choose:
        return model, min(planned, probe(model) * seconds) / feed.epoch_targets, []
    ladder = tuple(size for size in LADDER if config.max_hidden is None or size[1] <= config.max_hidden)
    choice = choose_size(probe, seconds, feed.epoch_targets, model, time_steps * batch, planned, ladder or LADDER[:1],
                         line)
    said = (f"model: {choice.config.layers}x{choice.config.hidden}, chosen for --max-time {config.max_time:g} "
            f"(--hidden, --layers or --dropout to choose yourself): {choice.reason}; the text takes {bits:.2f} bits "
            f"a character compressed, so a size needs {line:.2g} training characters per parameter "
            f"and {steps_line(line):,.0f} steps")
    return choice.config, choice.chars / feed.epoch_targets, [said]


def param_groups(model: CharLSTM, weight_decay: float) -> list[dict]:
    """Decay matrices only; biases and the like are left alone."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices, "weight_decay": weight_decay}, {"params": others, "weight_decay": 0.0}]


def build(model_config: ModelConfig, config: TrainConfig, source: finetune.Source | None, device: torch.device,
          dtype: torch.dtype | None, feed: StreamFeed | LinesFeed, ranks: Ranks
          ) -> tuple[CharLSTM, torch.nn.Module, TrainerState]:
    """The model (and its DDP wrapper), and the trainer state: AdamW, the gradient scaler,
    the data RNG and the progress at its start."""
    torch.manual_seed(config.seed)
    model = CharLSTM(model_config)
    if source is not None:
        finetune.load_source_weights(model, source)
    model.to(device)
    # DDP averages the ranks' gradients: one step over the global batch. (The same seed
    # gave every rank the same weights; DDP checks that by broadcasting rank 0's.)
    device_ids = [device.index] if device.type == "cuda" else None
    net = DDP(model, device_ids=device_ids) if ranks.active else model
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.base_lr, betas=(0.9, 0.99))
    # fp16 autocast needs its gradients scaled against underflow; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
    requested = requested_steps(config, feed.steps_per_epoch)
    state = TrainerState(model, optimizer, np.random.default_rng(config.seed), scaler,
                         Progress(total_steps=requested, requested_steps=requested))
    return model, net, state


def run_record(model_config: ModelConfig, config: TrainConfig, corpus: Corpus, default_prime: str, n_params: int,
               autocast_dtype: torch.dtype | None) -> RunRecord:
    return RunRecord(mode=mode_of(corpus.mode), model=model_config, train=config, corpus=CorpusInfo.of(corpus.source),
                     default_prime=default_prime, parameters=n_params, precision_used=PRECISION_NAMES[autocast_dtype],
                     chargen_version=__version__)


def start_or_resume(run_dir: Path, source: Path | None, force: bool, n_params: int, state: TrainerState,
                    record: RunRecord, text: RunText, device: torch.device, ranks: Ranks, my_streams: slice,
                    log: Log) -> None:
    """A new run folder (its record first: from then on the folder is chargen's), or the
    resume point ``source`` of the run in it read into ``state``."""
    progress, kept_copies = state.progress, 3 * record.train.keep  # (a resume point: 3 copies of the weights)
    if source is not None:
        if ranks.main and (stale := checkpoint.remove_stale_temps(run_dir)):
            log(f"removed {stale} partial file{'s' * (stale > 1)} left by a process stopped mid-write")
        ranks.check_on_main(lambda: checkpoint.check_room(
            run_dir, 4 * n_params * (checkpoint.RESUME_COPIES + kept_copies)))
        requested = progress.requested_steps
        state.load(run_dir, device, my_streams, source)
        if progress.requested_steps != requested:  # a new plan was asked for
            progress.requested_steps = progress.total_steps = requested
        if source != run_dir / checkpoint.TRAINER:
            ranks.check_on_main(lambda: branch_from(run_dir, source, progress.step, log))
    else:
        def start_folder() -> None:
            checkpoint.prepare_new_run(run_dir, force, 4 * n_params * (checkpoint.NEW_RUN_COPIES + kept_copies))
            write_record(run_dir, record)
            checkpoint.write_tokenizer(run_dir, text.tokenizer)
            if mode_of(text.corpus.mode).items:
                write_item_hashes(run_dir / checkpoint.ITEMS, text.corpus.train_items.strings(text.tokenizer))

        ranks.check_on_main(start_folder)
    if ranks.active:  # different dropout on every rank, as over one batch
        torch.manual_seed(record.train.seed + 7919 * ranks.rank + progress.step)


def branch_from(run_dir: Path, source: Path, step: int, log: Log) -> None:
    """--resume-from: the kept resume point becomes the latest, so that a later --resume goes
    on from here, not from the states given up (they stay kept, under their own steps)."""
    atomic_link(source, run_dir / checkpoint.TRAINER)
    later = [s for s in checkpoint.kept_steps(run_dir) if s > step]
    if later:
        log(f"resuming from the resume point kept at step {step:,}; the ones after it (steps "
            f"{', '.join(f'{s:,}' for s in later)}) are no longer this run's: they stay until you delete them "
            "(one is replaced if this run saves at its step)")


def plan_schedule(config: TrainConfig, feed: StreamFeed | LinesFeed, progress: Progress
                  ) -> tuple[BatchScaling, WarmupDecay]:
    scaling = config.scaling(feed.steps_per_epoch_at(config.base_batch_size))
    # A short plan gets a short warmup: at most half of it.
    schedule = scaling.schedule(config.batch_size, feed.steps_per_epoch, progress.total_steps, config.decay,
                                max_warmup_steps=progress.requested_steps // 2)
    return scaling, schedule


def record_now(run: PreparedRun) -> RunRecord:
    """The run's record with its schedule and where it stands: config.json as it is written."""
    lr_record = run.scaling.describe(run.config.batch_size, run.feed.steps_per_epoch, run.schedule)
    if planned_steps(run.state.progress) is None:  # (a timed plan not fitted yet: its end is not known)
        lr_record |= dict.fromkeys(("decay_steps", "decay_epochs", "final_lr", "total_steps"))
    return run.record.with_summary(summary(run.state.progress), lr_record)


def summary(progress: Progress) -> Summary:
    best = progress.best_val_loss
    return Summary(step=progress.step, total_steps=planned_steps(progress), chars_seen=progress.chars_seen,
                   train_seconds=round(progress.train_seconds, 2), validation_seconds=round(progress.val_seconds, 2),
                   best_val_loss=best, best_val_bpc=None if best is None else bpc(best), best_step=progress.best_step)


def start_report(run: PreparedRun, precision_note: str, sizing: list[str]) -> list[str]:
    """The lines a run starts with: what it reads, its model, its plan and schedule."""
    config, feed, progress, source = run.config, run.feed, run.state.progress, run.corpus.source
    lines = []
    if "mode_reason" in source:  # --mode auto chose
        lines.append(f"mode: {run.mode.name}: {source['mode_reason']} (--mode {'stream' if run.mode.items else 'lines'}"
                     " to override)")
    lines += source.get("skipped", [])
    if "files" in source:
        kind = "their items pooled" if run.mode.items else "each a document, ended by a document break"
        lines.append(f"corpus: {len(source['files']):,} files, {source['chars']:,} characters, {kind}")
    lines.append(f"{'resuming' if run.resumed else 'training'} {run.run_dir}: {feed.describe()}, vocabulary "
                 f"{run.tokenizer.vocab_size}, {run.model.num_parameters():,} parameters, device {run.device} "
                 f"({precision_note})")
    if run.record.init_from:
        lines.append(finetune.describe(run.record.init_from, run.model_config, run.mode.name, run.resumed))
    lines += sizing
    if config.max_time is not None and not run.resumed:  # (what the clock chose, for a run without it)
        lines.append(same_without_timing(run))
    if progress.total_steps >= TIMED_PLAN:
        lines.append(f"plan: steps of {feed.batch_description()} for {config.max_time:g} s, from step "
                     f"{progress.step:,} (the number of steps is fitted to the time after the first few)")
    else:
        lines.append(f"plan: {progress.total_steps:,} steps of {feed.batch_description()} "
                     f"({progress.total_steps / feed.steps_per_epoch:.2f} epochs), from step {progress.step:,}"
                     + (f", at most {config.max_time:g} s" if config.max_time else ""))
        # (a timed plan's schedule is shown once fitted)
        lines.append(format_schedule(run.scaling.describe(config.batch_size, feed.steps_per_epoch, run.schedule)))
    if run.schedule.warmup_steps < round(run.scaling.warmup_epochs(config.batch_size) * feed.steps_per_epoch):
        lines.append(f"warmup cut to {run.schedule.warmup_steps:,} steps: half of this short plan")
    carried = 2 * run.model_config.layers * config.batch_size * run.model_config.hidden if feed.carries_state else 0
    lines.append(checkpoint.describe_disk(run.run_dir, run.model.num_parameters(), carried, config.keep,
                                          config.save_every))
    if config.patience is not None:
        so_far = f" ({progress.since_best} so far)" if progress.since_best else ""
        lines.append(f"early stop: after {config.patience} validations on the whole validation text without a "
                     f"better loss{so_far}")
    return lines
