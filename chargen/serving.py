"""What the web app serves, without the page: the model shelf (``chargen.shelf``), each browser session's text
in progress, and the one training job (``chargen.job``). ``app.py`` lays out a page and wires its events to a
``Service``; everything here runs, and is tested, without a server.

Nothing a client sends is trusted: a model is picked by name from the shelf (never a
path), numbers are clamped to ``Limits`` whatever the sliders say, and a problem is a
``ChargenError`` whose message the page shows as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import re
import threading
import time
import unicodedata
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import checkpoint
from .api import TrainedModel
from .batching import Generation, SharedLoop
from .checks import MAX_SEED, check_seed
from .config import TrainConfig
from .device import resolve_device
from .errors import ChargenError
from .job import TrainingJob, TrainingView
from .model import ModelConfig
from .record import read_record
from .sample import DEFAULTS, Sampler, SamplingOptions
from .shelf import PAGE_HEADERS, Downloads, Shelf, WebPages, model_card

__all__ = ["AUTO", "DEFAULTS", "PAGE_HEADERS", "PRESETS", "SCRATCH", "Limits", "Service", "TextStream", "TrainingView",
           "Writing"]


@dataclass(frozen=True)
class Limits:
    """What a client may ask for; the server clamps or refuses beyond these, whatever the
    sliders say (a client can send any value)."""

    max_length: int = 3000
    max_samples: int = 8
    max_prime: int = 2000
    max_text: int = 50_000  # characters one page's text may grow to under Continue (all its samples)
    max_upload_mb: int = 20
    min_train_seconds: int = 10
    max_train_seconds: int = 600
    max_rows: int = 256  # rows of text stepped together per model (chargen.batching)
    max_waiting: int = 256  # generations waiting for rows; beyond, turned away
    concurrency: int = 4  # other requests served at once (training, model cards)
    # Requests in Gradio's queue before they start; beyond, turned away. Generations start at
    # once (the loop bounds them), but a burst of them arrives faster than Gradio pops them.
    queue_size: int = 256
    training: bool = True  # the Train tab works (the owner's switch: CHARGEN_TRAINING=off)
    keep_runs: int | None = None  # runs kept in the runs folder; beyond, the oldest are deleted (None: all)
    max_hidden: int | None = None  # the widest LSTM a visitor may train (None: any the sizes offer)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Limits:
        """The server owner's switches: CHARGEN_TRAINING (on/off), CHARGEN_MAX_TRAIN_SECONDS,
        CHARGEN_KEEP_RUNS, CHARGEN_MAX_HIDDEN; a value that is not one is a ChargenError
        naming it."""
        switches: dict = {}
        if (training := environ.get("CHARGEN_TRAINING")) is not None:
            if training.lower() not in ("on", "off", "1", "0", "true", "false"):
                raise ChargenError(f"CHARGEN_TRAINING={training!r}: set it to on or off")
            switches["training"] = training.lower() in ("on", "1", "true")
        for name, field_name, least in (("CHARGEN_MAX_TRAIN_SECONDS", "max_train_seconds", cls.min_train_seconds),
                                        ("CHARGEN_KEEP_RUNS", "keep_runs", 1),
                                        ("CHARGEN_MAX_HIDDEN", "max_hidden", 16)):
            if (value := environ.get(name)) is not None:
                if not value.isdigit() or int(value) < least:
                    raise ChargenError(f"{name}={value!r}: set it to a whole number of at least {least}")
                switches[field_name] = int(value)
        return cls(**switches)


AUTO = "auto (fits the time)"
PRESETS: dict[str, ModelConfig | None] = {  # model sizes for the Train tab; dropout follows the epochs
    AUTO: None,  # chosen for the time budget by a speed probe (chargen.autosize)
    "tiny (1x128)": ModelConfig(embedding=32, hidden=128, layers=1),
    "small (1x256)": ModelConfig(embedding=64, hidden=256, layers=1),
    "medium (1x512)": ModelConfig(embedding=64, hidden=512, layers=1),
}
SCRATCH = "nothing: train from scratch"  # the Train tab's first "start from" choice
ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/'\"`]+/)+[^\s/'\"`;,)]*")  # (chars/s, 1/2 and the like are no path)
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")
BUSY = "This text is still being generated; wait for it or press Stop."
LEAVING_SECONDS = 10.0  # the most a stopped generation may take to leave the loop (one step)


# --- generating --------------------------------------------------------------------------
@dataclass
class Writing:
    """One browser session's text in progress: the sampler keeps the LSTM state where the
    last generation stopped, so Continue costs one step per new character."""

    model_name: str
    prime: str
    sampler: Sampler
    seed: int | None
    rounds: int = 1
    done_items: list[str] = field(default_factory=list)  # lines mode: items of earlier rounds
    # The model the text was started on: Continue goes on with it (and in its loop) even
    # after the shelf has loaded newer weights under the same name.
    model: TrainedModel | None = field(default=None, repr=False, compare=False)
    generation: Generation | None = field(default=None, repr=False, compare=False)  # the last one
    # A server runs handlers concurrently, so a check-then-set could let Continue, pressed
    # twice, put the one sampler into the loop twice: the check and the set hold this.
    guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def busy(self) -> bool:
        """A generation is drawing; a stopped one counts as gone (it leaves the loop at its
        next step, and ``begin`` waits for that)."""
        g = self.generation
        return g is not None and not g.done and not g.cancel_requested

    def begin(self, options: SamplingOptions, first: Callable[[], None] | None = None) -> Generation:
        """This text's next generation, or the busy message at once. ``first`` runs once the
        sampler is this generation's alone (Continue's new round of items)."""
        with self.guard:
            if self.busy:  # e.g. Continue pressed twice
                raise ChargenError(BUSY)
            last = self.generation
            if last is not None and not last.wait_done(LEAVING_SECONDS):  # stopped: one step at most
                raise ChargenError(BUSY)
            if first is not None:
                first()
            self.generation = Generation(self.sampler, options)
            return self.generation

    def text(self) -> str:
        if self.sampler.items:
            return "\n".join(self.done_items + [self.prime + t for t in self.sampler.texts])
        texts = [self.prime + t for t in self.sampler.texts]
        if len(texts) == 1:
            return texts[0]
        return "\n\n".join(f"--- sample {i} of {len(texts)} ---\n{t}" for i, t in enumerate(texts, 1))

    def next_round(self, model: TrainedModel) -> None:
        """Lines mode, once the items have ended: keep them, and start as many new ones
        (the seed moved on, so a seeded text stays reproducible)."""
        self.done_items += [self.prime + t for t in self.sampler.texts]
        seed = None if self.seed is None else (self.seed + self.rounds) % (MAX_SEED + 1)
        self.sampler = model.sampler(self.prime, num_samples=self.sampler.num_samples, seed=seed)
        self.rounds += 1


def clamp(value: float | None, low: float, high: float, default: float) -> float:
    """``value`` within [low, high]; the default for what is not a number."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return default
    return min(high, max(low, value))


