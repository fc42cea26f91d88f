"""chargen's web demo: stream text from a trained model, or train one on an upload.

    python app.py                 # http://127.0.0.1:7860, serving models/ and runs/
    python app.py --help

A thin Gradio shell over ``chargen.load`` and ``chargen.train``: every model folder in
models/ (shipped) and runs/ (trained here or by the CLI) is offered by name; nothing a
client sends is used as a path. Deploys unchanged as a Hugging Face Space (see README).
"""

from __future__ import annotations

import os

# No network at run time: no analytics, no model hub. Set before gradio is imported.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import contextlib
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

import chargen
from chargen import ChargenError, ModelConfig, TrainConfig, checkpoint
from chargen.evaluate import LN2
from chargen.sample import DEFAULTS, Sampler

ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Limits:
    """What a client may ask for; the server clamps or refuses beyond these, whatever the
    sliders say (a client can send any value)."""

    max_length: int = 3000
    max_samples: int = 8
    max_prime: int = 2000
    max_upload_mb: int = 20
    min_train_seconds: int = 10
    max_train_seconds: int = 600
    concurrency: int = 4  # generations served at once
    queue_size: int = 32  # waiting beyond that are turned away


PRESETS = {  # model size presets for the Train tab
    "tiny (1x128)": ModelConfig(vocab_size=1, embedding=32, hidden=128, layers=1),
    "small (1x256)": ModelConfig(vocab_size=1, embedding=64, hidden=256, layers=1),
    "medium (1x512)": ModelConfig(vocab_size=1, embedding=64, hidden=512, layers=1),
}
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")
STREAM_EVERY = 0.05  # seconds between updates sent while streaming
BUSY = "This text is still being generated; wait for it or press Stop."


# --- the models on offer ------------------------------------------------------------------
class Shelf:
    """Model folders by name: ``models/<name>`` as ``<name>``, ``runs/<name>`` as
    ``runs/<name>``. Loaded on first use and kept; reloaded when the weights change."""

    def __init__(self, models_dir: Path, runs_dir: Path) -> None:
        self.models_dir, self.runs_dir = models_dir, runs_dir
        self._loaded: dict[str, tuple[float, chargen.TrainedModel]] = {}
        self._lock = threading.Lock()

    def folders(self) -> dict[str, Path]:
        found = {}
        for base, prefix in ((self.models_dir, ""), (self.runs_dir, "runs/")):
            if base.is_dir():
                for folder in sorted(base.iterdir()):
                    if (folder / "config.json").is_file() and weights_file(folder) is not None:
                        found[prefix + folder.name] = folder
        return found

    def names(self) -> list[str]:
        return list(self.folders())

    def default(self) -> str | None:
        names = self.names()
        return "shakespeare" if "shakespeare" in names else (names[0] if names else None)

    def get(self, name: str) -> chargen.TrainedModel:
        folder = self.folders().get(name) if isinstance(name, str) else None
        if folder is None:
            raise ChargenError(f"unknown model {str(name)[:60]!r}; pick one from the list")
        stamp = weights_file(folder).stat().st_mtime
        with self._lock:
            cached = self._loaded.get(name)
            if cached is None or cached[0] != stamp:
                self._loaded[name] = (stamp, chargen.load(folder, device="cpu"))
            return self._loaded[name][1]


def weights_file(folder: Path) -> Path | None:
    """The weights ``chargen.load`` would read (the best, else the latest), if any."""
    path = checkpoint.weights_path(folder)
    return path if path.is_file() else None


