"""Files that are never half-written and never silently wrong: atomic writes (temp file,
fsync, rename), JSON, tensors in safetensors with a checksum of their contents, and an
append-only log. Nothing here knows what a run folder holds (see ``checkpoint``).

Reading trusts nothing about a file: it must be a regular file (a FIFO would block for
ever, a link to /dev/zero would read until memory runs out), inside the folder it is read
from, no bigger than what chargen writes of its kind; a tensor file's header must declare
exactly the bytes the file holds before any tensor is read or hashed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from . import faults
from .errors import ChargenError

TMP_SUFFIX = ".tmp"  # atomic_write's temp files: .NAME.PID.RANDOM.tmp beside the file
MAX_JSON_BYTES = 64 * 2**20  # config.json lists a corpus's files with their hashes: 100,000 files fit
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header (safetensors' own limit)
LFS_POINTER = b"version https://git-lfs.github.com/spec/"  # how a Git LFS pointer file begins


def atomic_write(path: Path, data: bytes, then: str = "resume") -> None:
    """Write to a temp file in the same folder, fsync, then rename over ``path``: a reader
    (or a crash) sees the old file or the new one, never half of one. ``then``: what to do
    once the disk or folder is fixed, if the write fails."""
    tmp = temp_beside(path)
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
        fsync_folder(path.parent)
    except OSError as e:  # a full disk, a read-only or vanished folder: the old file stands
        raise ChargenError(f"could not write {path} ({e.strerror or e}); free some disk space or fix the "
                           f"folder, then {then}: the previous {path.name} is intact") from None


def temp_beside(path: Path) -> Path:
    """A new temp file's name beside ``path``: .NAME.PID.RANDOM.tmp."""
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"


# A file system without hard links (some network and FUSE ones): the file is copied instead.
NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS)


def atomic_link(source: Path, path: Path) -> None:
    """``path`` becomes a second name for the complete file ``source``, put in place by one
    rename as in ``atomic_write``: a hard link (no copy: the bytes stay on disk once
    ``source`` is replaced by a newer file), or a copy where the file system has no links."""
    tmp = temp_beside(path)
    try:
        try:
            os.link(source, tmp)
        except OSError as e:
            if e.errno not in NO_LINKS:
                raise
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_folder(path.parent)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ChargenError(f"could not write {path} ({e.strerror or e}); free some disk space or fix the folder, "
                           "then resume: the run's latest checkpoint is intact") from None


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, obj: dict) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


# --- reading what may be anything ---------------------------------------------------------
def file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


def real_path(path: Path) -> Path:
    """``path`` with its links followed; a ChargenError for links that loop."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):  # (Python 3.11's resolve raises RuntimeError on a loop)
        raise ChargenError(f"{path} is a link that leads back to itself; replace it with a file or folder") from None


def open_regular(path: Path, folder: Path | None = None, missing: str | None = None) -> int:
    """A read-only descriptor of ``path``, refused unless it is a regular file (and, given
    ``folder``, one inside it once links are followed). ``missing``: the message when it
    does not exist."""
    if folder is not None:
        real, inside = real_path(path), real_path(folder)
        if inside not in real.parents:
            raise ChargenError(f"{path} is a link to {'a file' if real.exists() else 'nothing'} outside {folder}; "
                               "put the file itself in the folder")
    try:
        # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ChargenError(missing or f"{path} is missing") from None
    except OSError as e:
        raise ChargenError(f"cannot read {path} ({e.strerror or e}); check it and its permissions") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ChargenError(f"{path} is {file_kind(mode)}, not a file; chargen reads only regular files: put the "
                           "file itself there")
    return fd


def read_bytes(path: Path, cap: int, folder: Path | None = None, missing: str | None = None) -> bytes:
    """The whole of a regular file (see ``open_regular``) of at most ``cap`` bytes."""
    fd = open_regular(path, folder, missing)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        data = f.read(cap + 1) if size <= cap else b""
    if size > cap or len(data) > cap:
        raise ChargenError(f"{path} is {max(size, len(data)) / 2**20:,.1f} MB, more than chargen ever writes there "
                           f"({cap / 2**20:,.0f} MB at most); is it the right file?")
    return data


def read_json(path: Path, folder: Path | None = None, missing: str | None = None, cap: int = MAX_JSON_BYTES) -> dict:
    """A JSON object from a regular file of at most ``cap`` bytes."""
    data = read_bytes(path, cap, folder, missing or f"{path} is missing; is this a chargen run folder?")
    if data.startswith(LFS_POINTER):
        raise lfs_pointer_error(path)
    try:
        obj = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ChargenError(f"{path} is corrupt (JSON nested too deep); retrain or restore it") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ChargenError(f"{path} is unreadable or corrupt ({e}); retrain or restore it") from None
    if not isinstance(obj, dict):
        raise ChargenError(f"{path} is corrupt (not a JSON object); retrain or restore it")
    return obj


def lfs_pointer_error(path: Path) -> ChargenError:
    return ChargenError(f"{path} is a Git LFS pointer, not the file itself (the repository was cloned without its "
                        "large files); fetch them with 'git lfs install && git lfs pull' in the repository")


# --- tensors ------------------------------------------------------------------------------
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


def tensor_header(path: Path, folder: Path | None = None, missing: str | None = None) -> dict[str, dict]:
    """A safetensors file's header (name -> dtype, shape, data_offsets; and
    ``__metadata__``), read without its tensors, refused unless it declares exactly the
    bytes the file holds."""
    fd = open_regular(path, folder, missing or f"{path} is missing; the run has no checkpoint there")
    with os.fdopen(fd, "rb") as f:
        size, start = os.fstat(fd).st_size, f.read(len(LFS_POINTER))
        if start == LFS_POINTER:
            raise lfs_pointer_error(path)
        (length,) = struct.unpack("<Q", start[:8]) if len(start) >= 8 else (-1,)
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise ChargenError(f"{path} is corrupt or not a checkpoint (truncated, or not a safetensors file: "
                               f"{size:,} bytes); retrain or restore it")
        f.seek(8)
        try:
            header = json.loads(f.read(length))
            ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
        except (ValueError, RecursionError, TypeError, KeyError, IndexError, AttributeError):
            raise ChargenError(f"{path} has a corrupt header; retrain or restore it") from None
    declared = 8 + length + max((e for e in ends if isinstance(e, int)), default=0)
    if declared != size:
        raise ChargenError(f"{path} is corrupt{' (truncated)' if size < declared else ''}: its header declares "
                           f"{declared:,} bytes, the file has {size:,}; retrain or restore it")
    return header


def load_tensors(path: Path, folder: Path | None = None, missing: str | None = None
                 ) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and metadata from a file written by ``save_tensors``; refuses anything
    missing, truncated, altered, or not ours."""
    tensor_header(path, folder, missing)
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
        info = json.loads(meta["chargen"])
    except (json.JSONDecodeError, RecursionError):
        raise ChargenError(f"{path} has corrupt metadata; retrain or restore it") from None
    if not isinstance(info, dict):
        raise ChargenError(f"{path} has corrupt metadata; retrain or restore it")
    return tensors, info


class MetricsLog:
    """Appends one JSON object per line; each line is flushed so a crash loses none."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
