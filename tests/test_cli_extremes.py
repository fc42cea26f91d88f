"""Every command of the CLI at the extremes of its arguments: zero, negative, huge, NaN and
infinite numbers, wrong types, odd strings, and paths to folders, devices, missing, empty,
binary or unreadable files. Whatever comes in, a command either works (exit 0) or says what
is wrong in one line (exit 2): never a traceback, and an existing run folder is never
damaged. Each example changes one argument of a command that otherwise works.

CHARGEN_CLI_EXAMPLES sets how many examples are drawn (default 120).
"""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chargen
from chargen.cli import main
from conftest import make_text

EXAMPLES = int(os.environ.get("CHARGEN_CLI_EXAMPLES", "120"))
NUMBERS = ["0", "-1", "-7", "0.5", "1e-320", "1e308", "-1e308", "inf", "-inf", "nan", "NaN", str(2**31),
           str(2**63), "99999999999999999999", "abc", "", " ", "1,000", "0x10", "½"]
STRINGS = ["", " ", "-", "--", "nonsense", "rot13", "base64", "utf-16", "hex", "x" * 5000, "\t\n", "cuda",
           "cuda:99", "meta", "mps", "../..", "ünïcödé", "\u202e"]
TRAIN_BASE = ["--hidden", "16", "--layers", "1", "--embedding", "8", "--batch-size", "4", "--bptt", "16",
              "--steps", "2", "--max-time", "5", "--eval-every", "2", "--sample-chars", "10", "--device", "cpu",
              "--quiet"]
TRAIN_VALUE_FLAGS = ["--hidden", "--layers", "--embedding", "--dropout", "--batch-size", "--bptt", "--bucket-factor",
                     "--base-lr", "--base-batch-size", "--base-warmup-epochs", "--warmup-steps", "--weight-decay",
                     "--clip", "--epochs", "--steps", "--max-time", "--eval-every", "--log-every", "--sample-chars",
                     "--seed", "--val-fraction", "--encoding", "--device", "--mode", "--errors", "--lr-scaling",
                     "--decay", "--precision"]
