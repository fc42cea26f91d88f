"""Checkpoints by the clock (--save-every), earlier resume points kept (--keep) and a resume
from one of them (--resume-from)."""

import errno
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from chargen import ChargenError, checkpoint, storage
from chargen.cli import main
from conftest import TINY_FLAGS

FLAGS = [*TINY_FLAGS, "--eval-every", "20", "--steps", "60", "--precision", "fp32", "--seed", "5"]


def train(capsys, text: Path, out: Path, *flags: str) -> str:
    code = main(["train", str(text), "--out", str(out), *FLAGS, *flags])
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


def test_save_every_checkpoints_between_validations(capsys, corpus_file, tmp_path):
    """A checkpoint at log steps once --save-every has passed (here at once: a tiny interval),
    none without it; the start-up line says when and what the checkpoints take."""
    err = train(capsys, corpus_file, tmp_path / "clock", "--save-every", "1e-9", "--log-every", "10")
    saved = [int(s) for s in re.findall(r"checkpoint at step (\d+) \(--save-every", err)]
    assert saved == [10, 30, 50]  # (20, 40 and 60 are validations: saved with them)
    assert re.search(r"checkpoints: [\d.]+ MB for the resume point .* in all, with .* free there; saved with each "
                     r"validation and every 1e-09 min \(--save-every\)", err)
    err = train(capsys, corpus_file, tmp_path / "plain", "--log-every", "10")
    assert "checkpoint at step" not in err and "saved with each validation\n" in err


def test_keep_holds_the_last_resume_points_and_resume_from_one_is_exact(capsys, corpus_file, tmp_path):
    run = tmp_path / "run"
    err = train(capsys, corpus_file, run, "--keep", "1", "--eval-every", "10")
    assert "for each of the 1 earlier ones kept (--keep)" in err
    # Saves at 10, 20, ... 60: the latest and the one before it kept, the oldest deleted first;
    # the latest is the resume point itself under a second name (no copy).
    assert checkpoint.kept_steps(run) == [50, 60]
    assert os.path.samefile(checkpoint.kept_path(run, 60), run / checkpoint.TRAINER)
    final = weights(run)
    # Back to step 50, on to 60: the weights of the run that never went back, bit for bit.
    err = train(capsys, corpus_file, run, "--resume-from", "50", "--keep", "1", "--eval-every", "10")
    assert "from step 50" in err and "the ones after it (steps 60) are no longer this run's" in err
    assert all(torch.equal(final[name], weights(run)[name]) for name in final)
    # A plain --resume later goes on from the new line; --keep 0 retires the kept ones.
    train(capsys, corpus_file, run, "--resume", "--steps", "70", "--keep", "0", "--eval-every", "10")
    assert checkpoint.kept_steps(run) == [] and sorted(p.name for p in (run / "trainer").iterdir()) == \
        ["state.safetensors"]


def test_resume_from_a_step_not_kept_names_those_kept(capsys, corpus_file, tmp_path):
    run = tmp_path / "run"
    train(capsys, corpus_file, run, "--keep", "2")
    code = main(["train", str(corpus_file), "--out", str(run), *FLAGS, "--resume-from", "30"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith("has no resume point kept at step 30; it keeps steps 20, 40, 60"), err


def test_force_replaces_the_kept_resume_points_too(capsys, corpus_file, tmp_path):
    run = tmp_path / "run"
    train(capsys, corpus_file, run, "--keep", "5")
    (run / "trainer" / "notes.txt").write_text("mine")
    train(capsys, corpus_file, run, "--force", "--steps", "20")
    assert checkpoint.kept_steps(run) == [] and (run / "trainer" / "notes.txt").read_text() == "mine"


def test_where_the_file_system_has_no_hard_links_a_kept_point_is_a_copy(tmp_path, monkeypatch):
    source, target = tmp_path / "state.safetensors", tmp_path / "step-000000010.safetensors"
    source.write_bytes(b"resume point")

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    storage.atomic_link(source, target)
    assert target.read_bytes() == b"resume point" and not os.path.samefile(source, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name, target.name]  # (no temp file left)


def test_a_kept_point_that_cannot_be_written_is_one_clear_error(tmp_path, monkeypatch):
    source = tmp_path / "state.safetensors"
    source.write_bytes(b"resume point")

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    with pytest.raises(ChargenError, match="No space left on device.*the run's latest checkpoint is intact"):
        storage.atomic_link(source, tmp_path / "step-000000010.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == [source.name]


def test_a_hand_edited_list_of_kept_steps_is_refused(capsys, corpus_file, tmp_path):
    """The kept steps name files to delete: a resume point whose list is not whole numbers
    is refused before anything is deleted or trained."""
    run = tmp_path / "run"
    train(capsys, corpus_file, run, "--keep", "1")
    tensors, meta = storage.load_tensors(run / checkpoint.TRAINER)
    meta["progress"]["kept"] = ["../../config.json"]
    storage.save_tensors(run / checkpoint.TRAINER, tensors, meta)
    code = main(["train", str(corpus_file), "--out", str(run), *FLAGS, "--resume", "--steps", "80"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "does not match this run (kept: ['../../config.json'])" in err, err
    assert (run / "config.json").is_file() and checkpoint.kept_steps(run) == [40, 60]


def test_a_kept_name_that_is_not_a_file_is_left_where_it_would_be_retired(capsys, corpus_file, tmp_path):
    """A hand-made folder under a kept point's name: the oldest point is not deleted (it is
    not chargen's file any more), and training goes on."""
    run = tmp_path / "run"
    train(capsys, corpus_file, run, "--keep", "1", "--steps", "40")
    checkpoint.kept_path(run, 20).unlink()
    checkpoint.kept_path(run, 20).mkdir()
    train(capsys, corpus_file, run, "--keep", "1", "--resume", "--steps", "60")
    assert checkpoint.kept_path(run, 20).is_dir() and checkpoint.kept_steps(run) == [40, 60]