def model_card(model: chargen.TrainedModel) -> str:
    config = model.config
    corpus = Path(config.get("corpus", {}).get("path", "?")).name
    m = config["model"]
    bpc = (config.get("summary") or {}).get("best_val_bpc")
    kind = model.kind.description
    return (f"**{corpus}** · {kind} · {m['layers']}x{m['hidden']} LSTM, {config.get('parameters', 0):,} parameters"
            f" · validation {'n/a' if bpc is None else f'{bpc:.3f}'} bits/char")


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
    # Held while a generation draws from the sampler. Gradio runs handlers in threads, so a
    # check-then-set flag could let Continue, pressed twice, run two on the one sampler.
    drawing: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def busy(self) -> bool:
        return self.drawing.locked()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The sampler to this generation alone, or the busy message at once."""
        if not self.drawing.acquire(blocking=False):  # e.g. Continue pressed twice
            raise gr.Error(BUSY)
        try:
            yield
        finally:
            self.drawing.release()

    def text(self) -> str:
        if self.sampler.items:
            return "\n".join(self.done_items + [self.prime + t for t in self.sampler.texts])
        texts = [self.prime + t for t in self.sampler.texts]
        if len(texts) == 1:
            return texts[0]
        return "\n\n".join(f"--- sample {i} of {len(texts)} ---\n{t}" for i, t in enumerate(texts, 1))


def clamp(value: float | None, low: float, high: float, default: float) -> float:
    if value is None or not isinstance(value, int | float) or math.isnan(value):
        return default
    return min(high, max(low, value))


def sampling_options(limits: Limits, length, temperature, top_k, top_p) -> tuple[int, dict]:
    length = int(clamp(length, 1, limits.max_length, DEFAULTS.length))
    options = dict(temperature=clamp(temperature, 0.0, 2.0, DEFAULTS.temperature),
                   top_k=int(clamp(top_k, 0, 1000, DEFAULTS.top_k)), top_p=clamp(top_p, 0.01, 1.0, DEFAULTS.top_p))
    return length, options


def stream_text(writing: Writing, length: int, options: dict,
                first: Callable[[], None] | None = None) -> Iterator[tuple[str, Writing]]:
    """The session's text as it grows: at once after the first character, then at most
    every STREAM_EVERY seconds, and whole at the end. ``first`` runs once the sampler is
    this generation's alone (Continue's new round of items)."""
    with writing.exclusive():
        if first is not None:
            first()
        last = 0.0
        for i, _ in enumerate(writing.sampler.pieces(length, **options)):
            now = time.perf_counter()
            if i == 0 or now - last >= STREAM_EVERY:
                last = now
                yield writing.text(), writing
        yield writing.text(), writing


def make_handlers(shelf: Shelf, limits: Limits):
    def generate(model_name, prime, length, temperature, top_k, top_p, seed, num_samples):
        try:
            model = shelf.get(model_name)
            prime = prime or ""
            if not isinstance(prime, str) or len(prime) > limits.max_prime:
                raise ChargenError(f"the prime text is longer than {limits.max_prime:,} characters; shorten it")
            length, options = sampling_options(limits, length, temperature, top_k, top_p)
            n = int(clamp(num_samples, 1, limits.max_samples, 1))
            seed = None if seed is None or seed < 0 else int(clamp(seed, 0, 2**63 - 1, 0))
            writing = Writing(model_name, prime, model.sampler(prime, num_samples=n, seed=seed), seed)
            pieces = stream_text(writing, length, options)
            first = next(pieces)  # a bad prime or option fails here, before anything streams
        except ChargenError as e:
            raise gr.Error(str(e)) from None
        yield first
        yield from pieces

    def continue_(writing, model_name, length, temperature, top_k, top_p):
        if not isinstance(writing, Writing):
            raise gr.Error("Nothing to continue yet: press Generate first.")
        if writing.model_name != model_name:
            raise gr.Error("The model changed since this text was written; press Generate to start with it.")
        length, options = sampling_options(limits, length, temperature, top_k, top_p)
        new_round = None
        if writing.sampler.items:  # items have ended: a new round of them, below the others
            try:
                model = shelf.get(model_name)
            except ChargenError as e:
                raise gr.Error(str(e)) from None

            def new_round() -> None:
                writing.done_items += [writing.prime + t for t in writing.sampler.texts]
                seed = None if writing.seed is None else writing.seed + writing.rounds
                writing.sampler = model.sampler(writing.prime, num_samples=writing.sampler.num_samples, seed=seed)
                writing.rounds += 1
        yield from stream_text(writing, length, options, new_round)

    def describe(model_name):
        try:
            model = shelf.get(model_name)
        except ChargenError as e:
            return f"*{e}*", gr.update()
        hint = model.kind.prime_hint
        return model_card(model), gr.update(placeholder=hint)

    return generate, continue_, describe


# --- training ----------------------------------------------------------------------------
class TrainingJob:
    """The one training run the server allows at a time, in a background thread; its
    events are queued for the page that started it to show."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.events: queue.Queue = queue.Queue()
        self.owner: str | None = None
        self.ends_at = 0.0
        self.result: chargen.TrainResult | None = None
        self.error: str | None = None

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, owner: str, corpus, run_dir: Path, model_config: ModelConfig, config: TrainConfig) -> None:
        with self._lock:
            if self.busy():
                left = max(0, round(self.ends_at - time.time()))
                raise ChargenError(f"a training job is already running on this server (about {left} s left); "
                                   "one runs at a time, so try again when it ends")
            self.stop, self.events, self.owner = threading.Event(), queue.Queue(), owner
            self.result, self.error = None, None
            self.ends_at = time.time() + (config.max_time or 0)
            self.thread = threading.Thread(target=self._run, args=(corpus, run_dir, model_config, config),
                                           daemon=True, name="chargen-train")
            self.thread.start()

    def _run(self, corpus, run_dir, model_config, config) -> None:
        try:
            self.result = chargen.train(corpus, run_dir, model_config, config, on_event=self.events.put,
                                        stop=self.stop)
        except ChargenError as e:
            self.error = str(e)
        except Exception as e:  # shown on the page; the server keeps serving
            self.error = f"training failed: {type(e).__name__}: {e}"

    def request_stop(self, owner: str) -> str:
        if not self.busy():
            return "No training is running."
        if owner != self.owner:
            return "The training running now was started from another page; only that page can stop it."
        self.stop.set()
        return "Stopping after this step; the checkpoint is being saved."