class TextStream:
    """The session's text as it grows, drawn in the model's shared loop: once the first
    character is in, then every NOTIFY_EVERY seconds or less often (when many texts share
    the loop: UPDATES_PER_SECOND), and whole at the end, as
    ``(text, writing)``. Iterate it in a thread, or with ``async for`` (the app: no thread is
    held while a text waits for its next characters). Closing it early (Stop, or the page
    gone) takes the text out of the loop at its next step; its sampler keeps the state."""

    def __init__(self, loop: SharedLoop, writing: Writing, options: SamplingOptions,
                 first: Callable[[], None] | None = None) -> None:
        self.loop, self.writing, self.options, self.first = loop, writing, options, first
        self._sync: Iterator[tuple[str, Writing]] | None = None

    def _begin(self) -> Generation:
        generation = self.writing.begin(self.options, self.first)
        try:
            return self.loop.submit(generation)  # (which feeds the prime, on this thread)
        except BaseException:
            generation.end("cancelled")
            raise

    def _update(self, generation: Generation) -> tuple[str, Writing]:
        if generation.status == "failed":
            raise ChargenError(generation.error or "generation failed")
        return self.writing.text(), self.writing

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> tuple[str, Writing]:
        if self._sync is None:
            self._sync = self._updates()
        return next(self._sync)

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()

    def _updates(self) -> Iterator[tuple[str, Writing]]:
        generation = self._begin()
        try:
            seen, finished = 0, False
            while not finished:
                seen = generation.wait(seen)
                finished = generation.done  # (read before the text: a text read after is whole)
                yield self._update(generation)
        finally:
            generation.cancel()

    async def __aiter__(self) -> AsyncIterator[tuple[str, Writing]]:
        begin = asyncio.ensure_future(asyncio.to_thread(self._begin))  # (feeding a long prime takes a moment)
        try:
            generation = await asyncio.shield(begin)
        except asyncio.CancelledError:  # stopped while the prime was fed: stop it once it is in the loop
            begin.add_done_callback(cancel_when_begun)
            raise
        try:
            seen, finished = 0, False
            while not finished:
                seen = await generation.changed(seen)
                finished = generation.done
                yield self._update(generation)
        finally:
            generation.cancel()


