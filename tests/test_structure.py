"""The layers' imports, as the design has them: the data layer knows no model, evaluation is
one module, and the public API does not reach into the trainer."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "chargen"


def imported(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.add(node.module or "")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("chargen."):
            names.add(node.module.removeprefix("chargen."))
    return names


@pytest.mark.parametrize("module", ["textfile", "lines", "corpus", "feeds"])
def test_the_data_layer_imports_no_model(module):
    assert "model" not in imported(module)


def test_the_api_imports_nothing_from_the_trainer():
    assert "train" not in imported("api")


def test_evaluation_is_one_module():
    for module in PACKAGE.glob("*.py"):
        source = module.read_text(encoding="utf-8")
        if module.stem != "evaluate":
            assert "def evaluate_streams" not in source and "def evaluate_items" not in source, module.name
            assert "math.log(2)" not in source, module.name


def test_what_differs_between_modes_is_asked_of_the_mode():
    """Outside the data layer, code asks the mode object (chargen.modes) what it needs, and
    never compares a mode's name."""
    for path in [*PACKAGE.glob("*.py"), PACKAGE.parent / "app.py"]:
        if path.stem in ("corpus", "lines", "modes"):
            continue
        source = path.read_text(encoding="utf-8")
        assert '== "lines"' not in source and '== "stream"' not in source, path.name


def test_sampling_defaults_are_written_once():
    """The API, the sampler, the CLI and the app take their sampling defaults from one
    SamplingOptions: the same call draws the same text through each."""
    import inspect

    from chargen.api import TrainedModel
    from chargen.cli import build_parser
    from chargen.sample import DEFAULTS, Sampler

    assert inspect.signature(Sampler.pieces).parameters["temperature"].default == DEFAULTS.temperature
    for name in ("temperature", "top_k", "top_p"):
        assert inspect.signature(TrainedModel.stream_batch).parameters[name].default == getattr(DEFAULTS, name)
    args = build_parser().parse_args(["sample", "RUN"])
    assert (args.temperature, args.top_k, args.top_p, args.length) == \
        (DEFAULTS.temperature, DEFAULTS.top_k, DEFAULTS.top_p, DEFAULTS.length)
    for path in [*PACKAGE.glob("*.py"), PACKAGE.parent / "app.py"]:
        if path.stem != "sample":
            assert "=0.8" not in path.read_text(encoding="utf-8").replace(" ", ""), path.name


def test_the_app_is_a_page_over_the_serving_layer():
    """The serving layer knows no UI; the app reaches into chargen only through it."""
    assert not {"gradio", "pandas"} & {name.split(".")[0] for name in imported_anything("serving")}
    tree = ast.parse((PACKAGE.parent / "app.py").read_text(encoding="utf-8"))
    from_chargen = {node.module for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("chargen")}
    assert from_chargen <= {"chargen", "chargen.serving"}, from_chargen


def imported_anything(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_no_function_is_longer_than_a_screen():
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno - node.lineno < 80, f"{path.name}: {node.name}"
