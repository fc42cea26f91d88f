"""The run folder: what it holds, and how a run is started, saved, resumed and exported.
The bytes go through ``storage`` (atomic writes; safetensors + JSON with checksums, never
pickle).

    RUN_DIR/
      config.json               model and training config, corpus info, format version
      tokenizer.json            Hugging Face tokenizers format
      model.safetensors         latest weights
      best.safetensors          best weights by validation loss
      trainer/state.safetensors the trainer state (``TrainerState``): everything a resume
                                needs, in one file so that it is replaced atomically as a
                                whole: weights, optimizer, carried LSTM state, RNG states,
                                and (as JSON in the safetensors metadata) step, epoch,
                                stream position, plan...
      metrics.jsonl             one JSON line per log or validation event
      train_items.safetensors   lines mode: a hash of every training item (see ``lines``)
      tb/                       with --tensorboard: TensorBoard's event files (``board``)

Every tensor file carries a SHA-256 of its tensors in its metadata, so a truncated or
bit-flipped file is refused rather than silently loaded.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from . import faults
from .errors import ChargenError
from .storage import TMP_SUFFIX, MetricsLog, atomic_write, load_tensors, read_json, save_tensors, write_json
from .tokenizer import CharTokenizer

__all__ = ["MetricsLog", "Progress", "TrainerState", "atomic_write", "load_tensors", "save_tensors"]

FORMAT = "chargen-run"
FORMAT_VERSION = 1
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
WEIGHTS = "model.safetensors"
BEST = "best.safetensors"
TRAINER = "trainer/state.safetensors"
METRICS = "metrics.jsonl"
ITEMS = "train_items.safetensors"  # lines mode: a hash of every training item
RUN_FILES = (CONFIG, TOKENIZER, WEIGHTS, BEST, TRAINER, METRICS, ITEMS)
# fp32 copies of the parameters a run folder holds: the weights in model, best and the trainer
# state (with AdamW's two moments), and the trainer state's temp file while it is replaced.
NEW_RUN_COPIES, RESUME_COPIES = 8, 3


# --- the run folder --------------------------------------------------------------------
def remove_stale_temps(run_dir: Path) -> int:
    """Delete temp files left by a process killed mid-write (never read: a checkpoint is
    only ever the renamed, complete file). Returns how many there were."""
    stale = [p for folder in (run_dir, run_dir / "trainer") if folder.is_dir()
             for p in folder.glob(f".*{TMP_SUFFIX}")]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def holds_run(run_dir: Path) -> bool:
    return (run_dir / CONFIG).exists()


def prepare_new_run(run_dir: Path, force: bool, checkpoint_bytes: int = 0) -> None:
    """Make ``run_dir`` ready for a new run without overwriting anything unasked; refuse a
    folder that cannot hold its checkpoints before anything is replaced."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ChargenError(f"{run_dir} is a file; --out needs a folder")
    if holds_run(run_dir) and not force:
        raise ChargenError(
            f"{run_dir} already holds a run; pass --resume to continue it, "
            "--force to replace it, or choose another --out"
        )
    if run_dir.is_dir() and not holds_run(run_dir) and any(run_dir.iterdir()) and not force:
        raise ChargenError(f"{run_dir} exists and is not empty; choose a new --out folder (or --force)")
    check_room(run_dir, checkpoint_bytes)
    if force:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "trainer", ignore_errors=True)