def cancel_when_begun(begun: asyncio.Future) -> None:
    if not begun.cancelled() and begun.exception() is None:
        begun.result().cancel()


# --- the service -------------------------------------------------------------------------
class Service:
    """The app's handlers, as plain methods. Generations stream ``(text, writing)``; the
    page keeps ``writing`` in its session state and hands it back to ``continue_``.

    Models generate on ``device``: the CPU by default, where a few texts at a time draw
    about as fast as on a GPU (one small step per character). Training takes the GPU when
    there is one."""

    def __init__(self, models_dir: Path, runs_dir: Path, corpora_dir: Path, limits: Limits = Limits(),
                 poll: float = 0.5, device: str = "cpu", scratch: Path | None = None) -> None:
        self.shelf = Shelf(models_dir, runs_dir, str(resolve_device(device)))
        self.pages = WebPages(self.shelf, None if scratch is None else scratch / "web")
        self.downloads = Downloads(self.shelf, None if scratch is None else scratch / "downloads")
        self.corpora_dir = Path(corpora_dir)
        self.limits = limits
        self.job = TrainingJob()
        self._loops: weakref.WeakKeyDictionary[TrainedModel, SharedLoop] = weakref.WeakKeyDictionary()
        self._loops_lock = threading.Lock()
        self.poll = poll  # seconds between looks at a training's events

    def public(self, message: str) -> str:
        """``message`` as a visitor may see it: the app's folders by their names, any other
        absolute path by its file name alone (no server path is shown)."""
        for folder, shown in ((self.shelf.models_dir, "models"), (self.shelf.runs_dir, "runs"),
                              (self.corpora_dir, "corpora")):
            for form in {str(folder.resolve()), str(folder)} - {shown}:
                if Path(form).is_absolute():
                    message = message.replace(form + "/", shown + "/")
        return ABSOLUTE_PATH.sub(lambda found: Path(found.group()).name, message)

    def describe(self, model_name: str) -> tuple[str, str]:
        """The model's card, and the hint the prime box shows for it."""
        model = self.shelf.get(model_name)
        return model_card(model, model_name), model.kind.prime_hint

    def options(self, length, temperature, top_k, top_p) -> SamplingOptions:
        limits = self.limits
        return SamplingOptions(temperature=clamp(temperature, 0.0, 2.0, DEFAULTS.temperature),
                               top_k=int(clamp(top_k, 0, 1000, DEFAULTS.top_k)),
                               top_p=clamp(top_p, 0.01, 1.0, DEFAULTS.top_p),
                               length=int(clamp(length, 1, limits.max_length, DEFAULTS.length)))

    def generate(self, model_name: str, prime: str | None, length, temperature, top_k, top_p, seed,
                 num_samples) -> TextStream:
        """A new text for the session. Checked before it returns, so a bad request fails
        before anything streams."""
        model = self.shelf.get(model_name)
        prime = prime or ""
        if not isinstance(prime, str):
            raise ChargenError("the prime must be text")
        if len(prime) > self.limits.max_prime:
            raise ChargenError(f"the prime text is longer than {self.limits.max_prime:,} characters; shorten it")
        options = self.options(length, temperature, top_k, top_p)
        n = int(clamp(num_samples, 1, self.limits.max_samples, 1))
        seed = visitor_seed(seed)
        writing = Writing(model_name, prime, model.sampler(prime, num_samples=n, seed=seed), seed, model=model)
        return TextStream(self.loop(model), writing, options)

    def continue_(self, writing: Writing | None, model_name: str, length, temperature, top_k,
                  top_p) -> TextStream:
        """More of the session's text, from where its sampler stopped; in lines mode, once
        the items have ended, a new round of them below the others."""
        if not isinstance(writing, Writing):
            raise ChargenError("Nothing to continue yet: press Generate first.")
        if writing.model_name != model_name:
            raise ChargenError("The model changed since this text was written; press Generate to start with it.")
        options = self.options(length, temperature, top_k, top_p)
        kept, most = len(writing.text()), self.limits.max_text
        if kept + options.length * writing.sampler.num_samples > most:
            raise ChargenError(f"This text has {kept:,} characters; one page keeps at most {most:,}, so it cannot "
                               "grow by that much more. Continue with a shorter length, or press Generate to start "
                               "a new text.")
        model = writing.model or self.shelf.get(model_name)
        new_round = functools.partial(writing.next_round, model) if writing.sampler.items else None
        return TextStream(self.loop(model), writing, options, new_round)

    def loop(self, model: TrainedModel) -> SharedLoop:
        """The model's sampling loop, made on first use (a reloaded model gets a new one)."""
        with self._loops_lock:
            if model not in self._loops:
                self._loops[model] = SharedLoop(model.stepper(), self.limits.max_rows, self.limits.max_waiting)
            return self._loops[model]

    def corpora(self) -> dict[str, Path]:
        """The shipped corpora, by file name."""
        return {p.name: p for p in sorted(self.corpora_dir.glob("*.txt"))}

    def train(self, owner: str, upload, corpus_name: str | None, preset: str, seconds,
              run_name: str | None, start_from: str | None = None) -> Iterator[TrainingView]:
        """Starts a training for ``owner`` (the page's session) and follows it to its end,
        from scratch or, with ``start_from`` (a model's name), fine-tuning that model in its
        own size and mode. Checked and started before it returns: a refusal comes at once."""
        if not self.limits.training:
            if upload:
                forget_upload(Path(upload if isinstance(upload, str) else getattr(upload, "path", "")))
            raise ChargenError("Training is turned off on this server; its models are here to generate with.")
        text_path = self.pick_corpus(upload, corpus_name)
        uploaded = text_path.parent != self.corpora_dir
        try:  # an upload is read into the run's own data, then deleted: never kept, never served
            return self._start(owner, text_path, uploaded, preset, seconds, run_name, start_from)
        except ChargenError as e:
            raise ChargenError(str(e).replace(str(text_path), text_path.name)) from None
        finally:
            if uploaded:
                forget_upload(text_path)

    def _start(self, owner: str, text_path: Path, uploaded: bool, preset, seconds, run_name: str | None,
               start_from: str | None) -> Iterator[TrainingView]:
        if not isinstance(preset, str) or preset not in self.presets():
            raise ChargenError(f"unknown model size {str(preset)[:40]!r}; pick one from the list")
        source = None
        if start_from not in (None, "", SCRATCH):
            source = self.shelf.folders().get(start_from) if isinstance(start_from, str) else None
            if source is None:
                raise ChargenError(f"unknown model {str(start_from)[:60]!r} to start from; pick one from the list")
            if not self.allowed(read_record(source).model):
                raise ChargenError(f"{start_from} is wider than this server trains (at most {self.limits.max_hidden} "
                                   "units); start from a smaller model, or from nothing")
        limits = self.limits
        seconds = int(clamp(seconds, limits.min_train_seconds, limits.max_train_seconds, 60))
        run_dir = new_run_dir(self.shelf.runs_dir, run_name, text_path, self.job.run_dir if self.job.busy() else None)
        config = TrainConfig(max_time=seconds, eval_every=100, log_every=10, sample_chars=200,
                             init_from=str(source) if source else None, max_hidden=limits.max_hidden)
        if source is None:
            mode = self.job.start(owner, text_path, run_dir, PRESETS[preset], config, uploaded=uploaded)
            what = preset
        else:
            source_record = read_record(source)
            mode = self.job.start(owner, text_path, run_dir, None, config, source_record.mode.name, uploaded)
            shape = source_record.model
            what = f"fine-tuning {start_from}, its size {shape.layers}x{shape.hidden}"
        if self.limits.keep_runs is not None:
            forget_old_runs(self.shelf.runs_dir, self.limits.keep_runs - 1, keep=run_dir)
        name = f"runs/{run_dir.name}"
        view = TrainingView(f"Training **{name}** ({what}, {mode} mode) for up to {seconds} s…")
        return self._follow(name, view)

    def presets(self) -> list[str]:
        """The model sizes a visitor may pick: those the owner's CHARGEN_MAX_HIDDEN allows
        (auto then chooses among the sizes it allows)."""
        return [name for name, model in PRESETS.items() if model is None or self.allowed(model)]

    def allowed(self, model: ModelConfig) -> bool:
        return self.limits.max_hidden is None or model.hidden <= self.limits.max_hidden

    def _follow(self, name: str, view: TrainingView) -> Iterator[TrainingView]:
        yield view
        yield from self.job.watch(name, view, self.poll)

    def stop_training(self, owner: str) -> str:
        return self.job.request_stop(owner)

    def pick_corpus(self, upload, corpus_name: str | None) -> Path:
        if upload:
            path = Path(upload if isinstance(upload, str) else getattr(upload, "path", ""))
            if path.suffix.lower() != ".txt" or not path.is_file():
                raise ChargenError("upload a plain-text .txt file")
            if path.stat().st_size > self.limits.max_upload_mb * 1_000_000:
                raise ChargenError(f"the upload is over {self.limits.max_upload_mb} MB; upload a smaller text")
            return path
        corpora = self.corpora()
        if corpus_name not in corpora:
            raise ChargenError("upload a .txt file or pick a shipped corpus from the list")
        return corpora[corpus_name]


