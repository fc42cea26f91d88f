"""The command line: argparse -> configs -> library calls. A ``ChargenError`` becomes one
line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from . import checkpoint
from .config import DEFAULT_EPOCHS, TrainConfig
from .corpus import MAX_VAL_CHARS, load_corpus
from .device import PRECISIONS
from .errors import ChargenError
from .flag_types import finite_float, positive_float, positive_int, resume_mode, seed, whole_number
from .lines import MODES
from .model import ModelConfig
from .portable import RNGS
from .record import RunRecord, read_record
from .sample import DEFAULTS as SAMPLING
from .schedule import DECAYS, SCALINGS
from .storage import atomic_write
from .textfile import ERROR_POLICIES
from .version import __version__

if TYPE_CHECKING:
    from .api import TrainedModel

BIG_FILE_BYTES = 64 * 2**20  # reading a file this big takes long enough to say so
MODEL_FLAGS = ("embedding", "hidden", "layers", "dropout")
# Flags left out on the command line are None, so that on --resume the saved run's values
# stand; the defaults shown in --help come from the config dataclasses.
TRAIN_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}
MODEL_DEFAULTS = {f.name: f.default for f in fields(ModelConfig) if f.name != "vocab_size"}


class Parser(argparse.ArgumentParser):
    """Usage mistakes get the same one-line form as every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="chargen",
        description="Train stateful character-level LSTMs on any text file, and sample from them.",
    )
    parser.add_argument("--version", action="version", version=f"chargen {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_train(commands)
    add_sample(commands)
    add_eval(commands)
    add_export(commands)
    return parser


def add_train(commands: argparse._SubParsersAction) -> None:
    t = commands.add_parser(
        "train",
        help="train a model on a text file",
        description="Train a character-level LSTM on TEXT_FILE, cut into --batch-size contiguous "
        "streams and trained with truncated BPTT (the LSTM state carried from chunk to chunk). "
        "Progress, validation loss and samples are printed; checkpoints go to --out. "
        "Ctrl-C saves a checkpoint; the same command with --resume continues exactly.",
    )
    t.add_argument("text_file", metavar="TEXT_FILE", nargs="+",
                   help="UTF-8 text to train on: a file, or several files and folders (a folder's files, in its "
                   "subfolders too, hidden ones and files that are not text left out); in stream mode each file is "
                   "a document of its own")
    t.add_argument("--out", metavar="RUN_DIR", help="run folder (default: runs/<name of TEXT_FILE>)")
    t.add_argument("--resume", nargs="?", const="yes", type=resume_mode, metavar="auto",
                   help="continue the run in --out where it stopped; --resume auto: continue it if --out holds "
                   "one, else start it (one command that starts a job and restarts it, as torchrun "
                   "--max-restarts does)")
    t.add_argument("--resume-from", type=whole_number, metavar="STEP",
                   help="resume from the resume point kept at STEP (see --keep) instead of the latest; later ones "
                   "stay on disk")
    t.add_argument("--force", action="store_true", help="replace a run already in --out")
    data = t.add_argument_group("data")
    data.add_argument("--mode", choices=MODES,
                      help="stream: one long text, the LSTM state carried through it; lines: one item per "
                      "line (names, titles), each from <bos> to <eos>; auto: lines when the file reads as "
                      "a list of short items (no blank lines, short lines that do not run on), else stream. "
                      "(default auto; on --resume, the run's)")
    data.add_argument("--val-file", metavar="FILE",
                      help="validation text (default: the tail of TEXT_FILE; in lines mode, random lines of it)")
    data.add_argument("--val-fraction", type=positive_float, default=0.05,
                      help="share of TEXT_FILE held out for validation: its end (at most "
                      f"{MAX_VAL_CHARS:,} characters), or in lines mode random lines (default %(default)s)")
    data.add_argument("--encoding", default="utf-8", help="text encoding of the files (default %(default)s)")
    data.add_argument("--errors", default="strict", choices=ERROR_POLICIES,
                      help="what to do with bytes that are not valid in --encoding (default %(default)s)")
    model = t.add_argument_group(
        "model (fixed once a run starts)",
        "With --max-time and none of these, a short speed probe picks the size that should do best in the "
        "time on this machine. Dropout and weight decay not given follow the run's exposure (its epochs "
        "times the model's parameters per character of the text): none for a short run or a big text.")
    model.add_argument("--hidden", type=positive_int, help=f"LSTM units per layer (default {MODEL_DEFAULTS['hidden']}, "
                       "or chosen for --max-time)")
    model.add_argument("--layers", type=positive_int,
                       help=f"LSTM layers (default {MODEL_DEFAULTS['layers']}, or chosen for --max-time)")
    model.add_argument("--embedding", type=positive_int,
                       help=f"character embedding size (default {MODEL_DEFAULTS['embedding']})")
    model.add_argument("--dropout", type=finite_float, help="dropout rate (default: by the epochs)")
    model.add_argument("--init-from", metavar="RUN_OR_MODEL_DIR",
                       help="fine-tune: start from the weights of this run or model folder (for example "
                       "models/shakespeare), in its size and mode, with a fresh optimizer and schedule; characters "
                       "it lacks get new rows")
    add_training_options(t)
    t.add_argument("--quiet", action="store_true", help="no progress bar or samples")


def add_training_options(t: argparse.ArgumentParser) -> None:
    """The training group: batches, learning rate, plan, validation, device."""
    d = TRAIN_DEFAULTS
    opt = t.add_argument_group("training")
    opt.add_argument("--batch-size", type=positive_int, help=f"parallel streams (default {d['batch_size']})")
    opt.add_argument("--bptt", type=positive_int,
                     help=f"characters per chunk: how far back gradients flow (default {d['bptt']})")
    opt.add_argument("--variable-bptt", action="store_true", default=None,
                     help="vary the chunk length around --bptt (AWD-LSTM)")
    opt.add_argument("--bucket-factor", type=positive_int, metavar="N",
                     help=f"lines mode: sort N batches of items by length at a time, so each batch is padded "
                     f"only to its own longest (default {d['bucket_factor']}; 1 is plain random batches)")
    lr = t.add_argument_group(
        "learning rate",
        "The schedule is set once, at a base batch size, and carried to --batch-size by --lr-scaling. "
        "LEGW (You et al. 2019): k times the batch gives sqrt(k) times the peak and k times the warmup "
        "in epochs (the same number of updates), so a wider batch needs no re-tuning. "
        "A linear warmup from 0, then a decay to a tenth of the peak at the end of the plan (--decay none: flat).",
    )
    lr.add_argument("--lr-scaling", choices=SCALINGS,
                    help=f"how the base setting follows the batch size: legw (sqrt(k) peak, k x warmup epochs), "
                    f"linear (k x peak, same warmup epochs) or none (default {d['lr_scaling']})")
    lr.add_argument("--base-lr", "--lr", dest="base_lr", type=positive_float, metavar="LR",
                    help="peak learning rate of AdamW at the base batch size (default 3e-3; 6e-3 for a run too "
                    "short to memorise its text, exposure under 8 by characters: see docs/training.md)")
    lr.add_argument("--base-batch-size", type=positive_int, metavar="N",
                    help=f"the batch size the base setting is for (default {d['base_batch_size']})")
    warm = lr.add_mutually_exclusive_group()
    warm.add_argument("--base-warmup-epochs", type=finite_float, metavar="EPOCHS",
                      help="warmup at the base batch size, in epochs")
    warm.add_argument("--warmup-steps", type=int, metavar="N",
                      help=f"warmup at the base batch size, in updates (default {d['warmup_steps']}; "
                      "LEGW keeps this many updates at any batch size)")
    lr.add_argument("--decay", choices=DECAYS,
                    help=f"decay from the peak to the end of the plan; poly is quadratic (default {d['decay']})")
    opt.add_argument("--weight-decay", type=finite_float, help="AdamW weight decay (default: by the epochs)")
    opt.add_argument("--clip", type=positive_float, help=f"gradient-norm clipping (default {d['clip']})")
    plan = opt.add_mutually_exclusive_group()
    plan.add_argument("--epochs", type=positive_float,
                      help=f"total passes over the text for the run (default {DEFAULT_EPOCHS}; with --max-time "
                      "alone, as many as the time allows)")
    plan.add_argument("--steps", type=positive_int, help="total updates for the run (instead of --epochs)")
    opt.add_argument("--max-time", type=positive_float, metavar="SECONDS",
                     help="time limit for this command; the plan is fitted so the schedule ends in time, and "
                     "validation takes at most 5%% of it")
    opt.add_argument("--eval-every", type=positive_int,
                     help=f"steps between validations and checkpoints (default {d['eval_every']}; with --max-time, "
                     "spaced out where validating this often would take more than 5%% of the time)")
    opt.add_argument("--save-every", type=positive_float, metavar="MINUTES",
                     help="also save a checkpoint every MINUTES of training (default: only with validations)")
    opt.add_argument("--keep", type=whole_number, metavar="N",
                     help="keep the N resume points before the latest (trainer/step-*.safetensors, the oldest deleted "
                     "first) for --resume-from (default 0)")
    opt.add_argument("--patience", type=positive_int, metavar="K",
                     help="stop early after K validations on the whole validation text without a better loss; "
                     "the best weights stay in best.safetensors (default: run the whole plan)")
    opt.add_argument("--log-every", type=positive_int, help=f"steps between log lines (default {d['log_every']})")
    opt.add_argument("--sample-chars", type=int, help=f"length of the sample printed at each validation "
                     f"(default {d['sample_chars']}; 0 for none)")
    opt.add_argument("--tensorboard", action="store_true", default=None,
                     help="also write the metrics and samples for TensorBoard under RUN_DIR/tb (needs the "
                     "tensorboard package: pip install 'chargen[tensorboard]'); metrics.jsonl is written either way")
    opt.add_argument("--device", help="auto (CUDA when present), cpu, cuda or mps (an Apple GPU) (default auto)")
    opt.add_argument("--seed", type=seed, help=f"random seed (default {d['seed']})")
    opt.add_argument("--precision", choices=PRECISIONS,
                     help="autocast to bf16 or fp16 (with gradient scaling), or plain fp32; auto is bf16 "
                     "where it runs and is faster than fp32 (tried at start-up), else fp32 (default auto)")


def add_sample(commands: argparse._SubParsersAction) -> None:
    s = commands.add_parser("sample", help="print text sampled from a trained model")
    s.add_argument("run_dir", metavar="RUN_DIR")
    s.add_argument("--prime", default="",
                   help="text to start from (default: a fresh start); in lines mode, how every item starts")
    s.add_argument("--length", type=int, default=SAMPLING.length,
                   help="characters to generate per sample; in lines mode the most per item, which "
                   "otherwise ends where the model ends it (default %(default)s)")
    s.add_argument("--temperature", type=finite_float, default=SAMPLING.temperature,
                   help="0 is greedy; higher is wilder (default %(default)s)")
    s.add_argument("--top-k", type=int, default=SAMPLING.top_k,
                   help="sample only from the k likeliest (default 0: off)")
    s.add_argument("--top-p", type=finite_float, default=SAMPLING.top_p,
                   help="sample only from the top-p probability mass (default 1: off)")
    s.add_argument("--seed", type=seed, help="random seed for a repeatable sample")
    s.add_argument("--rng", choices=RNGS, default="torch",
                   help="torch (default), or portable: the text that the page of chargen export --web "
                   "draws for the same seed (slower; exact with fp32 web weights)")
    s.add_argument("--num-samples", type=int,
                   help="samples drawn in parallel (default 1; in lines mode 10, one item per line)")
    s.add_argument("--new-only", action="store_true",
                   help="lines mode: drop samples that are in the training list verbatim, and say how many were new")
    s.add_argument("--weights", choices=("best", "latest"), default="best",
                   help="best by validation (default) or the latest checkpoint")
    s.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mps")
    s.add_argument("--output", metavar="FILE",
                   help="write the samples to FILE, in UTF-8 (default: stdout, where a character its "
                   "encoding cannot show is written as '?')")


def add_eval(commands: argparse._SubParsersAction) -> None:
    e = commands.add_parser("eval", help="print a model's loss and bits per character on a text")
    e.add_argument("run_dir", metavar="RUN_DIR")
    e.add_argument("text_file", metavar="TEXT_FILE")
    e.add_argument("--encoding", default="utf-8", help="text encoding of TEXT_FILE (default utf-8)")
    e.add_argument("--errors", default="strict", choices=ERROR_POLICIES,
                   help="what to do with bytes that are not valid in --encoding (default strict)")
    e.add_argument("--weights", choices=("best", "latest"), default="best",
                   help="best by validation (default) or the latest checkpoint")
    e.add_argument("--device", default="auto", help="auto (default), cpu, cuda or mps")


def add_export(commands: argparse._SubParsersAction) -> None:
    x = commands.add_parser(
        "export", help="copy a run's weights, config and tokenizer into a folder to serve or share",
        description="Write a model folder from RUN_DIR: config.json, tokenizer.json and one weights file "
        "(the best by validation, or the latest), without the trainer state or metrics. "
        "The app serves such folders from models/; chargen sample and chargen.load read them.")
    x.add_argument("run_dir", metavar="RUN_DIR")
    x.add_argument("out_dir", metavar="MODEL_DIR")
    x.add_argument("--weights", choices=("best", "latest"), default="best",
                   help="best by validation (default) or the latest checkpoint")
    x.add_argument("--force", action="store_true", help="replace what MODEL_DIR holds")
    x.add_argument("--web", action="store_true",
                   help="write instead a static web page that samples the model in the visitor's browser "
                   "(index.html, chargen.js, model.json, weights.bin, README.md): serve MODEL_DIR with any static "
                   "host, or python -m http.server")
    x.add_argument("--web-dtype", choices=("fp32", "fp16"), default="fp32",
                   help="the page's weights: fp32 (default; the same text as chargen sample --rng portable) or "
                   "fp16 (half the download; the text may differ)")


def given(args: argparse.Namespace, names: tuple[str, ...] | list[str]) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def configs_from_args(args: argparse.Namespace, saved: RunRecord | None) -> tuple[ModelConfig | None, TrainConfig]:
    """New run: defaults overlaid with the flags given. Resume (``saved``: the run's record):
    the saved configs overlaid with the flags given (train() refuses the ones that cannot
    change mid-run)."""
    train_flags = given(args, [n for n in TRAIN_DEFAULTS if n != "max_time"])
    model_flags = given(args, MODEL_FLAGS)
    if args.resume and "init_from" in train_flags:
        raise ChargenError("--init-from starts a new run; drop it to resume (the run keeps where it started from)")
    if saved is None:  # no model flag: the size is chosen for --max-time, or the default
        model_config = ModelConfig(**model_flags) if model_flags else None
        return model_config, TrainConfig(**train_flags, max_time=args.max_time)
    base = saved.train
    if "epochs" in train_flags or "steps" in train_flags:
        base = replace(base, epochs=None, steps=None)
    config = replace(base, **train_flags, max_time=args.max_time)
    model_config = None
    if model_flags:
        model_config = replace(saved.model, **model_flags)
    return model_config, config


def cmd_train(args: argparse.Namespace) -> int:
    started = time.perf_counter()  # (--max-time is the command's: its imports and the text's reading count)
    from tqdm import tqdm

    from .distributed import from_environment, leave, shared_store_advice
    from .train import train

    run_dir = Path(args.out) if args.out else Path("runs") / Path(args.text_file[0]).stem
    # --resume auto: resume what the folder holds, or start; every rank decides before any
    # writes (they join the group first), and checks below that all decided alike.
    auto = args.resume == "auto"
    args.resume = args.resume == "yes" or (auto and checkpoint.has_resume_point(run_dir))
    # (a run of this command that died before its first checkpoint is started again: nothing is lost)
    force = args.force or (auto and not args.resume and checkpoint.describe_folder(run_dir) == "run")
    if args.resume_from is not None:
        if auto:  # (a restart would go back to STEP every time)
            raise ChargenError("--resume-from STEP goes back to STEP on every start; use it with --resume or alone, "
                               "not with --resume auto")
        args.resume = True
    if auto and args.resume:
        args.init_from = None  # (the run started from it, and its record keeps that)
    saved = checkpoint.check_resumable(run_dir) if args.resume else None  # (refused before a long read of the text)
    mode = args.mode
    if mode is None and (saved or args.init_from):  # (the run's mode, or the source's)
        mode = (saved or read_record(Path(args.init_from))).mode.name

    def log(message: str) -> None:
        if not (args.quiet and message.startswith("--- sample")):
            tqdm.write(message, file=sys.stderr)

    texts, reading = [Path(t) for t in args.text_file], time.perf_counter()
    size = sum(t.stat().st_size for t in texts if t.is_file())
    big = size >= BIG_FILE_BYTES
    if big:
        log(f"reading {' '.join(args.text_file)} ({size / 2**20:,.0f} MB) in chunks: counting, then encoding")
    corpus = load_corpus(texts[0] if len(texts) == 1 else texts, val_path=args.val_file, val_fraction=args.val_fraction,
                         encoding=args.encoding, errors=args.errors, mode=mode or "auto")
    if big:
        log(f"read {corpus.source['chars']:,} characters in {time.perf_counter() - reading:.1f} s")
    model_config, config = configs_from_args(args, saved)

    # Under torchrun: join the process group; each rank takes its own GPU where there are GPUs.
    ranks, device = from_environment(config.device)
    result = None
    try:
        if ranks.active and all(ranks.any((args.resume, not args.resume), device)):
            raise ChargenError(f"the processes disagree on whether {run_dir} holds a run to resume: every node must "
                               "see the same run folder (a shared file system)")
        if ranks.main and (advice := shared_store_advice()):
            log(advice)
        if auto and ranks.main:
            log(f"--resume auto: {'resuming the run' if args.resume else 'no run to resume yet, starting one'} in "
                f"{run_dir}")
        result = train(corpus, run_dir, model_config, replace(config, device=device), resume=args.resume,
                       resume_from=args.resume_from, force=force, log=log, progress_bar=not args.quiet, ranks=ranks,
                       started=started)
    finally:
        leave(finished=result is not None)
    return {"done": 0, "time": 0, "interrupted": 130, "patience": 0}[result.stopped]


def cmd_sample(args: argparse.Namespace) -> int:
    from .api import load
    from .sample import check_sampling

    check_sampling(args.temperature, args.top_k, args.top_p, args.length, args.num_samples or 1)
    model = load(args.run_dir, device=args.device, weights=args.weights)
    if args.output is None:
        return write_samples(model, args, narrow_safe_stdout("".join(model.tokenizer.chars) + args.prime))
    target = Path(args.output)
    if target.is_dir():
        raise ChargenError(f"--output {target} is a folder; give a file name")
    if (outer := checkpoint.inside_chargen_folder(target)) is not None:  # (the run's own folder among them)
        raise ChargenError(f"--output {target} is inside {outer}, a chargen run or model folder; write the sample "
                           "somewhere else")
    if target.exists() and not target.is_file():  # a device or a pipe (/dev/stdout): written as it is
        with open(target, "w", encoding="utf-8") as out:
            return write_samples(model, args, out)
    # Written whole at the end: a sample that fails or is interrupted leaves an earlier FILE
    # as it was.
    out = io.StringIO()
    code = write_samples(model, args, out)
    atomic_write(target, out.getvalue().encode("utf-8"), then="sample again")
    return code


def narrow_safe_stdout(chars: str) -> TextIO:
    """stdout, made safe for text its encoding cannot show (a Windows console's cp1252, a
    pipe under LANG=C): such characters are written as '?', and one line says so, never a
    UnicodeEncodeError halfway through a sample."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        chars.encode(encoding)
    except UnicodeEncodeError:
        print(f"chargen: stdout is {encoding}, which cannot show some of this model's characters; they are "
              "written as '?' (--output FILE writes UTF-8)", file=sys.stderr)
    except LookupError:
        pass
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")
    return sys.stdout


def write_samples(model: TrainedModel, args: argparse.Namespace, out: TextIO) -> int:
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, rng=args.rng)
    if model.kind.items:
        n = args.num_samples or model.kind.default_samples
        items = model.generate_batch(args.prime, args.length, num_samples=n, **options)
        if args.new_only:
            seen = model.is_training_item(items)
            items = [item for item, old in zip(items, seen, strict=True) if not old]
            print(f"{len(items)} of {n} samples are new (not in the training list)", file=sys.stderr)
        out.write("".join(item + "\n" for item in items))
        return 0
    if args.new_only:
        raise ChargenError("--new-only is for runs trained in lines mode; this run is one stream of text")
    n = args.num_samples or model.kind.default_samples
    if n == 1:  # stream it as it comes
        pieces = model.stream(args.prime, args.length, **options)  # checks the prime first
        for piece in pieces:
            out.write(piece)
            out.flush()
        out.write("\n")
        return 0
    texts = model.generate_batch(args.prime, args.length, num_samples=n, **options)
    for i, text in enumerate(texts, 1):
        out.write(f"--- sample {i} of {len(texts)} ---\n{text}\n")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .api import load

    model = load(args.run_dir, device=args.device, weights=args.weights)
    started = time.perf_counter()
    result = model.evaluate_file(args.text_file, args.encoding, args.errors,
                                 log=lambda message: print(message, file=sys.stderr))
    print(f"scored in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    over = f"{result['items']:,} items ({result['chars']:,} chars and ends)" if "items" in result \
        else f"{result['chars']:,} chars"
    print(f"loss {result['loss']:.4f} nats/char  bpc {result['bpc']:.4f}  over {over}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_model, export_web

    if args.web:
        out = export_web(Path(args.run_dir), Path(args.out_dir), args.weights, args.web_dtype, args.force)
        size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
        print(f"exported {args.run_dir} ({args.weights} weights, {args.web_dtype}) as a web page to {out}: "
              f"{size / 1e6:.1f} MB; try it with: python -m http.server -d {out}")
        return 0
    if args.web_dtype != "fp32":
        raise ChargenError("--web-dtype is for --web exports; add --web")
    out = export_model(Path(args.run_dir), Path(args.out_dir), args.weights, args.force)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"exported {args.run_dir} ({args.weights} weights) to {out}: {size / 1e6:.1f} MB, with a model card "
          f"({checkpoint.CARD})")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return int(e.code or 0)
    try:
        return {"train": cmd_train, "sample": cmd_sample, "eval": cmd_eval, "export": cmd_export}[args.command](args)
    except ChargenError as e:
        print(f"chargen: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `chargen sample RUN | head` (before OSError, which it is one of)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a path the checks above did not foresee: name it, never a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"chargen: error: {where}{e.strerror or e}; check the path and its permissions", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chargen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