def shipped_corpora() -> dict[str, Path]:
    return {p.name: p for p in sorted((ROOT / "corpora").glob("*.txt"))}


def make_trainer(shelf: Shelf, limits: Limits, job: TrainingJob):
    def start(upload, corpus_name, preset, seconds, run_name, request: gr.Request):
        owner = getattr(request, "session_hash", None) or "?"
        try:
            text_path = pick_corpus(upload, corpus_name, limits)
            model_config = PRESETS.get(preset)
            if model_config is None:
                raise ChargenError(f"unknown model size {str(preset)[:40]!r}; pick one from the list")
            seconds = int(clamp(seconds, limits.min_train_seconds, limits.max_train_seconds, 60))
            run_dir = new_run_dir(shelf.runs_dir, run_name, text_path)
            corpus = chargen.load_corpus(text_path, mode="auto")
            config = TrainConfig(max_time=seconds, eval_every=100, log_every=10, sample_chars=200)
            job.start(owner, corpus, run_dir, model_config, config)
        except ChargenError as e:
            raise gr.Error(str(e)) from None
        name = f"runs/{run_dir.name}"
        started, curve, samples, last_train = time.time(), [], "", None
        status = f"Training **{name}** ({preset}, {corpus.mode} mode) for up to {seconds} s…"
        yield status, curve_frame(curve), samples, gr.update()
        while True:
            finished = not job.busy()
            changed = False
            while not job.events.empty():
                event, changed = job.events.get(), True
                if event["event"] == "train":
                    last_train = event
                elif event["event"] == "val":
                    curve.append((event["elapsed"], event["val_bpc"]))
                elif event["event"] == "sample":
                    samples = f"step {event['step']:,}:\n" + "\n".join(event["texts"])
            if last_train is not None and changed:
                status = progress_line(name, last_train, time.time() - started)
            if finished:
                break
            if changed:
                yield status, curve_frame(curve), samples, gr.update()
            time.sleep(0.5)
        if job.error:
            status = f"**{name}**: {job.error}"
        elif job.result is not None:
            best = job.result.best_val_loss
            verb = {"done": "finished", "time": "reached its time budget", "interrupted": "stopped"}[job.result.stopped]
            status = (f"**{name}** {verb} at step {job.result.step:,}; best validation "
                      f"{'n/a' if best is None else f'{best / LN2:.3f}'} bits/char. It is in the Generate tab's list.")
        yield status, curve_frame(curve), samples, gr.update(choices=shelf.names())

    def stop(request: gr.Request):
        return job.request_stop(getattr(request, "session_hash", None) or "?")

    return start, stop