def visitor_seed(seed) -> int | None:
    """The page's seed box: empty or negative is a random seed; else a whole number in the
    one seed domain (chargen.checks.check_seed), refused beyond it, never wrapped."""
    if seed is None or (isinstance(seed, int | float) and not isinstance(seed, bool) and seed < 0):
        return None
    if isinstance(seed, float) and seed.is_integer():
        seed = int(seed)
    try:
        check_seed(seed)
    except ChargenError as e:
        raise ChargenError(f"{e} (or -1 for a random one)") from None
    return seed


def forget_old_runs(runs_dir: Path, most: int, keep: Path) -> list[Path]:
    """Delete the oldest chargen runs in ``runs_dir`` (by their config.json's time) beyond
    ``most`` others than ``keep``: their chargen files only, and their folders once empty."""
    runs = [p for p in runs_dir.iterdir() if p != keep and checkpoint.describe_folder(p) == "run"] \
        if runs_dir.is_dir() else []
    runs.sort(key=lambda p: (p / checkpoint.CONFIG).stat().st_mtime)
    old = runs[: max(0, len(runs) - most)]
    for run in old:
        checkpoint.remove_ours(run, "run")
        with contextlib.suppress(OSError):
            run.rmdir()
    return old


def forget_upload(path: Path) -> None:
    """Delete an upload from the server's upload cache, and its folder there once empty (a
    folder of its own: Gradio keeps each upload in one)."""
    if path.name and path.is_file():  # (a forged value may name anything: only a file is removed)
        path.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()


