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


def modules() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def test_no_module_is_over_500_lines_and_no_class_over_300():
    for path in modules():
        source = path.read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 500, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno < 300, f"{path.name}: {node.name}"


def assigned_to_self(function: ast.FunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def test_every_attribute_is_first_set_in_init():
    """A class's attributes are all named where it is made (``__init__``, or a dataclass's
    fields): no method brings a new one into being."""
    for path in modules():
        for cls in [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)]:
            made = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
            made |= {name for m in methods if m.name == "__init__" for name in assigned_to_self(m)}
            for method in methods:
                late = assigned_to_self(method) - made
                assert not late, f"{path.name}: {cls.name}.{method.name} first sets {sorted(late)}"


@pytest.mark.parametrize("module, never", [
    ("web", {"train", "prepare"}), ("prepare", {"train"}), ("finetune", {"api"}),
    ("checkpoint", {"trainer_state", "api"}), ("record", {"checkpoint", "train", "api"}), ("storage", {"checkpoint"}),
    ("api", {"train", "prepare", "export"}), ("export", {"train"}),
])
def test_imports_run_one_way(module, never):
    """The lower layers never import the higher ones, and no module imports the package's
    own ``__init__`` (the version comes from chargen.version)."""
    assert not imported(module) & never
    assert "import __version__" not in (PACKAGE / f"{module}.py").read_text(encoding="utf-8").replace(
        "from .version import __version__", "")


def test_checkpoint_reexports_nothing():
    assert "__all__" not in (PACKAGE / "checkpoint.py").read_text(encoding="utf-8")


def test_config_json_is_read_by_the_record_alone():
    """No module but chargen.record reads config.json or looks into it as a raw dict."""
    for path in modules():
        if path.stem == "record":
            continue
        source = path.read_text(encoding="utf-8")
        for raw in ('config.get(', 'config["', "saved.get(", 'saved["', "read_json(run_dir / CONFIG",
                    "read_json(folder / CONFIG)", "read_config("):
            assert raw not in source, f"{path.name}: {raw}"


def test_no_test_only_code_in_the_package():
    source = "\n".join(path.read_text(encoding="utf-8") for path in modules() if path.stem != "portable")
    for name in ("def load_hf", "def from_strings", "def static_server", "def pick(", "def pick_next",
                 "self.eval_seconds"):
        assert name not in source, name  # (portable.pick is the page's draw, used by its sampler)


def test_bits_per_character_come_from_one_function():
    for path in modules():
        if path.stem != "evaluate":
            assert "/ LN2" not in path.read_text(encoding="utf-8"), path.name


def test_every_module_is_in_the_docs_table():
    """docs/building.md's module table names every module of the package, and the app (it
    drifts otherwise)."""
    table = (PACKAGE.parent / "docs" / "building.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    for name in [f"chargen/{path.name}" for path in modules()] + ["app.py"]:
        assert any(f"`{name}`" in row for row in rows), name
