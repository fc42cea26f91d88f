"""The GPU check's dry run: the code paths of ``python -m benchmarks.gpu_check`` on the CPU,
so the check is known to work before a GPU machine is at hand. It runs here in its older form,
``python benchmarks/gpu_check.py OUT``, from another folder with OUT relative to it: the form
an instruction elsewhere names, which starts the module again (the same code)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from conftest import BF16_PROBLEM

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    where = tmp_path_factory.mktemp("gpu-check")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "out", "--dry-run"],
                          cwd=where, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    out = where / "out"  # (relative to the folder it was run in, as given)
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_every_correctness_check_runs_and_passes(dry_run):
    data, _ = dry_run
    checks = {c["name"]: c for c in data["checks"]}
    assert data["dry_run"] and not [c for c in data["checks"] if c["ok"] is False]
    expected = ["train 60 steps in fp32", "train 60 steps in bf16", "train 60 steps in fp16", "exact resume",
                "LeanStep and nn.LSTM draw the same text", "the app's serving layer generates",
                "torchrun, 1 process", "torchrun, 2 processes on one device over gloo"]
    assert list(checks) == expected  # no part crashed (that would add a check)
    # What the CPU cannot run is skipped with chargen's own reason, never passed.
    assert checks["train 60 steps in fp16"]["ok"] is None and "fp16" in checks["train 60 steps in fp16"]["detail"]
    assert checks["train 60 steps in bf16"]["ok"] is (None if BF16_PROBLEM else True)
    assert checks["exact resume"]["detail"].startswith("bit for bit")
    for name in expected[3:]:
        assert checks[name]["ok"] is True, checks[name]


def test_the_speed_legw_and_quality_parts_are_measured(dry_run):
    data, markdown = dry_run
    speed = data["speed"]
    assert {r["recipe"] for r in speed["rows"]} == {"slow", "streams"}
    assert all(r["chars_per_s"] > 0 and r["gemm_fraction"] > 0 for r in speed["rows"])
    assert [r["samples"] for r in speed["sampling"]] == [1, 4]
    legw = data["legw"]
    assert legw["base"]["batch"] * 4 == legw["legw"]["batch"]
    assert legw["base"]["seconds_to_base_final"] <= legw["base"]["train_seconds"]  # it reaches its own final
    # The 3-s quality run validates whole, or on a sample, or (on a busy machine, its budget
    # spent by its steps) not at all: the report says which, never fails on it.
    quality = data["quality"]
    figures = [loss for loss in (quality["best_val_loss"], quality["last_val_loss"]) if loss is not None]
    assert quality["steps"] > 0 and all(loss > 0 for loss in figures) and quality["sample"].startswith("ROMEO:")
    assert gpu_check.quality_figure(quality) in markdown
    targets = {t["target"] for t in data["targets"]}
    assert any("slow recipe" in t for t in targets) and any("LEGW" in t for t in targets)
    for heading in ("## Correctness", "## Speed", "## LEGW", "## Quality", "## Targets"):
        assert heading in markdown


def test_a_quality_run_left_no_time_for_the_whole_text_is_reported_not_a_crash():
    """A busy machine's timed run validates its end on a sample, and no whole-text best comes
    back: the report says the sample's figure (the report once failed on the missing best)."""
    base = {"best_val_loss": None, "best_val_bpc": None}
    assert "1.2345 nats/char on a sample" in gpu_check.quality_figure({**base, "last_val_loss": 1.2345})
    assert gpu_check.quality_figure({**base, "last_val_loss": None}).startswith("not validated")
    assert "best validation loss 1.5000" in gpu_check.quality_figure({"best_val_loss": 1.5, "best_val_bpc": 2.16})


def test_without_a_gpu_the_full_check_refuses_in_one_line(tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", str(tmp_path / "o")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--dry-run" in done.stderr and "Traceback" not in done.stderr


def test_the_file_form_starts_the_module(tmp_path):
    """``python benchmarks/gpu_check.py --help`` from any folder: the module's help."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m benchmarks.gpu_check") and "--dry-run" in done.stdout