def check_room(run_dir: Path, checkpoint_bytes: int) -> None:
    """``run_dir`` exists (made if need be), takes a new file, and has room for the run's
    checkpoints: found out at the start, not at the first save an interval in."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test.{os.getpid()}{TMP_SUFFIX}"
        faults.write(probe, "write")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
        free = shutil.disk_usage(run_dir).free
    except OSError as e:
        raise ChargenError(f"cannot write to {run_dir} ({e.strerror or e}); choose a folder you can write to") \
            from None
    if free < checkpoint_bytes:
        raise ChargenError(f"{run_dir} has {free / 2**20:,.0f} MB free, but its files need about "
                           f"{checkpoint_bytes / 2**20:,.0f} MB; free some space or choose another folder")


def read_config(run_dir: Path) -> dict:
    """``config.json`` of a run, checked for format and version."""
    if not run_dir.is_dir():
        raise ChargenError(f"{run_dir}: no such run folder; train one with 'chargen train'")
    config = read_json(run_dir / CONFIG)
    if config.get("format") != FORMAT:
        raise ChargenError(f"{run_dir / CONFIG} is not a chargen run config")
    version = config.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ChargenError(
            f"{run_dir} was written by a newer chargen (format {version}); upgrade chargen"
        )
    if not isinstance(config.get("model"), dict) or not isinstance(config.get("train"), dict):
        raise ChargenError(f"{run_dir / CONFIG} is corrupt (no model or train section)")
    return config


def write_config(run_dir: Path, config: dict) -> None:
    write_json(run_dir / CONFIG, {"format": FORMAT, "format_version": FORMAT_VERSION, **config})


def read_tokenizer(run_dir: Path) -> CharTokenizer:
    try:
        text = (run_dir / TOKENIZER).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChargenError(f"{run_dir / TOKENIZER} is missing; the run folder is incomplete") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ChargenError(f"{run_dir / TOKENIZER} is unreadable ({e})") from None
    return CharTokenizer.from_json(text)


def write_tokenizer(run_dir: Path, tokenizer: CharTokenizer) -> None:
    atomic_write(run_dir / TOKENIZER, tokenizer.to_json().encode("utf-8"))


def weights_path(run_dir: Path, which: str = "best") -> Path:
    """``best`` falls back to the latest weights when no validation has run yet."""
    if which not in ("best", "latest"):
        raise ChargenError(f"weights must be 'best' or 'latest', not {which!r}")
    best = run_dir / BEST
    return best if which == "best" and best.exists() else run_dir / WEIGHTS


def export_run(run_dir: Path, out_dir: Path, weights: str = "best", force: bool = False) -> Path:
    """A model folder for serving and sharing: config, tokenizer, the chosen weights (as the
    folder's only weights) and, in lines mode, the training-item hashes; no trainer state
    or metrics. It loads like any run folder but cannot be resumed."""
    config = read_config(run_dir)
    source = weights_path(run_dir, weights)
    load_tensors(source)  # refuse a damaged file before copying it
    check_export_target(run_dir, out_dir, force)
    check_room(out_dir, source.stat().st_size)
    for name in RUN_FILES:
        if (out_dir / name).is_file():
            (out_dir / name).unlink()
    shutil.rmtree(out_dir / "trainer", ignore_errors=True)
    atomic_write(out_dir / WEIGHTS, source.read_bytes())
    atomic_write(out_dir / TOKENIZER, (run_dir / TOKENIZER).read_bytes())
    if (run_dir / ITEMS).exists():
        atomic_write(out_dir / ITEMS, (run_dir / ITEMS).read_bytes())
    config = {k: v for k, v in config.items() if k not in ("format", "format_version")}
    write_config(out_dir, config | {"exported": {"from": run_dir.name, "weights": weights}})
    return out_dir


def check_export_target(run_dir: Path, out_dir: Path, force: bool) -> None:
    """Refuse an export folder that is the run, inside it, a file, a training run, or (without
    ``force``) a folder with something in it."""
    if out_dir.resolve() == run_dir.resolve() or run_dir.resolve() in out_dir.resolve().parents:
        raise ChargenError("export needs a folder of its own, not the run folder or one inside it")
    if out_dir.exists() and not out_dir.is_dir():
        raise ChargenError(f"{out_dir} is a file; give a folder to export to")
    if (out_dir / TRAINER).exists():  # --force replaces a model folder, never a training run
        raise ChargenError(f"{out_dir} holds a training run; export to another folder")
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise ChargenError(f"{out_dir} exists and is not empty; choose a new folder (or --force)")


def load_weights(model: torch.nn.Module, path: Path) -> dict:
    """Load weights into ``model``; returns the file's metadata."""
    tensors, meta = load_tensors(path)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise ChargenError(
            f"{path} does not fit the model in config.json ({first[1].strip() if len(first) > 1 else first[0]})"
        ) from None
    return meta


# --- optimizer state <-> flat tensors -----------------------------------------------------
def flatten_optimizer(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, per_param in state_dict["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"optim/{idx}/{key}"] = value
            else:
                scalars[f"{idx}/{key}"] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], info: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optim/"):
            _, idx, key = name.split("/", 2)
            state.setdefault(int(idx), {})[key] = value
    for name, value in info.get("scalars", {}).items():
        idx, key = name.split("/", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": info["param_groups"]}


# --- the trainer state --------------------------------------------------------------------
@dataclass
class Progress:
    """Where the run stands: saved with every checkpoint, restored by resume."""

    step: int = 0
    epoch: int = 0
    position: int = 0  # the next batch: a row of the streams, or (lines mode) a batch of the epoch
    total_steps: int = 0  # the plan, after fitting it to --max-time
    requested_steps: int = 0  # the plan as asked for by --steps / --epochs
    best_val_loss: float | None = None
    best_step: int | None = None  # where best_val_loss was reached (best.safetensors)
    since_best: int = 0  # whole-text validations since then that did no better (--patience)
    last_val_loss: float | None = None
    chars_seen: int = 0
    train_seconds: float = 0.0
    val_seconds: float = 0.0  # validation and its samples
    lr_factor: float = 1.0  # halved each time a NaN or inf loss sends the run back to a checkpoint
    nonfinite: int = 0  # how many times that has happened


@dataclass
class TrainerState:
    """What a run resumes from, live: the weights (in ``model``), AdamW's moments, the data
    RNG, the gradient scaler, the carried LSTM state and the progress (position and plan).
    Torch's own RNG states go with it. Saved as one file, replaced atomically."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rng: np.random.Generator
    scaler: torch.amp.GradScaler
    progress: Progress
    carry: tuple[torch.Tensor, torch.Tensor] | None = None

    def save(self, run_dir: Path, train_config: dict, carry: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The resume point in one atomic file, then the latest weights for inference.
        ``carry``: the state of all the streams (distributed, gathered from every rank)."""
        weights = self.model.state_dict()
        optim_tensors, optim_info = flatten_optimizer(self.optimizer.state_dict())
        tensors = {f"model/{k}": v for k, v in weights.items()} | optim_tensors
        tensors["rng/torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            tensors["rng/cuda"] = torch.cuda.get_rng_state()
        if carry is not None:
            tensors["carry/h"], tensors["carry/c"] = carry
        meta = {
            "progress": asdict(self.progress),
            "optimizer": optim_info,
            "numpy_rng": self.rng.bit_generator.state,
            "train": train_config,
            "grad_scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
        }
        save_tensors(run_dir / TRAINER, tensors, meta)
        save_tensors(run_dir / WEIGHTS, weights, {"step": self.progress.step})

    def load(self, run_dir: Path, device: torch.device, streams: slice = slice(None)) -> None:
        """Load the resume point into this state, in place: the carried state of ``streams``
        (a rank's block of them, distributed) and the progress are replaced."""
        path = run_dir / TRAINER
        if not path.exists():
            raise ChargenError(f"{run_dir} has no training checkpoint yet (it stopped before the first save); "
                               "start it again with --force")
        tensors, meta = load_tensors(path)
        try:
            weights = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
            self.model.load_state_dict(weights, strict=True)
            self.optimizer.load_state_dict(unflatten_optimizer(tensors, meta["optimizer"]))
            self.rng.bit_generator.state = meta["numpy_rng"]
            torch.set_rng_state(tensors["rng/torch"])
            if "rng/cuda" in tensors and device.type == "cuda":
                torch.cuda.set_rng_state(tensors["rng/cuda"])
            progress = Progress(**meta["progress"])
            if self.scaler.is_enabled() and meta.get("grad_scaler"):
                self.scaler.load_state_dict(meta["grad_scaler"])
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise ChargenError(f"{path} does not match this run ({e}); start again with --force") from None
        for name, value in asdict(progress).items():  # in place: the loop holds this object
            setattr(self.progress, name, value)
        self.carry = None
        if "carry/h" in tensors:
            self.carry = tuple(tensors[f"carry/{part}"][:, streams].contiguous().to(device) for part in "hc")

