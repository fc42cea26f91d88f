"""benchmarks.probe_drift reads what a timed run's log says: the probe's step time for the
size it chose, the plan's fitted step times, and the characters per parameter promised and
trained on. Read off a real run's output, so a change to those lines breaks it here."""

import pytest

from benchmarks.probe_drift import read_drift
from chargen import cli
from conftest import make_text


def chargen_log(tmp_path, capsys, *flags: str) -> str:
    text = tmp_path / "text.txt"
    text.write_text(make_text(1500, seed=3))
    assert cli.main(["train", str(text), "--out", str(tmp_path / "run"), "--device", "cpu", "--batch-size", "4",
                     "--bptt", "16", "--sample-chars", "0", "--quiet", *flags]) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_a_timed_runs_probe_and_steps_are_read_off_its_log(tmp_path, capsys):
    log = chargen_log(tmp_path, capsys, "--max-time", "5")
    drift = read_drift(log)
    assert drift is not None and drift.size in {"1x128", "1x256", "1x512"}
    steps = int(next(line for line in log.splitlines() if line.startswith("stopped (time) at step"))
                .split("at step ")[1].split()[0].replace(",", ""))
    params = int(log.split(" parameters, ")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert drift.trained == pytest.approx(steps * 4 * 16 / params)
    assert drift.probe_ms > 0 and drift.first_ms > 0 and drift.last_ms > 0 and drift.promised > 0
    assert drift.ratio == pytest.approx(drift.last_ms / drift.probe_ms)


def test_a_run_of_a_size_given_has_no_probe_to_read(tmp_path, capsys):
    assert read_drift(chargen_log(tmp_path, capsys, "--max-time", "3", "--hidden", "32")) is None
    assert read_drift("") is None