def pick_corpus(upload, corpus_name, limits: Limits) -> Path:
    if upload:
        path = Path(upload if isinstance(upload, str) else getattr(upload, "path", ""))
        if path.suffix.lower() != ".txt" or not path.is_file():
            raise ChargenError("upload a plain-text .txt file")
        if path.stat().st_size > limits.max_upload_mb * 1_000_000:
            raise ChargenError(f"the upload is over {limits.max_upload_mb} MB; upload a smaller text")
        return path
    corpora = shipped_corpora()
    if corpus_name not in corpora:
        raise ChargenError("upload a .txt file or pick a shipped corpus from the list")
    return corpora[corpus_name]


def new_run_dir(runs_dir: Path, run_name, text_path: Path) -> Path:
    name = (run_name or "").strip() or f"{text_path.stem[:30]}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not RUN_NAME.fullmatch(name):
        raise ChargenError("a run name is 1-48 letters, digits, '.', '_' or '-', starting with a letter or digit")
    run_dir = runs_dir / name
    if run_dir.exists():
        raise ChargenError(f"a run named {name!r} exists already; choose another name")
    return run_dir


def progress_line(name: str, event: dict, wall: float) -> str:
    step, total = event["step"], max(event.get("total_steps", event["step"]), 1)
    eta = wall / step * (total - step) if step else 0
    return (f"**{name}**: step {step:,} of {total:,} · loss {event['loss']:.3f} · {event['bpc']:.3f} bits/char · "
            f"{event['chars_per_s']:,} chars/s · about {eta:.0f} s left")


def curve_frame(curve: list[tuple[float, float]]):
    import pandas as pd

    return pd.DataFrame(curve, columns=["seconds", "validation bits/char"])


