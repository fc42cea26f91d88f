"""chargen's web demo: stream text from a trained model, or train one on an upload.

    python app.py                 # http://127.0.0.1:7860, serving models/ and runs/
    python app.py --help

A page over ``chargen.serving.Service``, which holds the model shelf, each session's text
and the training job: every model folder in models/ (shipped) and runs/ (trained here or
by the CLI) is offered by name; nothing a client sends is used as a path. Deploys
unchanged as a Hugging Face Space (see README).
"""

from __future__ import annotations

import os
import sys

# No network at run time: no analytics, no model hub. Set before gradio is imported.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if not (os.environ.get("GRADIO_SERVER_PORT") or "1").isdigit():  # (gradio reads it on import, and fails unreadably)
    print(f"app.py: error: GRADIO_SERVER_PORT={os.environ['GRADIO_SERVER_PORT']!r} is not a port; set it to a "
          "number from 1 to 65535, or unset it and pass --port", file=sys.stderr)
    raise SystemExit(2)

import argparse
import errno
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parent


# --- the command line: checked before Gradio and torch are imported ------------------------
def checked_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, and what would stop the app from starting (the models folder; the address:
    its port free, and ours to take), each said in one line with the flag to change (exit 2)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    if not args.models.is_dir():
        parser.error(f"--models {args.models}: no such folder; give the folder of model folders to serve "
                     f"(the shipped ones are in {ROOT / 'models'})")
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server binds (uvicorn sets it): a port a stopped app left in TIME_WAIT is free,
        # one another program listens on is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((args.host, args.port))
        except OSError as e:
            parser.error(f"cannot serve on {args.host}:{args.port}: {port_problem(e)}")
    return args


def port_problem(error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return "the port is in use by another program; pass --port with a free one (or stop that program)"
    if error.errno == errno.EACCES:
        return "ports below 1024 need root; pass --port 1024 or higher (the default is 7860)"
    if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
        return "this machine has no such address; pass --host 127.0.0.1, or 0.0.0.0 for every address"
    return error.strerror or str(error)


def port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 1 to 65535, not {text!r}")
    return int(text)


def make_parser() -> argparse.ArgumentParser:
    in_space = bool(os.environ.get("SPACE_ID"))
    parser = argparse.ArgumentParser(
        description="chargen's web demo: stream text from the models in --models and --runs, and train new ones.")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if in_space else
                                                                                  "127.0.0.1"),
                        help="address to listen on (default $GRADIO_SERVER_NAME, else 127.0.0.1, this machine only; "
                        "0.0.0.0 in a Hugging Face Space)")
    parser.add_argument("--port", type=port, default=os.environ.get("GRADIO_SERVER_PORT") or "7860",
                        help="port (default $GRADIO_SERVER_PORT, else 7860)")
    parser.add_argument("--models", type=Path, default=ROOT / "models",
                        help="folder of model folders to serve (default: models/ beside app.py)")
    parser.add_argument("--runs", type=Path, default=Path(os.environ.get("CHARGEN_RUNS") or "runs"),
                        help="folder of training runs, served too; the Train tab writes here (default: "
                        "$CHARGEN_RUNS, else runs/; on a Space, a mounted storage bucket keeps them over restarts)")
    parser.add_argument("--share", action="store_true",
                        help="also open a temporary public gradio.live link (off by default; needs network)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps", "auto"],
                        help="where the models generate text (default cpu: for a few texts at a time a GPU is "
                        "no faster); training uses a GPU when there is one")
    return parser


if __name__ == "__main__":
    checked_args()  # (main() checks again: here a bad flag is answered before the imports below, seconds of them)

import asyncio
import atexit
import functools
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator

import gradio as gr
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from chargen import ChargenError
from chargen.serving import AUTO, DEFAULTS, PAGE_HEADERS, SCRATCH, Limits, Service, TextStream, TrainingView

SCRATCH_PREFIX = "chargen-app-"  # the app's own temp folder: chargen-app-<pid>
FOOTER_LINKS = ["api", "gradio", "settings"]  # ("Use via API": the named endpoints are the app's API)
# One-click primes under the Generate tab, for the shipped models that are on the shelf.
EXAMPLES = [["shakespeare", "ROMEO:\n"], ["shakespeare", "KING HENRY:\nOnce more"], ["shakespeare", "To be"],
            ["names", "Mar"], ["names", ""]]


