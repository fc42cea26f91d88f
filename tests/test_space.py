"""The repository deploys unchanged as a Hugging Face Space: README front matter, pins
that agree, requirements that cover the package, an app that explains its options."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def front_matter() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), "README.md must open with the Space's YAML front matter"
    block = text[4:text.index("\n---\n", 4)]
    return {k.strip(): v.strip().strip('"') for k, v in (line.split(":", 1) for line in block.splitlines())}


def test_front_matter_names_a_gradio_space():
    meta = front_matter()
    for key in ("title", "emoji", "sdk", "sdk_version", "app_file", "python_version"):
        assert meta.get(key), f"front matter lacks {key}"
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py"
    assert (ROOT / meta["app_file"]).is_file()
    assert re.fullmatch(r"3\.\d+", meta["python_version"])


def test_one_gradio_release_everywhere():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = {spec for group in pyproject["project"]["optional-dependencies"].values() for spec in group
            if spec.startswith("gradio")}
    requirements = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                    if line.strip() and not line.startswith(("#", "-"))]
    pins |= {spec for spec in requirements if spec.startswith("gradio")}
    assert pins == {f"gradio=={front_matter()['sdk_version']}"}
    # Spaces install requirements.txt before the repository is in place: it lists what the
    # package needs rather than the package itself.
    assert set(pyproject["project"]["dependencies"]) <= set(requirements)


def test_app_help_lists_its_options():
    out = subprocess.run([sys.executable, str(ROOT / "app.py"), "--help"], capture_output=True, text=True,
                         timeout=120, env={"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
                                           "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    for option in ("--host", "--port", "--models", "--runs", "--share", "127.0.0.1", "0.0.0.0"):
        assert option in out.stdout
