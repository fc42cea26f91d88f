"""The models the web app offers, by name (never a path): the shelf of model and run
folders, each checked as ``chargen.load`` checks it before it is listed, loaded once and
reloaded when its weights change; and each model's static page (``export --web``).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import urllib.parse
import zipfile
from collections.abc import Callable
from pathlib import Path

from . import checkpoint
from .api import TrainedModel, load
from .errors import ChargenError
from .export import export_model, export_web
from .web import CARD, HEADER, PAGE_FILES
from .web import WEIGHTS as WEB_WEIGHTS


class Shelf:
    """Model folders by name: ``models/<name>`` as ``<name>``, ``runs/<name>`` as
    ``runs/<name>``. Loaded on ``device`` on first use and kept; reloaded when the weights
    change."""

    def __init__(self, models_dir: Path, runs_dir: Path, device: str = "cpu") -> None:
        self.models_dir, self.runs_dir, self.device = Path(models_dir), Path(runs_dir), device
        self._loaded: dict[str, tuple[float, TrainedModel]] = {}
        self._checked: dict[Path, tuple[int, ...]] = {}  # folders that passed read_folder, by their files' times
        self._lock = threading.Lock()

    def folders(self) -> dict[str, Path]:
        """The folders that load: each checked as ``chargen.load`` checks it (its record, its
        vocabulary, its weights' header), again only when one of its files changes."""
        found = {}
        for base, prefix in ((self.models_dir, ""), (self.runs_dir, "runs/")):
            if base.is_dir():
                for folder in sorted(base.iterdir()):
                    if folder.is_dir() and self._loads(folder):
                        found[prefix + folder.name] = folder
        return found

    def _loads(self, folder: Path) -> bool:
        try:
            stamp = tuple(os.stat(folder / name).st_mtime_ns for name in (checkpoint.CONFIG, checkpoint.TOKENIZER))
            stamp += (os.stat(checkpoint.weights_path(folder)).st_mtime_ns,)
        except OSError:
            return False
        if self._checked.get(folder) != stamp:
            try:
                checkpoint.read_folder(folder)
            except ChargenError:
                return False
            self._checked[folder] = stamp
        return True

    def names(self) -> list[str]:
        return list(self.folders())

    def default(self) -> str | None:
        names = self.names()
        return "shakespeare" if "shakespeare" in names else (names[0] if names else None)

    def get(self, name: str) -> TrainedModel:
        folder = self.folders().get(name) if isinstance(name, str) else None
        if folder is None:
            raise ChargenError(f"unknown model {str(name)[:60]!r}; pick one from the list")
        stamp = weights_file(folder).stat().st_mtime
        with self._lock:
            cached = self._loaded.get(name)
            if cached is None or cached[0] != stamp:
                self._loaded[name] = (stamp, load(folder, device=self.device))
            return self._loaded[name][1]


# The pages' headers, for a server that serves them (the app): the policy of the page's own
# <meta> tag, with what a <meta> tag cannot say: no framing by other sites, no <base>, forms
# to the page's origin only; and no guessing of a file's type.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; frame-ancestors 'self'; base-uri 'none'; "
                               "form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "SAMEORIGIN",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-cache",
}


class MadeOnDemand:
    """Files made from a shelf model on first request, into a folder of this process's own,
    and made again when the model's weights change."""

    def __init__(self, shelf: Shelf, root: Path | None = None) -> None:
        self.shelf = shelf
        if root is None:  # (the app gives a folder of its own, removed when it stops)
            root = Path(tempfile.mkdtemp(prefix="chargen-made-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
        self.root = root
        self._made: dict[tuple[str, str], tuple[float, Path]] = {}
        self._lock = threading.Lock()

    def made(self, name: str, kind: str, make: Callable[[Path, Path], Path]) -> Path:
        """``make(source_folder, out)``'s result for the model ``name``: made into ``out``, a
        fresh folder of its own, unless made already from the same weights."""
        source = self.shelf.folders().get(name)
        if source is None:
            raise ChargenError(f"no such model: {name[:60]!r}")
        stamp = weights_file(source).stat().st_mtime
        with self._lock:
            made = self._made.get((name, kind))
            if made is None or made[0] != stamp:
                out = self.root / hashlib.sha256(f"{kind}/{name}".encode()).hexdigest()[:16]
                self._made[(name, kind)] = (stamp, make(source, out))
            return self._made[(name, kind)][1]


class WebPages(MadeOnDemand):
    """Each shelf model's static page (``chargen export --web``), for the app to serve. The
    visitor's browser then samples; the server only sends the files."""

    FILES = (*PAGE_FILES, HEADER, WEB_WEIGHTS, CARD)

    def file(self, name: str, file: str) -> Path:
        """The path of ``file`` of the model ``name``'s page; a ChargenError for a name not
        on the shelf or a file the page does not have."""
        if file not in self.FILES:
            raise ChargenError(f"no such page: {name}/{file}")
        return self.made(name, "page", lambda source, out: export_web(source, out, force=True)) / file


class Downloads(MadeOnDemand):
    """Each shelf model to take home, as a zip of one folder named after it: the model
    folder (``chargen export``: config, tokenizer, weights, card) or its static page
    (``export --web``)."""

    FILES = ("model.zip", "page.zip")

    def file(self, name: str, file: str) -> Path:
        if file not in self.FILES:
            raise ChargenError(f"no such download: {name}/{file}")
        export = export_model if file == "model.zip" else export_web
        return self.made(name, file, lambda source, out: zipped(source, out, Path(name).name, export))


def zipped(source: Path, out: Path, name: str, export: Callable[[Path, Path], Path]) -> Path:
    """``export(source, folder)`` of a folder called ``name``, zipped as ``out``.zip."""
    shutil.rmtree(out, ignore_errors=True)
    export(source, out / name)
    archive = out.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped_folder:
        for file in sorted((out / name).rglob("*")):
            if file.is_file():
                zipped_folder.write(file, file.relative_to(out))
    shutil.rmtree(out, ignore_errors=True)
    return archive


def download_path(name: str, file: str) -> str:
    """Where the app serves a model's download, relative to the app's own address."""
    return f"download/{urllib.parse.quote(name)}/{file}"


def weights_file(folder: Path) -> Path | None:
    """The weights ``chargen.load`` would read (the best, else the latest), if any."""
    path = checkpoint.weights_path(folder)
    return path if path.is_file() else None


def model_card(model: TrainedModel, name: str | None = None) -> str:
    record, shape = model.record, model.record.model
    val = record.summary.best_val_bpc
    page = (f" · [run it in your browser]({web_path(name)}) · download the [model]({download_path(name, 'model.zip')})"
            f" or its [page]({download_path(name, 'page.zip')})") if name else ""
    return (f"**{record.corpus.name}** · {model.kind.description} · {shape.layers}x{shape.hidden} LSTM, "
            f"{record.parameters:,} parameters · "
            f"{'not validated yet' if val is None else f'validation {val:.3f} bits/char'}{page}")


def web_path(name: str) -> str:
    """Where the app serves the model's page, relative to the app's own address."""
    return f"web/{urllib.parse.quote(name)}/"
