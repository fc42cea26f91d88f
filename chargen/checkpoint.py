"""The run folder: atomic writes and safe loads (safetensors + JSON, never pickle).

    RUN_DIR/
      config.json               model and training config, corpus info, format version
      tokenizer.json            Hugging Face tokenizers format
      model.safetensors         latest weights
      best.safetensors          best weights by validation loss
      trainer/state.safetensors everything a resume needs, in one file so that it is
                                replaced atomically as a whole: weights, optimizer,
                                carried LSTM state, RNG states, and (as JSON in the
                                safetensors metadata) step, epoch, stream position...
      metrics.jsonl             one JSON line per log or validation event

Every tensor file carries a SHA-256 of its tensors in its metadata, so a truncated or
bit-flipped file is refused rather than silently loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from .errors import ChargenError
from .tokenizer import CharTokenizer

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
TMP_SUFFIX = ".tmp"  # atomic_write's temp files: .NAME.PID.RANDOM.tmp beside the file
# fp32 copies of the parameters a run folder holds: the weights in model, best and the trainer
# state (with AdamW's two moments), and the trainer state's temp file while it is replaced.
NEW_RUN_COPIES, RESUME_COPIES = 8, 3


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over ``path``: a reader
    (or a crash) sees the old file or the new one, never half of one."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # os.open rather than mkstemp: the file gets the usual umask permissions, not 0600.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:  # a full disk, a read-only or vanished folder: the old file stands
        raise ChargenError(f"could not write {path} ({e.strerror or e}); free some disk space or fix the "
                           f"folder, then resume: the previous {path.name} is intact") from None


def remove_stale_temps(run_dir: Path) -> int:
    """Delete temp files left by a process killed mid-write (never read: a checkpoint is
    only ever the renamed, complete file). Returns how many there were."""
    stale = [p for folder in (run_dir, run_dir / "trainer") if folder.is_dir()
             for p in folder.glob(f".*{TMP_SUFFIX}")]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def write_json(path: Path, obj: dict) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ChargenError(f"{path} is missing; is this a chargen run folder?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ChargenError(f"{path} is unreadable or corrupt ({e}); retrain or restore it") from None
    if not isinstance(data, dict):
        raise ChargenError(f"{path} is corrupt (not a JSON object); retrain or restore it")
    return data


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """Atomically write tensors (moved to CPU) with JSON metadata and a checksum."""
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    meta = {"chargen": json.dumps(metadata or {}), "sha256": _digest(tensors)}
    atomic_write(path, safetensors_bytes(tensors, metadata=meta))


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and metadata from a file written by ``save_tensors``; refuses anything
    missing, truncated, altered, or not ours."""
    if not path.is_file():
        raise ChargenError(f"{path} is missing; the run has no checkpoint there")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ChargenError(f"{path} is corrupt or not a checkpoint ({e}); retrain or restore it") from None
    if "sha256" not in meta or "chargen" not in meta:
        raise ChargenError(f"{path} was not written by chargen; refusing to load it")
    if _digest(tensors) != meta["sha256"]:
        raise ChargenError(f"{path} is corrupt (checksum mismatch); retrain or restore it")
    try:
        return tensors, json.loads(meta["chargen"])
    except json.JSONDecodeError:
        raise ChargenError(f"{path} has corrupt metadata; retrain or restore it") from None


# --- the run folder --------------------------------------------------------------------
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
    if out_dir.resolve() == run_dir.resolve() or run_dir.resolve() in out_dir.resolve().parents:
        raise ChargenError("export needs a folder of its own, not the run folder or one inside it")
    if out_dir.exists() and not out_dir.is_dir():
        raise ChargenError(f"{out_dir} is a file; give a folder to export to")
    if (out_dir / TRAINER).exists():  # --force replaces a model folder, never a training run
        raise ChargenError(f"{out_dir} holds a training run; export to another folder")
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise ChargenError(f"{out_dir} exists and is not empty; choose a new folder (or --force)")
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


class MetricsLog:
    """Appends one JSON object per line; each line is flushed so a crash loses none."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _hashes(items: Iterable[str]) -> np.ndarray:
    # (fromiter fills the array as the items come: a list of millions of digests is not kept)
    return np.fromiter((int.from_bytes(hashlib.blake2b(item.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                       "little", signed=True) for item in items), dtype=np.int64)


def write_items(run_dir: Path, items: Iterable[str]) -> None:
    """A sorted 64-bit hash of every training item: enough to tell whether a sample is one
    of them, at 8 bytes an item, without keeping the list."""
    hashes = np.sort(_hashes(items))
    save_tensors(run_dir / ITEMS, {"hashes": torch.from_numpy(hashes)}, {"items": len(hashes)})


def read_items(run_dir: Path) -> torch.Tensor:
    path = run_dir / ITEMS
    if not path.exists():
        raise ChargenError(f"{path} is missing: only a run trained in lines mode knows its training items")
    return load_tensors(path)[0]["hashes"]


def known_items(hashes: torch.Tensor, items: list[str]) -> list[bool]:
    """For each item, whether it is one of the hashed ones."""
    if not items:
        return []
    return torch.isin(torch.from_numpy(_hashes(items).copy()), hashes).tolist()
