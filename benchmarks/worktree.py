"""A checkout of an earlier commit beside this tree (a git worktree), so that a benchmark can
run that code and this tree's in one sitting on the same machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout(rev: str, tree: Path) -> Path:
    """``tree``, holding ``rev``: made once (a folder that already has the code is kept)."""
    if not (tree / "chargen").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), rev],
                       check=True, capture_output=True)
    return tree
