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


def test_shipped_models_match_their_readme():
    import chargen

    readme = (ROOT / "models" / "README.md").read_text()
    for name, mode in (("shakespeare", "stream"), ("names", "lines")):
        model = chargen.load(ROOT / "models" / name, device="cpu")
        assert model.mode == mode
        assert f"{model.config['summary']['best_val_bpc']:.4f}" in readme
        assert f"{model.config['parameters']:,}" in readme
        size = sum(f.stat().st_size for f in (ROOT / "models" / name).iterdir())
        assert size < 6_000_000, "a shipped model is a few MB at most"
    text = chargen.load(ROOT / "models" / "shakespeare").generate("ROMEO:", 200, seed=1)
    assert len(text) == 200 and "\n" in text


def test_fresh_app_serves_the_shipped_models(tmp_path):
    """`python app.py` as a new user runs it: the default models folder, no training."""
    from gradio_client import Client
    from test_app import start_app

    with start_app(["--runs", str(tmp_path / "runs")], cwd=tmp_path) as (url, _):
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
        text = client.predict("shakespeare", "ROMEO:", 100, 0.8, 0, 1.0, 1, 1, api_name="/generate")
        assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 100
        names = client.predict("names", "", 20, 0.8, 0, 1.0, 1, 5, api_name="/generate").split("\n")
        assert len(names) == 5 and all(names)
