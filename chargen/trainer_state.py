"""The resume point of a training run (``trainer/state.safetensors`` in its folder): the
weights, AdamW's moments, the carried LSTM state, the RNG states and the progress, in one
file replaced atomically as a whole, so that ``--resume`` continues exactly where training
stopped. The bytes go through ``storage`` (safetensors with a checksum, never pickle).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .checkpoint import TRAINER, WEIGHTS, kept_path
from .errors import ChargenError
from .storage import atomic_link, load_tensors, save_tensors


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
    kept: list[int] = field(default_factory=list)  # --keep: the steps of the resume points kept, oldest first


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

    def save(self, run_dir: Path, train_config: dict, carry: tuple[torch.Tensor, torch.Tensor] | None,
             keep: int = 0) -> None:
        """The resume point in one atomic file, then the latest weights for inference.
        ``carry``: the state of all the streams (distributed, gathered from every rank).
        ``keep``: besides the latest, the resume points of the last ``keep`` saves are kept
        (trainer/step-*.safetensors), the oldest deleted first, once the new one is in place."""
        step, kept_before = self.progress.step, self.progress.kept
        line = [s for s in kept_before if s != step] + [step]  # (a step saved twice is kept once)
        self.progress.kept, retired = (line[-(keep + 1):], line[:-(keep + 1)]) if keep else ([], line[:-1])
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
        try:
            save_tensors(run_dir / TRAINER, tensors, meta)
        except ChargenError:
            self.progress.kept = kept_before  # (the file on disk still lists these)
            raise
        if keep:
            atomic_link(run_dir / TRAINER, kept_path(run_dir, step))
        for old in retired:
            with contextlib.suppress(OSError):  # (gone, or no longer a file: left as it is)
                kept_path(run_dir, old).unlink(missing_ok=True)
        save_tensors(run_dir / WEIGHTS, weights, {"step": step})

    def load(self, run_dir: Path, device: torch.device, streams: slice = slice(None), path: Path | None = None
             ) -> None:
        """Load the resume point (the latest, or ``path``: one kept by --keep) into this
        state, in place: the carried state of ``streams`` (a rank's block of them,
        distributed) and the progress are replaced."""
        path = path or run_dir / TRAINER
        tensors, meta = load_tensors(path, run_dir, f"{run_dir} has no training checkpoint yet (it stopped before "
                                     "the first save, so nothing of it would be lost): start it again with --force")
        try:
            weights = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
            self.model.load_state_dict(weights, strict=True)
            self.optimizer.load_state_dict(unflatten_optimizer(tensors, meta["optimizer"]))
            self.rng.bit_generator.state = meta["numpy_rng"]
            torch.set_rng_state(tensors["rng/torch"])
            if "rng/cuda" in tensors and device.type == "cuda":
                torch.cuda.set_rng_state(tensors["rng/cuda"])
            progress = Progress(**meta["progress"])
            if not (isinstance(progress.kept, list) and all(type(s) is int and s >= 0 for s in progress.kept)):
                raise ValueError(f"kept: {progress.kept!r}")
            if self.scaler.is_enabled() and meta.get("grad_scaler"):
                self.scaler.load_state_dict(meta["grad_scaler"])
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise ChargenError(f"{path} does not match this run ({e}); restore it, or train again in a new "
                           "--out") from None
        for name, value in asdict(progress).items():  # in place: the loop holds this object
            setattr(self.progress, name, value)
        self.carry = None
        if "carry/h" in tensors:
            self.carry = tuple(tensors[f"carry/{part}"][:, streams].contiguous().to(device) for part in "hc")

