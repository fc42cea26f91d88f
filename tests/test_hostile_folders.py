"""Folders that chargen did not write, or that someone changed: every command that reads one
answers with one line and exit 2, within a time limit (a hang fails), and writes nothing;
a folder that is not chargen's is never written to, with or without --force."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chargen
from benchmarks.folder_fuzz import REMOVED, field_paths, use_folder, with_field
from chargen import checkpoint
from chargen.cli import main
from chargen.errors import ChargenError
from chargen.export import export_model
from chargen.storage import load_tensors, save_tensors
from conftest import ROOT, TINY_FLAGS, config_json

COMMAND_SECONDS = 60  # a command that takes longer than this on a tiny folder has hung


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and not p.is_symlink()}


def cli(*args, cwd: Path | None = None) -> tuple[int, str]:
    """``chargen ARGS`` in a process of its own, killed if it runs past COMMAND_SECONDS."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-m", "chargen", *map(str, args)], capture_output=True, text=True,
                              timeout=COMMAND_SECONDS, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chargen {' '.join(map(str, args))} hung (over {COMMAND_SECONDS} s)")
    return done.returncode, done.stderr


def one_line(code: int, err: str, pattern: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert pattern in lines[0], lines[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, trained_run) -> Path:
    return export_model(trained_run, tmp_path_factory.mktemp("hostile") / "model")


@pytest.fixture
def model_copy(tmp_path, model_dir) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    return folder


@pytest.fixture
def project(tmp_path) -> Path:
    """Someone's project that happens to use chargen's file names."""
    folder = tmp_path / "proj"
    (folder / "trainer" / "src").mkdir(parents=True)
    (folder / "config.json").write_text('{"name": "my project"}\n')
    (folder / "metrics.jsonl").write_text('{"accuracy": 0.9}\n')
    (folder / "model.safetensors").write_bytes(b"not chargen's")
    (folder / "trainer" / "src" / "main.py").write_text("print('hello')\n")
    return folder


# --- writing only what is ours ---------------------------------------------------------
def test_force_never_touches_a_folder_that_is_not_chargens(project, corpus_file, trained_run, capsys):
    before = snapshot(project)
    for argv in (["train", str(corpus_file), "--out", str(project), *TINY_FLAGS, "--steps", "2", "--force"],
                 ["export", str(trained_run), str(project), "--force"],
                 ["export", str(trained_run), str(project), "--web", "--force"]):
        code = main(argv)
        one_line(code, capsys.readouterr().err, "is not a chargen folder")
        assert snapshot(project) == before, argv
    # without --force, the same one line (the folder is not empty)
    assert main(["train", str(corpus_file), "--out", str(project), *TINY_FLAGS, "--steps", "2"]) == 2
    assert "--force" not in capsys.readouterr().err and snapshot(project) == before


def test_a_run_killed_while_writing_its_first_record_starts_again(tmp_path, corpus_file, capsys):
    """A first run killed mid-write of its config.json leaves only chargen's temp files: the
    same command starts it (and clears them); a folder with anything else in it is refused,
    untouched."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".config.json.4242.0123abcd.tmp").write_text('{"format": "chargen-')  # half a record
    (run / ".write-test.4242.tmp").write_bytes(b"")
    assert checkpoint.describe_folder(run) == "empty"
    assert main(["train", str(corpus_file), "--out", str(run), *TINY_FLAGS, "--steps", "2"]) == 0
    assert not list(run.glob(".*.tmp")) and config_json(run)["train"]["steps"] == 2
    capsys.readouterr()
    for theirs in ("notes.txt", ".config.json.1.deadbeef.tmp.keep"):
        other = tmp_path / theirs.strip(".")
        other.mkdir()
        (other / ".config.json.4242.0123abcd.tmp").write_text("{")
        (other / theirs).write_text("mine\n")
        before = snapshot(other)
        code = main(["train", str(corpus_file), "--out", str(other), *TINY_FLAGS, "--steps", "2"])
        one_line(code, capsys.readouterr().err, "is not a chargen folder")
        assert snapshot(other) == before
    linked = tmp_path / "linked"  # a link named like our temp file is not ours: refused, kept
    linked.mkdir()
    (linked / ".config.json.4242.0123abcd.tmp").symlink_to(corpus_file)
    assert checkpoint.describe_folder(linked) == "other"
    assert main(["train", str(corpus_file), "--out", str(linked), *TINY_FLAGS, "--steps", "2", "--force"]) == 2
    assert (linked / ".config.json.4242.0123abcd.tmp").is_symlink() and corpus_file.exists()


def test_force_replaces_only_chargens_own_files(tmp_path, corpus_file, trained_run, capsys):
    """A chargen run (or model) folder with someone's files in it: --force replaces chargen's
    files and keeps theirs, byte for byte."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "notes.txt").write_text("my notes\n")
    (run / "trainer" / "mine.py").write_text("x = 1\n")
    (run / ".config.json.1.deadbeef.tmp.keep").write_text("not a temp of ours\n")
    assert main(["train", str(corpus_file), "--out", str(run), *TINY_FLAGS, "--steps", "2", "--force"]) == 0
    assert (run / "notes.txt").read_text() == "my notes\n" and (run / "trainer" / "mine.py").read_text() == "x = 1\n"
    assert (run / ".config.json.1.deadbeef.tmp.keep").exists()
    assert config_json(run)["train"]["steps"] == 2
    out = tmp_path / "clone"
    assert main(["export", str(trained_run), str(out)]) == 0
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert main(["export", str(run), str(out), "--force"]) == 0
    assert (out / ".git" / "HEAD").is_file() and (out / ".gitattributes").is_file()
    assert config_json(out)["train"]["steps"] == 2 and config_json(out)["exported"]["from"] == "run"
    capsys.readouterr()


def test_output_is_refused_anywhere_inside_a_chargen_folder(tmp_path, trained_run, model_dir, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = snapshot(run)
    for target in (run / checkpoint.TRAINER, run / "config.json", run / "a" / "b" / "c.txt", model_dir / "x.txt"):
        code = main(["sample", str(run), "--length", "5", "--output", str(target)])
        one_line(code, capsys.readouterr().err, "a chargen run or model folder; write the sample somewhere else")
    assert snapshot(run) == before and not (model_dir / "x.txt").exists()
    assert main(["sample", str(run), "--length", "5", "--output", str(tmp_path / "ok.txt")]) == 0


def test_a_failed_export_leaves_nothing(tmp_path, trained_run, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(trained_run, broken)
    (broken / "tokenizer.json").write_text("{}")
    for web in ([], ["--web"]):
        out = tmp_path / f"out{len(web)}"
        one_line(main(["export", str(broken), str(out), *web]), capsys.readouterr().err, "tokenizer.json")
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_resuming_an_exported_model_is_refused_without_advice_that_would_lose_it(model_copy, corpus_file, capsys):
    before = snapshot(model_copy)
    code = main(["train", str(corpus_file), "--out", str(model_copy), *TINY_FLAGS, "--steps", "2", "--resume"])
    err = capsys.readouterr().err
    one_line(code, err, f"is an exported model, not a training run, and cannot be resumed; train on from it in a new "
             f"folder with --init-from {model_copy}")
    assert "--force" not in err and snapshot(model_copy) == before


# --- reading safely ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_a_fifo_in_a_model_folder_is_refused_not_waited_on(model_copy, name):
    (model_copy / name).unlink()
    os.mkfifo(model_copy / name)
    one_line(*cli("sample", model_copy, "--length", "5"), f"{name} is a pipe (FIFO), not a file")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_a_link_to_a_device_is_refused_not_read(model_copy, name):
    (model_copy / name).unlink()
    (model_copy / name).symlink_to("/dev/zero")
    one_line(*cli("sample", model_copy, "--length", "5"), f"{name} is a link to a file outside")


def test_a_device_under_init_from_is_refused(model_copy, corpus_file, tmp_path):
    (model_copy / "model.safetensors").unlink()
    os.mknod(model_copy / "model.safetensors", 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero's own numbers
    code, err = cli("train", corpus_file, "--out", tmp_path / "tuned", "--init-from", model_copy, *TINY_FLAGS,
                    "--steps", "2")
    one_line(code, err, "model.safetensors is a device, not a file")
    assert not (tmp_path / "tuned").exists()


def test_links_inside_the_folder_are_followed(model_copy):
    (model_copy / "weights").mkdir()
    (model_copy / "model.safetensors").rename(model_copy / "weights" / "w.safetensors")
    (model_copy / "model.safetensors").symlink_to(Path("weights") / "w.safetensors")
    assert chargen.load(model_copy).generate("", 10, seed=1)


def test_a_huge_json_file_is_refused_by_its_size(model_copy, capsys):
    with open(model_copy / "tokenizer.json", "wb") as f:
        f.truncate(17 * 2**20)  # (sparse: no disk)
    one_line(main(["sample", str(model_copy)]), capsys.readouterr().err, "more than chargen ever writes there")


def test_a_git_lfs_pointer_is_named_with_the_command_that_fetches_it(model_copy, capsys):
    (model_copy / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:"
                                                  + "0" * 64 + "\nsize 4908764\n")
    one_line(main(["sample", str(model_copy)]), capsys.readouterr().err, "git lfs pull")


def test_a_million_layers_is_refused_at_once(model_copy):
    config = config_json(model_copy)
    config["model"]["layers"] = 1_000_000
    (model_copy / "config.json").write_text(json.dumps(config))
    one_line(*cli("sample", model_copy, "--length", "5"), "model: --layers must be 1 to 64, not 1000000")


def test_nan_weights_with_a_valid_checksum_are_refused(model_copy, capsys):
    tensors, meta = load_tensors(model_copy / "model.safetensors")
    tensors["head.bias"][0] = math.nan
    save_tensors(model_copy / "model.safetensors", tensors, meta)
    assert torch.isnan(load_tensors(model_copy / "model.safetensors")[0]["head.bias"][0])  # (its checksum holds)
    one_line(main(["sample", str(model_copy)]), capsys.readouterr().err, "holds NaN or infinite weights (head.bias)")


def test_init_from_weights_of_another_shape_is_refused(model_copy, corpus_file, tmp_path, capsys):
    tensors, meta = load_tensors(model_copy / "model.safetensors")
    tensors["head.weight"] = torch.zeros(3, 3)
    save_tensors(model_copy / "model.safetensors", tensors, meta)
    code = main(["train", str(corpus_file), "--out", str(tmp_path / "tuned"), "--init-from", str(model_copy),
                 *TINY_FLAGS, "--steps", "2"])
    one_line(code, capsys.readouterr().err, "does not fit the model in config.json (head.weight: F32 [3, 3]")
    assert not (tmp_path / "tuned").exists()


BAD_FIELDS = [
    (("model", "hidden"), 512.5, "model: hidden must be a whole number, not 512.5"),
    (("model", "hidden"), 10**9, "model: --hidden must be 1 to 65,536"),
    (("mode",), ["x"], "mode must be one of stream, lines"),
    (("default_prime",), 5, "default_prime must be a string, not 5"),
    (("default_prime",), "é", "default_prime has characters the vocabulary in tokenizer.json lacks ('é')"),
    (("default_prime",), "a" * 5000, "default_prime is 5,000 characters"),
    (("model", "hidden"), REMOVED, "model lacks hidden"),
    (("summary",), "x", "summary must be an object"),
    (("parameters",), "many", "parameters must be a whole number, not 'many'"),
    (("train", "batch_size"), True, "train: batch_size must be a whole number, not True"),
    (("corpus",), None, "the corpus section is missing"),
]


@pytest.mark.parametrize("command", ["sample", "export", "export --web"])
@pytest.mark.parametrize("path, value, message", BAD_FIELDS)
def test_a_bad_field_is_one_line_naming_it_and_the_file(model_copy, tmp_path, capsys, command, path, value,
                                                         message):
    (model_copy / "config.json").write_text(json.dumps(with_field(config_json(model_copy), path, value)))
    argv = [command.split()[0], str(model_copy)]
    if command.startswith("export"):
        argv += [str(tmp_path / "out"), *command.split()[1:]]
    one_line(main(argv), capsys.readouterr().err, f"{model_copy / 'config.json'}: {message}")
    assert not (tmp_path / "out").exists()


def test_json_nested_100000_deep_is_one_line(model_copy, capsys):
    (model_copy / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line(main(["sample", str(model_copy)]), capsys.readouterr().err, "nested too deep")


# --- any value in any field: a working load, or one line ----------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                max_size=3), max_leaves=6)


@pytest.fixture(scope="module")
def fuzz_folder(model_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz") / "model"
    shutil.copytree(model_dir, folder)
    return folder


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_value_in_any_field_loads_or_is_one_line(fuzz_folder, model_dir, data):
    original = config_json(model_dir)
    path = data.draw(st.sampled_from(field_paths(original)))
    config = with_field(original, path, data.draw(JSON | st.just(REMOVED)))
    (fuzz_folder / "config.json").write_text(json.dumps(config, allow_nan=True))
    try:
        use_folder(fuzz_folder)
    except ChargenError as e:
        assert "\n" not in str(e) and "config.json" in str(e), str(e)



def test_the_apps_model_list_leaves_out_what_would_not_load(tmp_path, model_dir):
    """The shelf lists a folder only if chargen.load would take it, checked without waiting
    on a FIFO or reading a device."""
    from chargen.shelf import Shelf

    models = tmp_path / "models"
    for name in ("good", "fifo", "device", "badfield", "lfs"):
        shutil.copytree(model_dir, models / name)
    (models / "fifo" / "tokenizer.json").unlink()
    os.mkfifo(models / "fifo" / "tokenizer.json")
    (models / "device" / "model.safetensors").unlink()
    (models / "device" / "model.safetensors").symlink_to("/dev/zero")
    config = config_json(model_dir)
    config["model"]["hidden"] = "wide"
    (models / "badfield" / "config.json").write_text(json.dumps(config))
    (models / "lfs" / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    (models / "notes").mkdir()
    (models / "notes" / "config.json").write_text("{}")
    shelf = Shelf(models, tmp_path / "runs")
    assert shelf.names() == ["good"]
    assert shelf.get("good").generate("", 5, seed=1)
    with pytest.raises(ChargenError, match="unknown model 'fifo'"):
        shelf.get("fifo")


def test_links_that_loop_are_one_line(model_copy, tmp_path, capsys):
    (model_copy / "tokenizer.json").unlink()
    (model_copy / "tokenizer.json").symlink_to("tokenizer.json")  # (itself)
    one_line(main(["sample", str(model_copy)]), capsys.readouterr().err, "is a link that leads back to itself")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    for argv in (["sample", str(ROOT / "models" / "names"), "--output", str(tmp_path / "a")],
                 ["export", str(ROOT / "models" / "names"), str(tmp_path / "a")]):
        one_line(main(argv), capsys.readouterr().err, "a is a link that leads back to itself")


def test_a_hand_edited_weights_header_is_one_line(model_copy, capsys):
    """A header whose shapes are not lists (a valid size, a valid file otherwise)."""
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    header["head.bias"]["shape"] = 7
    edited = json.dumps(header, separators=(",", ":")).encode().ljust(length)  # (the same length: offsets hold)
    assert len(edited) == length
    path.write_bytes(data[:8] + edited + data[8 + length:])
    one_line(main(["sample", str(model_copy)]), capsys.readouterr().err, "(head.bias: F32 7, where the model has")
