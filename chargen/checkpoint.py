"""The run folder: what it holds, what of it is chargen's, and how it is read, started,
replaced and exported. The bytes go through ``storage`` (atomic writes; safetensors + JSON
with checksums, never pickle; reads that trust nothing about a file), config.json through
``record``, and the resume point through ``trainer_state``.

    RUN_DIR/
      config.json               the run record (chargen.record): settings, corpus, summary
      tokenizer.json            Hugging Face tokenizers format
      model.safetensors         latest weights
      best.safetensors          best weights by validation loss
      trainer/state.safetensors the trainer state (chargen.trainer_state): what a resume needs
      trainer/step-*.safetensors with --keep N: the last N+1 resume points by step (the latest
                                is a second name of state.safetensors), for --resume-from
      metrics.jsonl             one JSON line per log or validation event
      train_items.safetensors   lines mode: a hash of every training item (see ``lines``)
      tb/                       with --tensorboard: TensorBoard's event files (``board``)

An exported model folder holds config.json (with ``exported``), tokenizer.json,
model.safetensors, README.md (its card) and, in lines mode, train_items.safetensors; a web
page folder (``export --web``) its page files and model.json. A folder is chargen's when
its record says so; only then does ``--force`` replace it, and then only chargen's own
files in it: anything else there stays as it was.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from . import faults, memory
from .board import TB_DIR
from .errors import ChargenError
from .model import ModelConfig
from .record import CONFIG, FORMAT, RunRecord, read_record
from .storage import (
    TMP_SUFFIX,
    atomic_write,
    fsync_folder,
    load_tensors,
    read_bytes,
    read_json,
    real_path,
    temp_beside,
    tensor_header,
)
from .tokenizer import CharTokenizer

TOKENIZER = "tokenizer.json"
WEIGHTS = "model.safetensors"
BEST = "best.safetensors"
TRAINER = "trainer/state.safetensors"
METRICS = "metrics.jsonl"
ITEMS = "train_items.safetensors"  # lines mode: a hash of every training item
KEPT = re.compile(r"step-(\d{9})\.safetensors")  # in trainer/: a resume point kept by --keep
WRITE_TEST = re.compile(rf"\.write-test\.\d+{re.escape(TMP_SUFFIX)}")  # check_room's probe file
CARD = "README.md"  # a model folder's card (chargen.card)
PAGE_FORMAT, PAGE_HEADER = "chargen-web", "model.json"
RUN_FILES = (CONFIG, TOKENIZER, WEIGHTS, BEST, TRAINER, METRICS, ITEMS)
MODEL_FILES = (CONFIG, TOKENIZER, WEIGHTS, ITEMS, CARD)
PAGE_FILES = ("index.html", "chargen.js", PAGE_HEADER, "weights.bin", CARD)
MAX_TOKENIZER_BYTES = 16 * 2**20  # 20,000 characters take about 1 MB
# fp32 copies of the parameters a run folder holds: the weights in model, best and the trainer
# state (with AdamW's two moments), and the trainer state's temp file while it is replaced.
NEW_RUN_COPIES, RESUME_COPIES = 8, 3


# --- what a folder is -------------------------------------------------------------------
def describe_folder(folder: Path) -> str:
    """``missing``, ``file`` (not a folder), ``empty``, ``run`` (a training run's record),
    ``model`` (an exported model's), ``page`` (a web page export) or ``other``."""
    if not folder.exists():
        return "missing"
    if not folder.is_dir():
        return "file"
    if not any(folder.iterdir()):
        return "empty"
    return record_kind(folder) or ("empty" if only_leftovers(folder) else "other")


def leftovers(folder: Path) -> list[Path]:
    """chargen's own temp files in ``folder`` (not its subfolders), left by a process killed
    mid-write: a record's, a checkpoint's or the write test's (``check_room``)."""
    names = tuple(name for name in dict.fromkeys(RUN_FILES + MODEL_FILES + PAGE_FILES) if "/" not in name)
    return stale_temps(folder, names) + [p for p in folder.glob(f".write-test.*{TMP_SUFFIX}")
                                         if WRITE_TEST.fullmatch(p.name) and p.is_file() and not p.is_symlink()]


def only_leftovers(folder: Path, most: int = 64) -> bool:
    """Whether all ``folder`` holds is chargen's temp files (``leftovers``): a run killed while
    it wrote its first record, before the folder was a run; its command, run again, starts it."""
    entries = list(itertools.islice(folder.iterdir(), most))
    return len(entries) < most and set(entries) <= set(leftovers(folder))


def record_kind(folder: Path) -> str | None:
    """``run``, ``model`` or ``page``: the chargen folder that ``folder``'s record (its
    config.json, or a page's model.json) says it is, its other fields unchecked; else None."""
    for name, kind in ((CONFIG, "run"), (PAGE_HEADER, "page")):
        try:
            record = read_json(folder / name, folder)
        except ChargenError:  # (missing, not a regular file, too big, not JSON)
            continue
        if kind == "run" and record.get("format") == FORMAT:
            return "model" if record.get("exported") is not None else "run"
        if kind == "page" and record.get("format") == PAGE_FORMAT:
            return "page"
    return None


def ours(folder: Path, kind: str) -> list[Path]:
    """The files in ``folder`` (a ``kind`` of chargen folder) that chargen wrote there: its
    own names, TensorBoard's event files under tb/, and its own temp files."""
    names = {"run": RUN_FILES, "model": MODEL_FILES, "page": PAGE_FILES}[kind]
    found = [folder / name for name in names if (folder / name).is_file() or (folder / name).is_symlink()]
    if kind == "run" and (folder / TB_DIR).is_dir():
        found += sorted((folder / TB_DIR).glob("events.out.tfevents.*"))
    if kind == "run":
        found += [kept_path(folder, step) for step in kept_steps(folder)]
    return found + stale_temps(folder, names)


def stale_temps(folder: Path, names: tuple[str, ...] = RUN_FILES) -> list[Path]:
    """Temp files that ``storage.atomic_write`` left for one of ``names`` when its process
    was killed mid-write (never read: a checkpoint is only ever the renamed, complete file);
    regular files only: atomic_write never makes a link, so a link of that name is not ours."""
    found = []
    wanted = [(name, re.escape(Path(name).name)) for name in names]
    if TRAINER in names:
        wanted.append((TRAINER, KEPT.pattern))
    for name, file_name in wanted:
        where = (folder / name).parent
        pattern = re.compile(rf"\.{file_name}\.\d+\.[0-9a-f]{{8}}{re.escape(TMP_SUFFIX)}")
        if where.is_dir():
            found += [p for p in where.iterdir() if pattern.fullmatch(p.name) and p.is_file() and not p.is_symlink()]
    return found


def remove_stale_temps(run_dir: Path) -> int:
    """Delete a run's stale temp files; how many there were."""
    stale = stale_temps(run_dir)
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def remove_ours(folder: Path, kind: str) -> None:
    """Delete chargen's files from ``folder``, and its own subfolders once empty; nothing else."""
    for path in ours(folder, kind):
        path.unlink(missing_ok=True)
    for sub in (folder / "trainer", folder / TB_DIR):
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()


def refusal(folder: Path, kind: str, flag: str) -> str:
    """Why ``folder`` (of ``kind``) is not written to; ``flag`` names the folder's option."""
    if kind == "file":
        return f"{folder} is a file; {flag} needs a folder"
    if kind == "other":
        return (f"{folder} is not empty and is not a chargen folder (it has no chargen config.json); chargen writes "
                f"only into a new or empty folder or its own: choose another {flag}")
    what = {"run": "a training run", "model": "an exported model", "page": "a web page export"}[kind]
    return f"{folder} already holds {what}; choose another {flag}"


def prepare_new_run(run_dir: Path, force: bool, checkpoint_bytes: int = 0) -> None:
    """Make ``run_dir`` ready for a new run without overwriting anything unasked, and never
    anything that is not chargen's; refuse a folder that cannot hold its checkpoints before
    anything is replaced."""
    kind = describe_folder(run_dir)
    if kind == "run" and not force:
        raise ChargenError(f"{run_dir} already holds a run; continue it with --resume, or choose another --out")
    if kind in ("file", "other", "page") or (kind == "model" and not force):
        raise ChargenError(refusal(run_dir, kind, "--out"))
    check_room(run_dir, checkpoint_bytes)
    if kind in ("run", "model"):
        remove_ours(run_dir, kind)
    elif kind == "empty" and run_dir.is_dir():
        for path in leftovers(run_dir):
            path.unlink(missing_ok=True)


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


def has_resume_point(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a training run with a checkpoint to resume from (one that
    died before its first checkpoint has none: starting it again loses nothing)."""
    return describe_folder(run_dir) == "run" and (run_dir / TRAINER).is_file()


def kept_path(run_dir: Path, step: int) -> Path:
    """Where --keep keeps the resume point of ``step``."""
    return run_dir / Path(TRAINER).parent / f"step-{step:09d}.safetensors"


def kept_steps(run_dir: Path) -> list[int]:
    """The steps whose resume points ``run_dir`` keeps (regular files by their names)."""
    where = run_dir / Path(TRAINER).parent
    if not where.is_dir():
        return []
    return sorted(int(m.group(1)) for p in where.iterdir() if (m := KEPT.fullmatch(p.name)) and p.is_file())


def resume_point(run_dir: Path, step: int | None) -> Path:
    """The file a resume reads: the latest resume point, or (``step``) the one kept there."""
    if step is None:
        return run_dir / TRAINER
    kept = kept_steps(run_dir)
    if step not in kept:
        held = f"it keeps steps {', '.join(f'{s:,}' for s in kept)}" if kept else "it keeps none (--keep N keeps them)"
        raise ChargenError(f"{run_dir} has no resume point kept at step {step:,}; {held}")
    return kept_path(run_dir, step)


def checkpoint_bytes(n_params: int, carried: int = 0) -> int:
    """A resume point's size: the weights, AdamW's two moments and ``carried`` state values,
    all float32 (the header and the RNG states are a few kB)."""
    return 4 * (3 * n_params + carried)


def describe_disk(run_dir: Path, n_params: int, carried: int, keep: int, save_every: float | None) -> str:
    """What the run's checkpoints take on disk, what is free there, and when they are saved:
    said at start-up."""
    size = memory.size_text
    state, weights = checkpoint_bytes(n_params, carried), 4 * n_params
    kept = f", {size(state)} for each of the {keep} earlier ones kept (--keep)" if keep else ""
    clock = f" and every {save_every:g} min (--save-every)" if save_every else ""
    return (f"checkpoints: {size(state)} for the resume point and {size(weights)} for each of the latest and best "
            f"weights{kept}; {size(state * (1 + keep) + 2 * weights)} in all, with "
            f"{size(shutil.disk_usage(run_dir).free)} free there; saved with each validation{clock}")


def check_resumable(run_dir: Path) -> RunRecord:
    """The record of the training run in ``run_dir``, refused (without advice that would lose
    it) where the folder holds no run to resume."""
    kind = describe_folder(run_dir)
    if kind in ("missing", "empty"):
        raise ChargenError(f"{run_dir} holds no run to resume; drop --resume to start one there")
    if kind == "model":
        raise ChargenError(f"{run_dir} is an exported model, not a training run, and cannot be resumed; train on "
                           f"from it in a new folder with --init-from {run_dir} --out NEW_FOLDER")
    if kind != "run":
        raise ChargenError(f"{run_dir} is not a chargen run (it has no readable chargen config.json); nothing to "
                           "resume there" if kind == "other" else refusal(run_dir, kind, "--out"))
    return read_record(run_dir)


def inside_chargen_folder(path: Path) -> Path | None:
    """The run, model or page folder that ``path`` would be in, at any depth, if any."""
    for folder in real_path(path).parents:
        if record_kind(folder) is not None:
            return folder
    return None


# --- reading a folder's files -------------------------------------------------------------
def read_tokenizer(run_dir: Path) -> CharTokenizer:
    path = run_dir / TOKENIZER
    text = read_bytes(path, MAX_TOKENIZER_BYTES, run_dir, f"{path} is missing; the run folder is incomplete")
    try:
        return CharTokenizer.from_json(text.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ChargenError(f"{path} is unreadable ({e})") from None


def write_tokenizer(run_dir: Path, tokenizer: CharTokenizer) -> None:
    atomic_write(run_dir / TOKENIZER, tokenizer.to_json().encode("utf-8"))


def weights_path(run_dir: Path, which: str = "best") -> Path:
    """``best`` falls back to the latest weights when no validation has run yet."""
    if which not in ("best", "latest"):
        raise ChargenError(f"weights must be 'best' or 'latest', not {which!r}")
    best = run_dir / BEST
    return best if which == "best" and (best.exists() or best.is_symlink()) else run_dir / WEIGHTS


@dataclass(frozen=True)
class Folder:
    """A run or model folder, read and checked: its record, its vocabulary (agreeing with
    the record's model), and the weights file that fits that model."""

    path: Path
    record: RunRecord
    tokenizer: CharTokenizer
    weights: Path


def read_folder(run_dir: Path, weights: str = "best", device: torch.device | None = None) -> Folder:
    """Everything a load needs from ``run_dir``, checked before any tensor is read: the
    record, the tokenizer against it, the weights file's header against the model's shapes,
    and (on ``device``) the memory it takes."""
    record = read_record(run_dir)
    tokenizer = read_tokenizer(run_dir)
    if record.model.vocab_size != tokenizer.vocab_size:
        raise ChargenError(f"{run_dir}: config.json and tokenizer.json disagree on the vocabulary size "
                           f"({record.model.vocab_size:,} and {tokenizer.vocab_size:,}); retrain or restore the folder")
    if unknown := tokenizer.unknown_chars(record.default_prime):
        raise ChargenError(f"{run_dir / CONFIG}: default_prime has characters the vocabulary in tokenizer.json lacks "
                           f"({''.join(unknown)[:10]!r}); fix or restore the file")
    memory.check_loadable(record.model, device or torch.device("cpu"))
    path = weights_path(run_dir, weights)
    check_weights_fit(path, record.model, run_dir)
    return Folder(run_dir, record, tokenizer, path)


def check_weights_fit(path: Path, model: ModelConfig, folder: Path) -> None:
    """The weights file declares exactly the float32 tensors of ``model`` (read from its
    header alone: nothing is allocated for a file that does not fit)."""
    header = tensor_header(path, folder, f"{path} is missing; the folder has no weights (has it finished its first "
                           "checkpoint?)")
    declared = {name: entry for name, entry in header.items() if name != "__metadata__"}
    expected = model.shapes()
    for name, shape in expected.items():
        entry = declared.get(name)
        found = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, dict) else None
        if found != ("F32", list(shape)):
            shown = f"{found[0]} {found[1]}" if found else "missing"
            raise ChargenError(f"{path} does not fit the model in config.json ({name}: {shown}, where the model "
                               f"has F32 {list(shape)}); retrain or restore the folder")
    if extra := sorted(set(declared) - set(expected)):
        raise ChargenError(f"{path} does not fit the model in config.json (it has {extra[0]}, which the model "
                           "lacks); retrain or restore the folder")


def load_weights(model: torch.nn.Module, path: Path, folder: Path | None = None) -> dict:
    """Load the weights in ``path`` into ``model``, refusing non-finite ones; returns the
    file's metadata."""
    tensors, meta = load_tensors(path, folder)
    check_finite(tensors, path)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise ChargenError(
            f"{path} does not fit the model in config.json ({first[1].strip() if len(first) > 1 else first[0]})"
        ) from None
    return meta


def check_finite(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Weights with a NaN or an infinity sample nothing (the text comes out empty): refused."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ChargenError(f"{path} holds NaN or infinite weights ({', '.join(bad[:3])}); retrain or restore it")


# --- writing a folder whole -----------------------------------------------------------------
def new_sibling(target: Path) -> Path:
    """A fresh temp folder beside ``target`` (same file system: a rename moves it)."""
    folder = temp_beside(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir()
    except OSError as e:
        raise ChargenError(f"cannot write in {target.parent} ({e.strerror or e}); choose a folder you can write "
                           "to") from None
    return folder


def install(built: Path, target: Path, kind: str) -> None:
    """Put the folder ``built`` (a new ``kind`` folder, complete) in ``target``'s place:
    renamed there whole where ``target`` is missing or empty; where ``target`` is already
    chargen's ``kind`` of folder, its chargen files are replaced by ``built``'s, one rename
    each, and everything else in it is left as it was."""
    if describe_folder(target) in ("missing", "empty"):
        if target.exists():
            target.rmdir()
        os.rename(built, target)
        fsync_folder(target.parent)
        return
    new = {p.name for p in built.iterdir()}
    for old in ours(target, kind):
        if old.name not in new and old.parent == target:
            old.unlink()
    for name in sorted(new):
        os.replace(built / name, target / name)
    built.rmdir()
    fsync_folder(target)


def check_export_target(run_dir: Path, out_dir: Path, force: bool, kind: str = "model") -> None:
    """Refuse an export folder that is the run, inside it or inside any chargen folder, a
    file, a folder chargen did not write, one of another kind, or (without ``force``) a
    folder with something in it."""
    out, run = real_path(out_dir), real_path(run_dir)
    if out == run or run in out.parents:
        raise ChargenError("export needs a folder of its own, not the run folder or one inside it")
    found = describe_folder(out_dir)
    if found in ("missing", "empty"):
        if (outer := inside_chargen_folder(out_dir)) is not None:
            raise ChargenError(f"{out_dir} is inside {outer}, a chargen folder; export to a folder of its own")
        return
    if found != kind or not force:  # (never advising --force: the folder's model would be lost)
        raise ChargenError(refusal(out_dir, found, "folder"))