def new_run_dir(runs_dir: Path, run_name: str | None, text_path: Path, training: Path | None = None) -> Path:
    """The folder of a new run: ``run_name`` as given (letters, digits, '.', '_', '-'), or
    else a name made from the text's file name (any file name: a safe one comes out) and
    the time, made unique. A run that died before its first checkpoint (no weights, not
    the one training now) gives its name up: its folder is reused."""
    given = run_name.strip() if isinstance(run_name, str) else ""
    if given and not RUN_NAME.fullmatch(given):
        raise ChargenError("a run name is 1-48 letters, digits, '.', '_' or '-', starting with a letter or digit")
    name = given or f"{slug(text_path.stem)}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        run_dir = runs_dir / (name if n == 1 else f"{name[:44]}-{n}")
        if not run_dir.exists() or (reusable(run_dir) and run_dir != training):
            return run_dir
        if given:
            raise ChargenError(f"a run named {given!r} exists already; choose another name")
    raise ChargenError("too many runs of that name; give the run a name of its own")


def slug(stem: str) -> str:
    """A file name's stem as a run name's start: accents dropped, spaces and the like as '-',
    anything else left out; "text" where nothing is left."""
    ascii_ = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode()
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", ascii_).strip("-._")[:30].rstrip("-._")
    return cleaned or "text"


def reusable(run_dir: Path) -> bool:
    """A chargen run folder without weights: its run stopped (or was killed) before saving."""
    return checkpoint.describe_folder(run_dir) == "run" and not (run_dir / checkpoint.WEIGHTS).exists() \
        and not (run_dir / checkpoint.BEST).exists()