# --- the handlers: the service's methods, its errors shown in the page's error box ---------
def shown(service: Service, error: Exception) -> gr.Error:
    """The page's error box for ``error``, without any server path (an error that is not a
    ChargenError is a fault of the server's: said as one, never a bare "Error")."""
    if isinstance(error, ChargenError):
        return gr.Error(service.public(str(error)))
    return gr.Error(service.public(f"the server could not do that ({type(error).__name__}: {error})"))


def streamed(call: Callable[..., Iterator]) -> Callable[..., Iterator]:
    """A service call that checks a request and returns a stream, as a handler: the updates
    as they come, a ChargenError (at once or midway) as the page's error box."""
    @functools.wraps(call)  # (Gradio reads the call's parameters from its signature)
    def handler(*args):
        try:
            yield from call(*args)
        except Exception as e:  # (CancelledError and GeneratorExit, a Stop or a closed page, are no Exception)
            raise shown(call.__self__, e) from None
    return handler


def streamed_text(call: Callable[..., TextStream]) -> Callable[..., AsyncIterator]:
    """``streamed`` for a generation, as an async handler: it waits on the model's shared
    sampling loop without holding a thread. A cancel (Stop, or the page closed) closes the
    stream, which takes the text out of the loop; its sampler keeps the state for Continue."""
    @functools.wraps(call)
    async def handler(*args):
        try:
            stream = await asyncio.to_thread(call, *args)  # (a model's first load takes a while)
            async for update in stream:
                yield update
        except Exception as e:  # (CancelledError and GeneratorExit, a Stop or a closed page, are no Exception)
            raise shown(call.__self__, e) from None
    return handler


def make_handlers(service: Service):
    def describe(model_name):
        try:
            card, hint = service.describe(model_name)
        except ChargenError as e:
            return f"*{service.public(str(e))}*", gr.update()
        return card, gr.update(placeholder=hint)

    def train(upload, corpus_name, preset, seconds, run_name, start_from, request: gr.Request):
        views = streamed(service.train)(session(request), upload, corpus_name, preset, seconds, run_name, start_from)
        for view in views:
            yield shown_training(view, service)

    def stop_training(request: gr.Request):
        return service.stop_training(session(request))

    return streamed_text(service.generate), streamed_text(service.continue_), describe, train, stop_training


def session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "?"


def shown_training(view: TrainingView, service: Service) -> tuple:
    names = service.shelf.names()
    models = gr.update(choices=names) if view.finished else gr.update()
    sources = gr.update(choices=[SCRATCH, *names]) if view.finished else gr.update()
    return view.status, curve_frame(view.curve) if view.curve else None, view.samples, models, sources


CURVE_POINTS = 400  # at most, sent with each update (a 10-minute run of a small model logs thousands)


