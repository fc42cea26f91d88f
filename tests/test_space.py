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
    # (the Hub's hardware flavours; a CPU app: sampling and training are CPU work)
    assert meta.get("suggested_hardware") in {"cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1"}


def test_one_gradio_release_everywhere():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = {spec for group in pyproject["project"]["optional-dependencies"].values() for spec in group
            if spec.startswith("gradio")}
    requirements = requirement_lines()
    pins |= {spec for spec in requirements if spec.startswith("gradio")}
    assert pins == {f"gradio=={front_matter()['sdk_version']}"}
    # Spaces install requirements.txt before the repository is in place: it lists what the
    # package needs rather than the package itself.
    assert {package(spec) for spec in pyproject["project"]["dependencies"]} <= set(map(package, requirements))


def requirement_lines() -> list[str]:
    lines = (line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def package(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0].lower()


def test_one_torch_release_everywhere():
    """The Space installs the torch release that CI tests and the README's commands name."""
    pins = [spec for spec in requirement_lines() if package(spec) == "torch"]
    assert len(pins) == 1 and re.fullmatch(r"torch==\d+\.\d+\.\d+", pins[0]), pins
    ci = re.findall(r"torch==[\d.]+", (ROOT / ".ci" / "run").read_text())
    readme = re.findall(r"pip install (torch==[\d.]+)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert ci and readme and set(ci) == set(readme) == {pins[0]}


def test_every_binary_file_is_tracked_by_lfs():
    """The Hub takes binary files in a git push only through LFS: each one in the tree
    matches a pattern of .gitattributes that sends it there."""
    patterns = [line.split()[0] for line in (ROOT / ".gitattributes").read_text().splitlines()
                if line.strip() and not line.startswith("#") and "filter=lfs" in line]
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    binary = [name.decode() for name in files if name and is_binary(ROOT / name.decode())]
    assert binary and "models/shakespeare/model.safetensors" in binary
    for name in binary:
        assert any(Path(name).match(pattern) for pattern in patterns), f"{name} is binary and not in LFS"


def is_binary(path: Path) -> bool:
    head = path.read_bytes()[:8192] if path.is_file() else b""
    if b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(head) - 4  # (not a character cut at the end of the head)
    return False


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
        assert f"{model.record.summary.best_val_bpc:.4f}" in readme
        assert f"{model.record.parameters:,}" in readme
        size = sum(f.stat().st_size for f in (ROOT / "models" / name).iterdir())
        assert size < 6_000_000, "a shipped model is a few MB at most"
    text = chargen.load(ROOT / "models" / "shakespeare").generate("ROMEO:", 200, seed=1)
    assert len(text) == len("ROMEO:") + 200 and text.startswith("ROMEO:") and "\n" in text[6:]


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