# --- the page ------------------------------------------------------------------------------
def build_app(models_dir: Path, runs_dir: Path, limits: Limits = Limits()) -> gr.Blocks:
    shelf = Shelf(models_dir, runs_dir)
    job = TrainingJob()
    generate, continue_, describe = make_handlers(shelf, limits)
    start_training, stop_training = make_trainer(shelf, limits, job)

    with gr.Blocks(title="chargen") as demo:
        gr.Markdown("# chargen\nCharacter-level LSTMs, trained fast on any text. Pick a model and generate, "
                    "or train your own in the Train tab.")
        with gr.Tab("Generate"):
            with gr.Row():
                model = gr.Dropdown(shelf.names(), value=shelf.default(), label="model", allow_custom_value=True,
                                    scale=3)
            card = gr.Markdown()
            prime = gr.Textbox(label="prime", lines=2, max_length=limits.max_prime)
            with gr.Row():
                length = gr.Slider(1, limits.max_length, value=DEFAULTS.length, step=1, label="length (characters)")
                num_samples = gr.Slider(1, limits.max_samples, value=1, step=1, label="samples")
                seed = gr.Number(-1, label="seed (-1: random)", precision=0, minimum=-1)
            with gr.Accordion("sampling", open=False), gr.Row():
                temperature = gr.Slider(0.0, 2.0, value=DEFAULTS.temperature, step=0.05,
                                        label="temperature (0: greedy)")
                top_k = gr.Slider(0, 200, value=DEFAULTS.top_k, step=1, label="top-k (0: off)")
                top_p = gr.Slider(0.01, 1.0, value=DEFAULTS.top_p, step=0.01, label="top-p (1: off)")
            with gr.Row():
                generate_button = gr.Button("Generate", variant="primary")
                continue_button = gr.Button("Continue")
                stop_button = gr.Button("Stop", variant="stop")
            output = gr.Textbox(label="text", lines=16, autoscroll=True, elem_id="output")
            writing = gr.State(time_to_live=3600)

            generating = generate_button.click(
                generate, [model, prime, length, temperature, top_k, top_p, seed, num_samples], [output, writing],
                api_name="generate")
            continuing = continue_button.click(
                continue_, [writing, model, length, temperature, top_k, top_p], [output, writing],
                api_name="continue")
            stop_button.click(None, cancels=[generating, continuing])
            model.change(describe, model, [card, prime], api_name="describe")

        with gr.Tab("Train"):
            gr.Markdown(f"Train a model on your own text (plain .txt, up to {limits.max_upload_mb} MB) or on a "
                        "shipped corpus. One training runs on the server at a time. A file of short items, "
                        "one per line (names, titles), is trained in lines mode.")
            with gr.Row():
                upload = gr.File(label="your text (.txt)", file_types=[".txt"], type="filepath")
                corpus = gr.Dropdown(list(shipped_corpora()), value="shakespeare.txt",
                                     label="or a shipped corpus", allow_custom_value=True)
            with gr.Row():
                preset = gr.Radio(list(PRESETS), value="small (1x256)", label="model size")
                seconds = gr.Slider(limits.min_train_seconds, limits.max_train_seconds, value=60, step=10,
                                    label="time budget (seconds)")
                run_name = gr.Textbox(label="run name (optional)", max_length=48)
            with gr.Row():
                train_button = gr.Button("Start training", variant="primary")
                stop_train_button = gr.Button("Stop and save", variant="stop")
            status = gr.Markdown()
            curve = gr.LinePlot(curve_frame([]), x="seconds", y="validation bits/char", label="validation loss")
            samples = gr.Textbox(label="samples at the last validation", lines=8)
            train_button.click(start_training, [upload, corpus, preset, seconds, run_name],
                               [status, curve, samples, model], api_name="train", concurrency_limit=4)
            stop_train_button.click(stop_training, None, status, api_name="stop_training")

        def refresh():
            names = shelf.names()
            value = shelf.default()
            card_text, prime_update = describe(value) if value else ("*no models found*", gr.update())
            return gr.update(choices=names, value=value), card_text, prime_update

        demo.load(refresh, None, [model, card, prime], api_name=False)
    demo.queue(max_size=limits.queue_size, default_concurrency_limit=limits.concurrency)
    return demo


def main(argv: list[str] | None = None) -> None:
    in_space = bool(os.environ.get("SPACE_ID"))
    parser = argparse.ArgumentParser(
        description="chargen's web demo: stream text from the models in --models and --runs, and train new ones.")
    parser.add_argument("--host", default="0.0.0.0" if in_space else "127.0.0.1",
                        help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 in a "
                        "Hugging Face Space)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
                        help="port (default 7860)")
    parser.add_argument("--models", type=Path, default=ROOT / "models",
                        help="folder of model folders to serve (default: models/ beside app.py)")
    parser.add_argument("--runs", type=Path, default=Path("runs"),
                        help="folder of training runs, served too; the Train tab writes here (default runs/)")
    parser.add_argument("--share", action="store_true",
                        help="also open a temporary public gradio.live link (off by default; needs network)")
    args = parser.parse_args(argv)
    demo = build_app(args.models, args.runs)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share,
                max_file_size=f"{Limits.max_upload_mb}mb", footer_links=["gradio", "settings"])


if __name__ == "__main__":
    main()
