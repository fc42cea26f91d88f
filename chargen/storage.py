"""Files that are never half-written and never silently wrong: atomic writes (temp file,
fsync, rename), JSON, tensors in safetensors with a checksum of their contents, and an
append-only log. Nothing here knows what a run folder holds (see ``checkpoint``).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from . import faults
from .errors import ChargenError

TMP_SUFFIX = ".tmp"  # atomic_write's temp files: .NAME.PID.RANDOM.tmp beside the file


def atomic_write(path: Path, data: bytes, then: str = "resume") -> None:
    """Write to a temp file in the same folder, fsync, then rename over ``path``: a reader
    (or a crash) sees the old file or the new one, never half of one. ``then``: what to do
    once the disk or folder is fixed, if the write fails."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # os.open rather than mkstemp: the file gets the usual umask permissions, not 0600.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                faults.write(path, "write")
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            faults.write(path, "rename")
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
                           f"folder, then {then}: the previous {path.name} is intact") from None


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



class MetricsLog:
    """Appends one JSON object per line; each line is flushed so a crash loses none."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