def curve_frame(curve: list[tuple[float, float]]):
    import pandas as pd

    every = -(-len(curve) // CURVE_POINTS)
    shown = curve[::every] + ([curve[-1]] if (len(curve) - 1) % every else [])  # (the last point always)
    # Floats: columns read as categories would draw each value as a label (3.41 below 3.16).
    return pd.DataFrame(shown, columns=["seconds", "bits/char"], dtype=float)


# --- the page ------------------------------------------------------------------------------
def build_app(models_dir: Path, runs_dir: Path, limits: Limits | None = None, device: str = "cpu",
              scratch: Path | None = None) -> gr.Blocks:
    limits = limits or Limits()
    service = Service(models_dir, runs_dir, ROOT / "corpora", limits, device=device, scratch=scratch)
    generate, continue_, describe, start_training, stop_training = make_handlers(service)

    with gr.Blocks(title="chargen") as demo:
        gr.Markdown("# chargen\nCharacter-level LSTMs, trained fast on any text. Pick a model and generate, "
                    "or train your own in the Train tab.")
        with gr.Tab("Generate"):
            model, card, prime = generate_tab(service, limits, generate, continue_, describe)
        with gr.Tab("Train"):
            train_tab(service, limits, model, start_training, stop_training)

        def refresh():
            names, value = service.shelf.names(), service.shelf.default()
            card_text, prime_update = describe(value) if value else ("*no models found*", gr.update())
            return gr.update(choices=names, value=value), card_text, prime_update

        demo.load(refresh, None, [model, card, prime], api_visibility="private")
    demo.queue(max_size=limits.queue_size, default_concurrency_limit=limits.concurrency)
    demo.service = service  # (main serves its models' web pages)
    return demo


def generate_tab(service: Service, limits: Limits, generate, continue_, describe) -> tuple:
    """The Generate tab's components and events; its model list, card and prime."""
    shelf = service.shelf
    with gr.Row():
        model = gr.Dropdown(shelf.names(), value=shelf.default(), label="model", allow_custom_value=True, scale=3)
    card = gr.Markdown()
    prime = gr.Textbox(label="prime", lines=2, max_length=limits.max_prime)
    with gr.Row():
        length = gr.Slider(1, limits.max_length, value=DEFAULTS.length, step=1, label="length (characters)")
        num_samples = gr.Slider(1, limits.max_samples, value=1, step=1, label="samples")
        seed = gr.Number(-1, label="seed (-1: random)", precision=0, minimum=-1)
    with gr.Accordion("sampling", open=False), gr.Row():
        temperature = gr.Slider(0.0, 2.0, value=DEFAULTS.temperature, step=0.05, label="temperature (0: greedy)")
        top_k = gr.Slider(0, 200, value=DEFAULTS.top_k, step=1, label="top-k (0: off)")
        top_p = gr.Slider(0.01, 1.0, value=DEFAULTS.top_p, step=0.01, label="top-p (1: off)")
    with gr.Row():
        generate_button = gr.Button("Generate", variant="primary")
        continue_button = gr.Button("Continue")
        stop_button = gr.Button("Stop", variant="stop")
    examples = [example for example in EXAMPLES if example[0] in shelf.names()]
    if examples:
        gr.Examples(examples, [model, prime], label="example primes (click one, then Generate)",
                    api_visibility="private")
    output = gr.Textbox(label="text", lines=16, autoscroll=True, elem_id="output")
    writing = gr.State(time_to_live=3600)

    generating = generate_button.click(
        generate, [model, prime, length, temperature, top_k, top_p, seed, num_samples], [output, writing],
        api_name="generate", concurrency_limit=None)  # (bounded by the sampling loop)
    continuing = continue_button.click(
        continue_, [writing, model, length, temperature, top_k, top_p], [output, writing],
        api_name="continue", concurrency_limit=None)
    stop_button.click(None, cancels=[generating, continuing])
    model.change(describe, model, [card, prime], api_name="describe")
    return model, card, prime


def train_tab(service: Service, limits: Limits, model: gr.Dropdown, start_training, stop_training) -> None:
    """The Train tab; a finished run joins ``model``'s list (and the start-from list)."""
    if not limits.training:
        gr.Markdown("**Training is turned off on this server** (its owner set `CHARGEN_TRAINING=off`); the "
                    "models in the Generate tab are here to generate with.")
    gr.Markdown(f"Train a model on your own text (plain .txt, up to {limits.max_upload_mb} MB) or on a "
                "shipped corpus. One training runs on the server at a time. A file of short items, "
                "one per line (names, titles), is trained in lines mode.")
    with gr.Row():
        upload = gr.File(label="your text (.txt)", file_types=[".txt"], type="filepath")
        corpus = gr.Dropdown(list(service.corpora()), value="shakespeare.txt",
                             label="or a shipped corpus", allow_custom_value=True)
    with gr.Row():
        preset = gr.Radio(service.presets(), value=AUTO, label="model size",
                          info="auto: a quick speed test picks the size that should do best in the time")
        seconds = gr.Slider(limits.min_train_seconds, limits.max_train_seconds, value=60, step=10,
                            label="time budget (seconds)")
        run_name = gr.Textbox(label="run name (optional)", max_length=48)
    start_from = gr.Dropdown([SCRATCH, *service.shelf.names()], value=SCRATCH, label="start from",
                             info="a model to fine-tune on the text, in its own size and mode (the model "
                             "size above then does not apply)")
    with gr.Row():
        train_button = gr.Button("Start training", variant="primary")
        stop_train_button = gr.Button("Stop and save", variant="stop")
    status = gr.Markdown()
    # (No frame until the first points: Gradio 6.31 draws a chart first built from an empty
    # frame without its y axis title.)
    curve = gr.LinePlot(None, x="seconds", y="bits/char", label="training loss, as it trains",
                        x_title="training time (seconds)", y_title="training loss (bits per character)",
                        y_axis_format=".2f", x_axis_format="~g")
    samples = gr.Textbox(label="samples at the last validation, with its loss", lines=8, elem_id="samples")
    train_button.click(start_training, [upload, corpus, preset, seconds, run_name, start_from],
                       [status, curve, samples, model, start_from], api_name="train", concurrency_limit=4)
    stop_train_button.click(stop_training, None, status, api_name="stop_training")


def scratch_folder() -> Path:
    """This process's own temp folder: the pages it exports and, unless the operator set
    GRADIO_TEMP_DIR, Gradio's upload cache (chargen deletes each upload once it has read it).
    Removed when the app stops (Ctrl-C, SIGTERM or a normal exit); those of apps that were
    killed are removed at the next start."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{SCRATCH_PREFIX}*"):
        pid = old.name.removeprefix(SCRATCH_PREFIX)
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder = base / f"{SCRATCH_PREFIX}{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "uploads").mkdir(parents=True)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # (so that atexit runs)
    os.environ.setdefault("GRADIO_TEMP_DIR", str(folder / "uploads"))
    return folder


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    return True


def main(argv: list[str] | None = None) -> None:
    args = checked_args(argv)
    parser = make_parser()  # (its error() for what only the built app finds)
    try:
        limits = Limits.from_environment(os.environ)
        demo = build_app(args.models, args.runs, limits, device=args.device, scratch=scratch_folder())
    except ChargenError as e:  # e.g. --device cuda without a GPU
        parser.error(str(e))
    try:
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=True,
                    max_file_size=f"{limits.max_upload_mb}mb", footer_links=FOOTER_LINKS,
                    app_kwargs={"routes": web_routes(demo.service)})
    except OSError as e:  # (Gradio's own words name launch()'s parameters, not this app's flags)
        parser.error(f"cannot serve on {args.host}:{args.port} ({port_problem(e)}); pass --host or --port")


def web_routes(service: Service) -> list[Route]:
    """``/web/<model>/``: each model's static page, whose sampling runs in the visitor's
    browser (chargen.web); ``/download/<model>/model.zip`` and ``page.zip``: the model folder
    and the page to take home. Gradio's server sends the files; a name not on the shelf is a
    404."""
    async def page(request: Request) -> Response:
        path = request.path_params["path"]
        if path in service.shelf.names():  # /web/<model>: the page's files are relative to the folder
            return RedirectResponse(f"{request.url.path}/", headers=PAGE_HEADERS)
        name, _, file = path.rpartition("/")
        try:
            found = await asyncio.to_thread(service.pages.file, name, file or "index.html")
        except ChargenError as e:
            return PlainTextResponse(service.public(str(e)), status_code=404, headers=PAGE_HEADERS)
        plain = "text/plain; charset=utf-8" if found.suffix == ".md" else None  # (the card, shown as text)
        return FileResponse(found, media_type=plain, headers=PAGE_HEADERS)

    async def download(request: Request) -> Response:
        name, _, file = request.path_params["path"].rpartition("/")
        try:
            found = await asyncio.to_thread(service.downloads.file, name, file)
        except ChargenError as e:
            return PlainTextResponse(service.public(str(e)), status_code=404, headers=PAGE_HEADERS)
        shown = f"{Path(name).name}-{file}"  # (shakespeare-model.zip)
        return FileResponse(found, media_type="application/zip", filename=shown, headers=PAGE_HEADERS)

    return [Route("/web/{path:path}", page), Route("/download/{path:path}", download)]


if __name__ == "__main__":
    main()
