"""The training settings (``TrainConfig``): what ``chargen train`` takes as flags and a run's
``config.json`` keeps, checked when made, whether from flags, from the API or from a file."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from .checks import MAX_SEED, check_field_types, check_finite
from .device import PRECISIONS
from .errors import ChargenError
from .schedule import BatchScaling, WarmupDecay

DEFAULT_EPOCHS = 10
MAX_SAMPLE_CHARS = 100_000  # the sample printed at each validation: past this, a long wait for a glimpse
MAX_EPOCHS = 1e9  # a bound that keeps every step count an exact integer
MAX_KEEP = 10_000  # --keep: a bound on the files of one run folder


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
    base_lr: float | None = None  # None: by the run's exposure (chargen.autosize.base_lr_for)
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
    save_every: float | None = None  # minutes between checkpoints besides those of validations
    keep: int = 0  # earlier resume points kept besides the latest (for --resume-from)
    patience: int | None = None  # stop after this many whole-text validations without a better loss
    log_every: int = 10
    sample_chars: int = 200
    seed: int = 1234
    device: str = "auto"
    precision: str = "auto"  # bf16 autocast where the hardware has it, else fp32
    init_from: str | None = None  # a run or model folder whose weights a new run starts from (chargen.finetune)
    max_hidden: int | None = None  # --max-time's choice of size goes no wider (a server owner's cap; chargen.serving)
    tensorboard: bool = False  # mirror the metrics and samples to TensorBoard under RUN_DIR/tb (chargen.board)

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("batch_size", "bptt", "bucket_factor", "eval_every", "log_every"):
            if getattr(self, name) <= 0:
                raise ChargenError(f"--{name.replace('_', '-')} must be positive, not {getattr(self, name)}")
        for name in ("epochs", "steps", "max_time", "clip", "save_every"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ChargenError(f"--{name.replace('_', '-')} must be positive and finite, not {value}")
        for name in ("epochs", "base_warmup_epochs"):
            if (getattr(self, name) or 0) > MAX_EPOCHS:
                raise ChargenError(f"--{name.replace('_', '-')} must be at most {MAX_EPOCHS:g}, "
                                   f"not {getattr(self, name)}")
        # Past these AdamW diverges at the first step, or decay flips the weights' sign.
        if self.base_lr is not None and not 0 < self.base_lr < 1:
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
        if not 0 <= self.keep <= MAX_KEEP:
            raise ChargenError(f"--keep must be 0 to {MAX_KEEP:,}, not {self.keep}")
        if self.patience is not None and self.patience < 1:
            raise ChargenError(f"--patience must be 1 or more, not {self.patience}")
        if self.precision not in PRECISIONS:
            raise ChargenError(f"--precision is one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.max_hidden is not None and self.max_hidden < 1:
            raise ChargenError(f"max_hidden must be positive, not {self.max_hidden}")
        if self.warmup_steps < 0:
            raise ChargenError(f"--warmup-steps must be 0 or more, not {self.warmup_steps}")
        reference = self.scaling(1)  # validates the reference and the scheme
        WarmupDecay(reference.base_lr, self.warmup_steps, 1, self.decay)  # validates the decay
        check_finite(self)

    def scaling(self, base_steps_per_epoch: int) -> BatchScaling:
        """The reference setting; a warmup given in steps becomes epochs at the base batch."""
        warmup = self.base_warmup_epochs
        if warmup is None:
            warmup = self.warmup_steps / base_steps_per_epoch
        lr = BatchScaling.base_lr if self.base_lr is None else self.base_lr  # (None: the run decides; until then this)
        return BatchScaling(self.lr_scaling, self.base_batch_size, lr, warmup)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