SAMPLE_VALUE_FLAGS = ["--length", "--temperature", "--top-k", "--top-p", "--seed", "--num-samples", "--prime",
                      "--weights", "--device"]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A tiny trained run and a folder of awkward paths."""
    root = tmp_path_factory.mktemp("extremes")
    text = root / "text.txt"
    text.write_text(make_text(200), encoding="utf-8")
    run = root / "run"
    assert main(["train", str(text), "--out", str(run), *TRAIN_BASE, "--steps", "4"]) == 0
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (root / "folder").mkdir()
    (root / "locked.txt").write_text("locked away\n" * 50)
    (root / "locked.txt").chmod(0)
    paths = [root / name for name in ("missing.txt", "empty.txt", "binary.bin", "folder", "locked.txt")]
    paths += ["RUN", "RUN/config.json", Path("/dev/null"), Path("/dev/zero"), Path("/proc/x/y"), Path("/"),
              root / ("long" * 100), Path("")]
    return {"root": root, "text": text, "run": run, "paths": [str(p) for p in paths]}


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def command(place: dict, data) -> tuple[list[str], Path | None]:
    """An argument list with one extreme value, and the run folder it may touch (a copy)."""
    kind = data.draw(st.sampled_from(["train", "resume", "sample", "eval", "export"]))
    workdir = Path(tempfile.mkdtemp(dir=place["root"]))
    copy = workdir / "run"
    path = data.draw(st.sampled_from(place["paths"])).replace("RUN", str(copy))
    value = data.draw(st.sampled_from(NUMBERS + STRINGS))
    shutil.copytree(place["run"], copy)
    if kind in ("train", "resume"):
        where = data.draw(st.sampled_from(["text", "out", "val-file", "flag"]))
        text, out = place["text"], copy if kind == "resume" else workdir / "new"
        argv = ["train", str(text), "--out", str(out), *TRAIN_BASE] + (["--resume"] if kind == "resume" else [])
        if where == "text":
            argv[1] = path
        elif where == "out":
            argv[3] = path
        elif where == "val-file":
            argv += ["--val-file", path]
        else:
            argv += [data.draw(st.sampled_from(TRAIN_VALUE_FLAGS)), value]
    elif kind == "sample":
        where = data.draw(st.sampled_from(["run", "flag", "output"]))
        argv = ["sample", path if where == "run" else str(copy), "--length", "20"]
        if where == "flag":
            argv += [data.draw(st.sampled_from(SAMPLE_VALUE_FLAGS)), value]
        elif where == "output":
            argv += ["--output", path]
    elif kind == "eval":
        where = data.draw(st.sampled_from(["run", "text", "encoding"]))
        argv = ["eval", path if where == "run" else str(copy), path if where == "text" else str(place["text"])]
        if where == "encoding":
            argv += ["--encoding", value]
    else:
        where = data.draw(st.sampled_from(["run", "out", "out-force", "run-into-itself"]))
        argv = ["export", path if where == "run" else str(copy), str(workdir / "model")]
        if where.startswith("out"):
            argv[2] = path
        if where == "run-into-itself":
            argv[2] = data.draw(st.sampled_from([str(copy), str(copy / "trainer"), str(copy / "sub"), str(workdir)]))
        if where.endswith("force") or where == "run-into-itself":
            argv.append("--force")
    return argv, copy


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_command_works_or_says_why_in_one_line(place, capsys, monkeypatch, data):
    monkeypatch.chdir(place["root"])  # (an empty --out means runs/NAME here)
    argv, copy = command(place, data)
    before = snapshot(copy)
    try:
        code = main(argv)
    except BaseException as e:
        pytest.fail(f"chargen {argv!r} raised {type(e).__name__}: {e}")
    out, err = capsys.readouterr()
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, (argv, err)
    resumed = argv[0] == "train" and "--resume" in argv and code == 0
    if resumed:  # it trained on: the run changed, and must still load and sample
        chargen.load(copy).generate("", 5, seed=1)
    else:
        after = snapshot(copy)
        assert {k: after.get(k) for k in before} == before, argv  # no file of the run changed or went


def test_a_text_that_changes_between_the_two_reads_is_refused(tmp_path, monkeypatch, capsys):
    """The file is read twice (count, then encode): one that shrinks or grows in between, as
    when it is being rewritten, is a clear error, never ids from two different texts."""
    from chargen import corpus

    path = tmp_path / "moving.txt"
    path.write_text(make_text(200))
    real_scan = corpus.scan_text

    def scan_then_shrink(*args, **kwargs):
        scanned = real_scan(*args, **kwargs)
        path.write_text(make_text(100))
        return scanned

    monkeypatch.setattr(corpus, "scan_text", scan_then_shrink)
    code = main(["train", str(path), "--out", str(tmp_path / "run"), *TRAIN_BASE])
    err = capsys.readouterr().err
    assert code == 2 and "changed while it was being read" in err and len(err.strip().splitlines()) == 1


def test_a_text_removed_after_loading_does_not_matter(tmp_path, capsys):
    """The run holds the text as ids once it is loaded: the file may vanish mid-run, and the
    run goes on to the end; resuming then needs the file again, and says so."""
    path = tmp_path / "gone.txt"
    path.write_text(make_text(200))
    corpus = chargen.load_corpus(path)
    path.unlink()
    result = chargen.train(corpus, tmp_path / "run", chargen.ModelConfig(vocab_size=1, hidden=16),
                           chargen.TrainConfig(steps=3, batch_size=4, bptt=16, eval_every=3, device="cpu"))
    assert result.stopped == "done"
    code = main(["train", str(path), "--out", str(tmp_path / "run"), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "no such file" in err
