"""What several benchmarks (and some tests) share: a command line, the web app started on a
loopback port, child processes that run a given tree's code, a checkout of another revision,
the machine's CPU, a corpus split into training and validation files, results files, and a
folder served over http."""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import http.server
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"  # (ignored by git: what the benchmarks write)


# --- the command line ----------------------------------------------------------------------
def command_line(doc: str | None, module: str) -> argparse.ArgumentParser:
    """A benchmark's parser: ``--help`` shows its docstring (what it measures, how long it
    takes, how to run it) and names it as it is run, ``python -m benchmarks.NAME``."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


# --- the web app -----------------------------------------------------------------------------
# No analytics and no Hub: a measurement must not wait on the network. Unbuffered, so that a
# log written to a file is whole when a test shows it.
APP_ENV = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


class AppDidNotStart(SystemExit):
    """The app exited, or did not serve in time (a SystemExit: a benchmark stops on one line)."""


@dataclass(frozen=True)
class App:
    """A running app: its process, its address, and the seconds from launch to its first page."""

    process: subprocess.Popen
    url: str
    start_seconds: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something on this machine's loopback ``port`` takes connections."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def serving(port: int) -> bool:
    """Whether the app on this machine's loopback ``port`` answers "/" (a readiness poll)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def start_app(args: list[str], root: Path = ROOT, cwd: Path | None = None, log: IO | None = None,
              timeout: float = 120.0) -> App:
    """``root``'s app.py (a checkout's app imports its own chargen: the script's folder comes
    first on its path) with ``args`` on a free loopback port, once it serves "/". It runs in
    ``cwd`` (default ``root``), its output to ``log`` (default nowhere)."""
    port = free_port()
    env = os.environ | APP_ENV
    env.pop("SPACE_ID", None)  # (the app behaves as a Space where that is set)
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(root / "app.py"), *args, "--port", str(port)], cwd=cwd or root,
                               env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    while not serving(port):
        exited = process.poll()
        if exited is not None or time.perf_counter() - started > timeout:
            stop(process)
            raise AppDidNotStart(f"the app did not start: it exited with code {exited}" if exited is not None
                                 else f"the app did not start: no page within {timeout:g} s")
        time.sleep(0.05)
    return App(process, f"http://127.0.0.1:{port}/", time.perf_counter() - started)


def stop(process: subprocess.Popen, timeout: float = 30.0) -> None:
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def running_app(args: list[str], **where) -> Iterator[App]:
    """:func:`start_app` for the length of a ``with`` block; stopped however it ends."""
    app = start_app(args, **where)
    try:
        yield app
    finally:
        stop(app.process)


def client_for(url: str):
    """A gradio_client Client of the app at ``url``, quiet and offline."""
    os.environ.update(APP_ENV)  # (gradio_client reads these when it is imported)
    from gradio_client import Client

    return Client(url, verbose=False, analytics_enabled=False, download_files=False)


def chromium() -> str | None:
    """Debian's Chromium (the browser the page tests and benchmarks drive), where installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


# --- child processes -------------------------------------------------------------------------
def child_env(tree: Path = ROOT, isa: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a child (``python -m chargen`` or a benchmark) that runs
    ``tree``'s code from any folder, plus ``extra``. With ``isa``, oneDNN is capped at that
    (an ONEDNN_MAX_CPU_ISA value such as AVX2), or not at all for "native"; without it, the
    child keeps this process's cap, if any."""
    env = os.environ | {"PYTHONPATH": str(tree), **extra}
    if isa is not None:
        env.pop("ONEDNN_MAX_CPU_ISA", None)
        if isa != "native":
            env["ONEDNN_MAX_CPU_ISA"] = isa
    return env


# --- another revision ----------------------------------------------------------------------
def checkout(rev: str, tree: Path) -> Path:
    """``tree``, holding ``rev`` (a git worktree beside this one, so that a benchmark runs that
    code and this tree's in one sitting on the same machine): made once, and a folder that
    already has the code is kept."""
    if not (tree / "chargen").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), rev],
                       check=True, capture_output=True)
    return tree


def remove_checkout(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


# --- the machine -----------------------------------------------------------------------------
def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name() -> str:
    """The CPU's model name: results gathered over several sittings must not mix machines."""
    return cpu_info().get("model name") or platform.processor() or platform.machine()


# The vector extensions that decide which kernels oneDNN runs (bf16 autocast needs AVX-512 BF16 or AMX).
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "asimd", "sve")


def cpu_flags() -> list[str]:
    """Those of VECTOR_FLAGS the CPU has (x86's "flags", or Arm's "Features")."""
    have = set((cpu_info().get("flags") or cpu_info().get("Features") or "").split())
    return [flag for flag in VECTOR_FLAGS if flag in have]


# --- data and results ------------------------------------------------------------------------
def corpus_split(data: Path, text: Callable[[], str], share: float = 0.9, at_line: bool = False) -> tuple[Path, Path]:
    """``data``/train.txt and val.txt: the first ``share`` of ``text()`` and the rest (cut
    after a line break where ``at_line``). Made once: ``text`` is not called again."""
    train, val = data / "train.txt", data / "val.txt"
    if not train.exists():
        whole = text()
        cut = int(len(whole) * share)
        if at_line:
            cut = whole.rfind("\n", 0, cut) + 1
        data.mkdir(parents=True, exist_ok=True)
        val.write_text(whole[cut:], encoding="utf-8")
        train.write_text(whole[:cut], encoding="utf-8")  # (last: the split is there once train.txt is)
    return train, val


def run_logged(cmd: list[str], run: Path, env: dict[str, str], cwd: Path, what: str) -> float:
    """Run a benchmark's child, its output kept in ``run``/log.txt; its wall seconds, or
    SystemExit with the end of its output when it fails."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (run / "log.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{(done.stderr or done.stdout)[-2000:]}")
    return wall


def read_jsonl(path: Path) -> list[dict]:
    """A file of one JSON object a line (results, or a run's metrics.jsonl); none if it is missing."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_jsonl(path: Path, row: dict) -> None:
    """One row more, written as it is measured: a benchmark cut short keeps what it did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def write_json(path: Path, data: object, indent: int | None = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + "\n")


# --- a static host ---------------------------------------------------------------------------
@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """``folder`` over http on a free loopback port, as any static host serves a page that
    ``chargen export --web`` wrote (``python -m http.server`` does the same by hand); yields
    its address."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
