"""``chargen export``: a run's chosen weights as a model folder for serving and sharing, or
(``--web``) as a static page that samples it in the visitor's browser.

Either way the run is loaded and checked first, and the new folder is written whole beside
its target and then moved into place: an export that fails, at any point, leaves nothing,
and an earlier export in the target stays as it was until the new one is complete. A
target that is already chargen's folder of that kind (``--force``) keeps everything in it
that chargen did not write (a Git repository's files, say).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from . import checkpoint
from .api import TrainedModel, load
from .card import card_text
from .record import Exported, write_record
from .storage import atomic_write, read_bytes


def export_model(run_dir: Path, out_dir: Path, weights: str = "best", force: bool = False) -> Path:
    """A model folder: config, tokenizer, the chosen weights (as the folder's only weights),
    the card and, in lines mode, the training-item hashes; no trainer state or metrics. It
    loads like any run folder but cannot be resumed."""
    model = load(run_dir, device="cpu", weights=weights)
    checkpoint.check_export_target(run_dir, out_dir, force, "model")
    source = checkpoint.weights_path(run_dir, weights)
    files = {checkpoint.WEIGHTS: source, checkpoint.TOKENIZER: run_dir / checkpoint.TOKENIZER}
    if model.kind.items and (run_dir / checkpoint.ITEMS).is_file():
        files[checkpoint.ITEMS] = run_dir / checkpoint.ITEMS

    def write(built: Path) -> None:
        for name, path in files.items():  # (checked by the load: regular files of a size that fits)
            atomic_write(built / name, read_bytes(path, path.stat().st_size, run_dir), then="export again")
        record = replace(model.record, exported=Exported(run_dir.resolve().name, weights))
        write_record(built, record)
        exported = TrainedModel(model.model, model.tokenizer, record, built)
        atomic_write(built / checkpoint.CARD, card_text(exported, out_dir.resolve().name).encode("utf-8"),
                     then="export again")

    build(out_dir, "model", sum(p.stat().st_size for p in files.values()), write)
    return out_dir


def export_web(run_dir: Path, out_dir: Path, weights: str = "best", web_dtype: str = "fp32", force: bool = False,
               card: bool = True) -> Path:
    """The static page's folder for ``run_dir`` (a run or model folder) in ``out_dir``."""
    from .web import page_files

    model = load(run_dir, device="cpu", weights=weights)
    checkpoint.check_export_target(run_dir, out_dir, force, "page")
    files = page_files(model, web_dtype, run_dir.resolve().name, card)

    def write(built: Path) -> None:
        for name, data in files.items():
            atomic_write(built / name, data, then="export again")

    build(out_dir, "page", sum(len(data) for data in files.values()), write)
    return out_dir


def build(out_dir: Path, kind: str, size: int, write) -> None:
    """``write`` a new ``kind`` folder beside ``out_dir``, then install it there; on any
    failure the new folder is removed and ``out_dir`` is as it was."""
    built = checkpoint.new_sibling(out_dir)
    try:
        checkpoint.check_room(built, size)
        write(built)
        checkpoint.install(built, out_dir, kind)
    finally:
        shutil.rmtree(built, ignore_errors=True)
