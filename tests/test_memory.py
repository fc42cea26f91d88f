"""The machine's edges: a model too big for the memory is refused with its figures before
anything is built or written; a run folder that cannot be written, or has no room for the
checkpoints, is refused at the start, not at the first save."""

import os
import re
from pathlib import Path

import pytest
import torch

from chargen import ChargenError, checkpoint, faults, load_corpus, memory, train
from chargen.cli import main
from chargen.model import CharLSTM, ModelConfig
from chargen.storage import load_tensors
from conftest import TINY_FLAGS, tiny_model, tiny_train

CPU = torch.device("cpu")


@pytest.mark.parametrize("layers, hidden, embedding, vocab", [(1, 512, 64, 75), (3, 37, 5, 300), (2, 8, 100, 4)])
def test_the_estimate_counts_the_models_parameters(layers, hidden, embedding, vocab):
    config = ModelConfig(vocab_size=vocab, embedding=embedding, hidden=hidden, layers=layers)
    need = memory.estimate(config, 128, 32)
    assert need.parameters == CharLSTM(config).num_parameters()
    assert need.state == 4 * need.parameters * memory.STATE_COPIES


def test_the_estimate_grows_with_each_size():
    base = ModelConfig(vocab_size=75)
    on_cpu = memory.estimate(base, 128, 32).on(CPU)
    for config, time_steps, batch in [(ModelConfig(75, hidden=1024), 128, 32), (ModelConfig(75, layers=2), 128, 32),
                                      (ModelConfig(5000), 128, 32), (base, 256, 32), (base, 128, 64)]:
        assert memory.estimate(config, time_steps, batch).on(CPU) > on_cpu


def test_too_big_a_model_is_refused_with_its_figures():
    need = memory.estimate(ModelConfig(75, hidden=60_000), 128, 32)
    with pytest.raises(ChargenError) as refused:
        memory.check_fits(need, CPU, 16 * 2**30)
    message = str(refused.value)
    assert re.search(r"needs about [\d,]+\.\d GB \(", message) and "16.0 GB free" in message
    assert "lower --hidden or --layers" in message
    wide = memory.estimate(ModelConfig(75), 512, 4096)
    with pytest.raises(ChargenError, match="lower --batch-size or --bptt"):
        memory.check_fits(wide, CPU, 2**30)
    memory.check_fits(wide, CPU, None)  # unknown: no refusal
    memory.check_fits(memory.estimate(ModelConfig(75), 128, 32), CPU, 2**30)  # the default fits in 1 GB


def test_training_refuses_before_building_or_writing(tmp_path, corpus_file, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 50 * 2**20)
    with pytest.raises(ChargenError, match=r"needs about .* but this machine has 50 MB free"):
        train(load_corpus(corpus_file), tmp_path / "run", tiny_model(hidden=512), tiny_train())
    assert not (tmp_path / "run").exists()


def test_the_cli_refuses_a_huge_model_in_one_line(tmp_path, capsys, corpus_file):
    code = main(["train", str(corpus_file), "--out", str(tmp_path / "run"), "--hidden", "60000", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs about" in err[0] and "lower --hidden" in err[0]


def test_available_memory_reads_meminfo_and_the_container_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    assert memory._meminfo_available(meminfo) == 20_000_000 * 1024
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("1000\n")
    assert memory._cgroup_available(v2) is None  # no limit
    (v2 / "memory.max").write_text(f"{4 * 2**30}\n")
    (v2 / "memory.current").write_text(f"{2**30}\n")
    assert memory._cgroup_available(v2) == 3 * 2**30
    assert memory._cgroup_available(tmp_path / "nothing") is None
    assert memory.available_bytes(CPU) > 0  # this machine says something


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_out_is_refused_at_the_start(tmp_path, capsys, corpus_file):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    code = main(["train", str(corpus_file), "--out", str(locked / "run"), *TINY_FLAGS, "--steps", "2"])
    assert code == 2 and "cannot write to" in capsys.readouterr().err


@pytest.mark.parametrize("out", ["/proc/chargen-test/run", "/sys/chargen-test"])
def test_an_out_that_cannot_be_made_is_refused_at_the_start(tmp_path, capsys, corpus_file, out):
    if Path(out).parts[1] not in os.listdir("/"):
        pytest.skip(f"no {out} here")
    code = main(["train", str(corpus_file), "--out", out, *TINY_FLAGS, "--steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"cannot write to {out}" in err[0], err


def test_no_room_for_the_checkpoints_is_refused_at_the_start(tmp_path, corpus_file, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(ChargenError, match="has 0 MB free, but its files need about"):
        train(load_corpus(corpus_file), tmp_path / "run", tiny_model(), tiny_train())


def test_a_resumed_run_in_a_folder_gone_read_only_is_refused_before_training(tmp_path, corpus_file):
    corpus = load_corpus(corpus_file)
    train(corpus, tmp_path / "run", tiny_model(), tiny_train(steps=4, eval_every=2))
    before = load_tensors(tmp_path / "run" / checkpoint.TRAINER)[1]["progress"]["step"]

    def read_only(path, stage):
        raise PermissionError(13, "Permission denied", str(path))

    with faults.injected(faults.Faults(write=read_only)), \
            pytest.raises(ChargenError, match="cannot write to .*Permission denied"):
        train(corpus, tmp_path / "run", None, tiny_train(steps=8, eval_every=2), resume=True)
    assert load_tensors(tmp_path / "run" / checkpoint.TRAINER)[1]["progress"]["step"] == before
