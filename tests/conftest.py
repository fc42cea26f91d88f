import contextlib
import json
import os
import random
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import benchmarks.common
from benchmarks.common import chromium
from chargen import ModelConfig, TrainConfig
from chargen.device import autocast_problem
from chargen.export import export_model

ROOT = Path(__file__).resolve().parents[1]

# Tiny models run faster on one thread, and the suite does not fight other work for cores.
torch.set_num_threads(1)

# Tests that train under bf16 autocast run where its kernels do (decided as the trainer
# decides it), and skip, saying why, where they do not: AVX2-only CPUs, or ONEDNN_MAX_CPU_ISA=AVX2.
BF16_PROBLEM = autocast_problem(torch.device("cpu"), torch.bfloat16)
needs_bf16 = pytest.mark.skipif(BF16_PROBLEM is not None, reason=f"bf16 autocast does not run here: {BF16_PROBLEM}")

# Modules whose outcome no CPU feature changes: they check files, folders, pages, the docs,
# the app's plumbing and the code's shape, not the numbers the kernels compute. CI runs them
# once, not again in its AVX2-capped pass (.ci/run: -m "not once"); a new module runs in both.
ONCE = {
    "test_app": "the app's HTTP, browser and start-up plumbing (its sampling and training: test_serving)",
    "test_benchmarks": "each benchmark's --help",
    "test_card": "the model card's text",
    "test_cli_extremes": "arguments refused in one line",
    "test_corpus": "reading and splitting text",
    "test_corpus_files": "many files as one corpus",
    "test_docs": "the docs' commands and links",
    "test_fuzz": "hostile text files and checkpoints refused",
    "test_hostile_folders": "hostile run and model folders refused",
    "test_page": "the page's layout",
    "test_sample_output": "stdout encodings, pipes and --output files",
    "test_space": "the Space's files and pins",
    "test_structure": "the code's shape",
    "test_tensorboard": "event files mirroring metrics.jsonl",
    "test_tokenizer": "the vocabulary",
    "test_web": "the static page in a browser against the portable sampler (numpy, not oneDNN)",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in ONCE:
            item.add_marker(pytest.mark.once)


SENTENCE = (
    "the king and queen of england sat upon the throne while the fool sang of love "
    "and war and wine; what light through yonder window breaks? it is the east"
)
WORDS = SENTENCE.split()


def config_json(folder: Path) -> dict:
    """A run or model folder's config.json as it is on disk (chargen reads it through chargen.record)."""
    return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))


def make_text(n_lines: int = 400, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
        lines.append(" ".join(words).capitalize() + rng.choice(".,;!?"))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(make_text(), encoding="utf-8")
    return path


def name_list(n: int = 400, seed: int = 0) -> list[str]:
    """Made-up names, 2 to 13 letters: a list of short items for lines mode."""
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list("aeioubdklmnrst"), size=rng.integers(2, 14))).title() for _ in range(n)]


def tiny_model(**overrides) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 1, "embedding": 8, "hidden": 24, "layers": 2, "dropout": 0.1, **overrides})


def tiny_train(**overrides) -> TrainConfig:
    settings = {"batch_size": 4, "bptt": 16, "steps": 12, "eval_every": 6, "log_every": 2,
                "sample_chars": 20, "warmup_steps": 2, "base_batch_size": 4, "device": "cpu", "seed": 7}
    return TrainConfig(**{**settings, **overrides})


TINY_FLAGS = ["--hidden", "24", "--layers", "1", "--embedding", "8", "--batch-size", "4", "--bptt", "16",
              "--eval-every", "5", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, corpus_file) -> Path:
    """A tiny run, trained once for the sampling and evaluation tests."""
    from chargen import load_corpus, train

    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    train(load_corpus(corpus_file), run_dir, tiny_model(), tiny_train(steps=30, eval_every=10))
    return run_dir


@pytest.fixture(scope="session")
def lines_run(tmp_path_factory) -> Path:
    """A tiny lines-mode run on made-up names, trained enough that its items end."""
    from chargen import load_corpus, train

    path = tmp_path_factory.mktemp("lines") / "names.txt"
    path.write_text("\n".join(name_list(600, seed=4)) + "\n")
    run_dir = tmp_path_factory.mktemp("runs") / "names"
    train(load_corpus(path, mode="lines"), run_dir, tiny_model(hidden=48, layers=1),
          tiny_train(steps=120, eval_every=60, batch_size=16, base_batch_size=16, base_lr=1e-2))
    return run_dir


def shelf_of_models(base: Path, trained_run: Path) -> Path:
    """``base/models`` with a tiny stream model ("shakespeare") and a tiny lines model
    ("names"), as the app and the serving layer offer them."""
    from chargen import load_corpus, train

    export_model(trained_run, base / "models" / "shakespeare")
    names = base / "names.txt"
    names.write_text("\n".join(name_list(300)) + "\n")
    train(load_corpus(names, mode="lines"), base / "names-run", tiny_model(), tiny_train(steps=20, eval_every=10))
    export_model(base / "names-run", base / "models" / "names")
    return base / "models"


def interrupt_at(step):
    """An on_event hook that sends this process SIGINT when training reaches ``step``,
    exercising the real Ctrl-C path: stop after the step, save, return."""
    def hook(event):
        if event["event"] == "train" and event["step"] == step:
            os.kill(os.getpid(), signal.SIGINT)
    return hook


@contextlib.contextmanager
def start_app(args: list[str], cwd: Path):
    """``python app.py ARGS`` on a free loopback port, started as the benchmarks start it;
    yields its URL and process once it serves."""
    with tempfile.NamedTemporaryFile("w", dir=cwd, prefix="app-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
        try:
            app = benchmarks.common.start_app(args, cwd=cwd, log=log, timeout=90)
        except benchmarks.common.AppDidNotStart as e:
            pytest.fail(f"{e}:\n" + log_path.read_text()[-3000:])
        try:
            yield app.url, app.process
        finally:
            benchmarks.common.stop(app.process, timeout=20)


def load_script(relative_path: str):
    """A script of the repository (app.py) imported as a module, by its path."""
    import importlib.util

    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --- a real browser (Debian's chromium, driven by playwright) --------------------------------
def needs_a_browser() -> None:
    if chromium() is None or not _has_playwright():
        if os.environ.get("CI"):
            pytest.fail("CI must have Chromium and playwright (see .ci/run)")
        pytest.skip("needs Debian's chromium and the playwright package")


def _has_playwright() -> bool:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return False
    return True
