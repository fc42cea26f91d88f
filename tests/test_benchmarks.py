"""benchmarks/ is one package: every benchmark runs as ``python -m benchmarks.NAME`` from the
root, answers ``--help`` with what it measures, and none edits sys.path to find its code."""

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
NAMES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in ("__init__", "common"))

# sys.path.insert / .append / .extend, sys.path[:0] = ..., sys.path += ..., sys.path = ...; in
# code and in the source of a child program alike (a string), not in prose about it.
PATH_EDIT = re.compile(r"sys\.path(\.(insert|append|extend)\(|\[[^\]]*\]\s*=|\s*\+=|\s*=(?!=))")

# Each module's --help in one process (importing torch once: the suite runs twice on 2 cores).
DRIVER = textwrap.dedent("""
    import contextlib, importlib, io, json, sys
    for name in sys.argv[1:]:
        sys.argv, out, code = [name, "--help"], io.StringIO(), "returned"
        try:
            with contextlib.redirect_stdout(out):
                importlib.import_module(f"benchmarks.{name}").main()
        except SystemExit as e:
            code = e.code
        except Exception as e:
            code = f"{type(e).__name__}: {e}"
        print(json.dumps({"name": name, "code": code, "help": out.getvalue()}))
""")


def test_no_benchmark_edits_sys_path():
    for path in sorted(BENCHMARKS.glob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not PATH_EDIT.search(line), f"{path.name}:{number}: {line.strip()}"


def test_every_benchmark_answers_help():
    done = subprocess.run([sys.executable, "-c", DRIVER, *NAMES], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    helps = {row["name"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert sorted(helps) == NAMES
    for name, row in helps.items():
        assert row["code"] == 0, f"{name}: {row['code']}"
        assert row["help"].startswith(f"usage: python -m benchmarks.{name}"), name
        doc = ast.get_docstring(ast.parse((BENCHMARKS / f"{name}.py").read_text(encoding="utf-8")))
        assert doc.splitlines()[0] in row["help"], f"{name}: the docstring is the description"
        assert f"python -m benchmarks.{name}" in doc, f"{name}: its docstring shows how to run it"
    # The merged benchmarks keep both halves, chosen by --only.
    assert "--only {speed,parts}" in helps["sampling"]["help"] and "--repeats" in helps["sampling"]["help"]
    for flag in ("--only {latency,load}", "--code", "--report", "--tries", "--timeout"):
        assert flag in helps["app_load"]["help"], flag


def test_no_benchmark_function_is_longer_than_a_screen():
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno - node.lineno < 80, f"{path.name}: {node.name}"


def test_benchmarks_are_named_as_modules():
    """No code, docstring or test says ``python benchmarks/X.py`` (it no longer runs), except
    gpu_check's file form, which is kept on purpose."""
    old = re.compile(r"benchmarks/(?!gpu_check\.py)[a-z_]+\.py")
    for path in [*BENCHMARKS.glob("*.py"), *(ROOT / "tests").glob("*.py")]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not old.search(line), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
