"""The GPU proof: every GPU path of chargen checked and measured by one command.

    python -m benchmarks.gpu_check OUT                    # on a CUDA machine: under 8 minutes on one H200
    python -m benchmarks.gpu_check OUT --dry-run          # the same code paths on the CPU, tiny sizes, seconds
    python -m benchmarks.gpu_check OUT --parts speed legw # some parts again

(``python benchmarks/gpu_check.py OUT`` works too: it starts itself again as the module.)

Four parts, in this order, each written to OUT/gpu_check.json and OUT/gpu_check.md as soon
as it ends (a run cut short keeps what it measured; a part that crashes is recorded as a
failed check and the others still run):

1. correctness: 200 steps each in fp32, bf16 and fp16 (with the gradient scaler), every
   loss finite and falling; exact resume (bit for bit under cuDNN's deterministic
   settings, or within a stated tolerance naming the kernels that are not deterministic);
   LeanStep and nn.LSTM drawing the same text; the app's serving layer generating on the
   device; torchrun with 1 process (nccl) and 2 processes sharing one GPU (gloo).
2. speed: training chars/s of 1x256, 1x1024 and 3x1024 at batch 64, 256 and 1024, bptt
   128, in fp32 and bf16, against the same run's GEMM of that precision, with the GPU's
   busy share; the slow recipe (batch 1, one step per update) beside them; sampling with
   1, 64 and 1024 samples (``benchmarks.throughput`` measures each row).
3. legw: the base batch 32 against LEGW at 512 over equal epochs, on the largest model the
   time allows: final bits/char, and the training time each takes to reach the base's.
4. quality: the best model this check trains on Shakespeare in 3 minutes: its validation
   loss and a sample.

The dry run is what the test suite runs: a check that cannot run on the CPU (fp16) is
recorded as skipped, with chargen's own reason.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # Run as a file (``python benchmarks/gpu_check.py OUT``): start again as the module, with the
    # root on the new process's path through its environment (this process's sys.path is left
    # alone). The working folder stays, so a relative OUT or --text means the same folder.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = os.pathsep.join(p for p in (_root, os.environ.get("PYTHONPATH")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.gpu_check", *sys.argv[1:]],
              os.environ | {"PYTHONPATH": _path})

# Deterministic cuBLAS for the exact-resume check; read when CUDA starts, so set first.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import contextlib
import json
import math
import subprocess
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

import chargen
from benchmarks import throughput
from benchmarks.common import ROOT, child_env, command_line, write_json
from chargen import ChargenError, ModelConfig, TrainConfig, load_corpus, train
from chargen.device import autocast_problem
from chargen.evaluate import bpc
from chargen.export import export_model
from chargen.sample import Sampler
from chargen.serving import Service

PARTS = ("correctness", "speed", "legw", "quality")


@dataclass(frozen=True)
class Sizes:
    """How big each part is: the full check on a GPU, or the dry run's tiny copy of it."""

    device: str
    text_chars: int | None  # the corpus is cut to this many characters (None: all of it)
    model: dict  # the correctness model (ModelConfig fields)
    batch: int
    bptt: int
    steps: int  # per precision
    resume_steps: int
    sample_chars: int  # per sample, LeanStep against nn.LSTM
    torchrun_steps: int
    speed_models: tuple[tuple[int, int], ...]  # (hidden, layers), as throughput.py takes them
    speed_batches: tuple[int, ...]
    speed_bptt: int
    sampling_counts: tuple[int, ...]
    sampling_length: int
    effort: throughput.Effort
    legw_model: dict
    legw_batches: tuple[int, int]  # the base, and LEGW's wider batch
    legw_epochs: float
    legw_evals: int  # validations over each LEGW run
    quality_model: dict
    quality_batch: int
    quality_seconds: float


FULL = Sizes(
    device="cuda", text_chars=None, model=dict(embedding=64, hidden=512, layers=2, dropout=0.1),
    batch=32, bptt=128, steps=200, resume_steps=60, sample_chars=500, torchrun_steps=60,
    speed_models=((256, 1), (1024, 1), (1024, 3)), speed_batches=(64, 256, 1024), speed_bptt=128,
    sampling_counts=(1, 64, 1024), sampling_length=1000,
    effort=replace(throughput.FULL, gemm_repeats=2, streams_seconds=1.0, slow_updates=300),
    legw_model=dict(embedding=64, hidden=1024, layers=2, dropout=0.1), legw_batches=(32, 512), legw_epochs=3,
    legw_evals=12, quality_model=dict(embedding=128, hidden=1024, layers=3, dropout=0.25), quality_batch=128,
    quality_seconds=180)
DRY = Sizes(
    device="cpu", text_chars=40_000, model=dict(embedding=8, hidden=24, layers=2, dropout=0.1),
    batch=4, bptt=16, steps=60, resume_steps=8, sample_chars=60, torchrun_steps=6,
    speed_models=((16, 1),), speed_batches=(4,), speed_bptt=8, sampling_counts=(1, 4), sampling_length=20,
    effort=throughput.QUICK, legw_model=dict(embedding=8, hidden=16, layers=1, dropout=0.0), legw_batches=(4, 16),
    legw_epochs=1, legw_evals=4, quality_model=dict(embedding=8, hidden=24, layers=1, dropout=0.0), quality_batch=8,
    quality_seconds=3)


@dataclass
class Check:
    """One correctness check: passed (True), failed (False) or skipped (None), and why."""

    name: str
    ok: bool | None
    detail: str
    seconds: float = 0.0


@dataclass
class Report:
    """Everything measured so far, written whole after each part."""

    out: Path
    dry_run: bool
    env: dict
    checks: list[Check] = field(default_factory=list)
    results: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def write(self) -> None:
        data = {"dry_run": self.dry_run, "env": self.env, "seconds": round(time.perf_counter() - self.started, 1),
                "checks": [asdict(c) for c in self.checks], **self.results, "targets": targets(self.results)}
        write_json(self.out / "gpu_check.json", data)
        try:
            text = markdown(data)
        except Exception as e:  # the JSON above holds the figures; a report bug must not lose them
            text = f"# chargen GPU check\n\nthe report failed ({type(e).__name__}: {e}); see gpu_check.json"
            traceback.print_exc()
        (self.out / "gpu_check.md").write_text(text + "\n")


# --- correctness -------------------------------------------------------------------------
def timed_check(name: str, run: Callable[[], tuple[bool | None, str]]) -> Check:
    """``run`` as a check; a ChargenError is a skip (chargen refused, and said why), any
    other exception a failure."""
    start = time.perf_counter()
    try:
        ok, detail = run()
    except ChargenError as e:
        ok, detail = None, f"skipped: {e}"
    except Exception as e:  # the check failed; the report says how, and the others run
        ok, detail = False, f"{type(e).__name__}: {e}"
        traceback.print_exc()
    return Check(name, ok, detail, round(time.perf_counter() - start, 2))


def run_config(sizes: Sizes, **overrides) -> TrainConfig:
    settings = dict(batch_size=sizes.batch, bptt=sizes.bptt, steps=sizes.steps, eval_every=sizes.steps,
                    log_every=max(1, sizes.steps // 20), warmup_steps=max(1, sizes.steps // 10), sample_chars=0,
                    device=sizes.device, seed=11)
    return TrainConfig(**(settings | overrides))


def model_config(corpus, fields: dict) -> ModelConfig:
    return ModelConfig(vocab_size=corpus.tokenizer.vocab_size, **fields)


def precision_run(corpus, sizes: Sizes, work: Path, precision: str) -> tuple[bool, str]:
    """Training in ``precision``: every logged loss finite, and the loss falling."""
    result = train(corpus, work / f"precision-{precision}", model_config(corpus, sizes.model),
                   run_config(sizes, precision=precision), force=True)
    losses = [e["loss"] for e in result.history if e["event"] == "train"]
    finite = all(math.isfinite(v) for v in losses) and math.isfinite(result.last_val_loss or math.nan)
    falls = len(losses) >= 2 and losses[-1] < losses[0] - 0.1
    return finite and falls, (f"{len(losses)} logged losses, {'all finite' if finite else 'NOT all finite'}; "
                              f"{losses[0]:.3f} -> {losses[-1]:.3f} nats; val {result.last_val_loss:.3f}")


@contextlib.contextmanager
def deterministic() -> Iterator[list[warnings.WarningMessage]]:
    """cuDNN's deterministic settings and torch's deterministic algorithms, warning (not
    failing) where a kernel has none; the warnings name those kernels."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def exact_resume(corpus, sizes: Sizes, work: Path) -> tuple[bool, str]:
    """A run stopped halfway and resumed ends with the uninterrupted run's weights."""
    config = run_config(sizes, steps=sizes.resume_steps, eval_every=sizes.resume_steps // 2, log_every=1,
                        precision="fp32")
    model = model_config(corpus, sizes.model)
    with deterministic() as caught:
        straight = train(corpus, work / "straight", model, config, force=True).model.state_dict()
        stop = StopAt(sizes.resume_steps // 2)
        train(corpus, work / "resumed", model, config, force=True, on_event=stop.hook, stop=stop.event)
        resumed = train(corpus, work / "resumed", model, config, resume=True).model.state_dict()
    diff = max((straight[k].float() - resumed[k].float()).abs().max().item() for k in straight)
    kernels = sorted({str(w.message).split(" does not have a deterministic")[0] for w in caught
                      if "deterministic" in str(w.message)})
    if diff == 0:
        return True, f"bit for bit: {sizes.resume_steps} steps straight, and stopped at {stop.stopped_at} and resumed"
    tolerance = 1e-4
    named = f"non-deterministic kernels: {', '.join(kernels)}" if kernels else "no kernel reported as such"
    return diff <= tolerance and bool(kernels), f"max weight difference {diff:.3g} (tolerance {tolerance}); {named}"


class StopAt:
    """Stops a run (as the app's Stop does) once it has logged step ``step``."""

    def __init__(self, step: int) -> None:
        self.step, self.event, self.stopped_at = step, threading.Event(), None

    def hook(self, event: dict) -> None:
        if event["event"] == "train" and event["step"] >= self.step and not self.event.is_set():
            self.stopped_at = event["step"]
            self.event.set()


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """No TF32 in cuBLAS or cuDNN (the trainer turns it on): both sampling paths in fp32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def lean_matches_lstm(run_dir: Path, sizes: Sizes) -> tuple[bool, str]:
    model = chargen.load(run_dir, device=sizes.device)
    texts = {}
    with full_fp32():
        for lean in (True, False):
            sampler = Sampler(model.model, model.tokenizer, "The ", num_samples=4, seed=3, lean=lean)
            list(sampler.pieces(sizes.sample_chars, temperature=1.0))
            texts[lean] = sampler.texts
    if texts[True] == texts[False]:
        return True, f"4 samples of {sizes.sample_chars} characters, the same on both paths"
    first = min(next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), len(x))
                for x, y in zip(texts[True], texts[False], strict=True))
    return False, f"the paths differ from character {first}"


def app_serves(run_dir: Path, sizes: Sizes, work: Path) -> tuple[bool, str]:
    """The app's serving layer (chargen.serving) generating on the device: two samples,
    streamed, then continued; the continued text is the one a single longer call draws."""
    export_model(run_dir, work / "models" / "m")
    service = Service(work / "models", work / "runs", work, device=sizes.device)
    *_, (_, writing) = service.generate("m", "The ", 200, 0.8, 0, 1.0, 7, 2)
    first = writing.sampler.texts
    list(service.continue_(writing, "m", 100, 0.8, 0, 1.0))
    *_, (_, whole) = service.generate("m", "The ", 300, 0.8, 0, 1.0, 7, 2)
    continued, at_once = writing.sampler.texts, whole.sampler.texts
    device = next(service.shelf.get("m").model.parameters()).device
    grew = all(len(a) == 200 and b.startswith(a) for a, b in zip(first, continued, strict=True))
    ok = device.type == torch.device(sizes.device).type and grew and continued == at_once
    same = "the same as" if continued == at_once else "DIFFERENT from"
    return ok, f"on {device}: 2 samples of 200 characters, continued by 100: {same} 300 at once"


def torchrun(text: Path, sizes: Sizes, work: Path, processes: int, backend: str | None) -> tuple[bool, str]:
    """``chargen train`` under torchrun; 2 processes on one GPU share it over gloo."""
    out = work / f"torchrun-{processes}"
    env = child_env(OMP_NUM_THREADS="1")
    env.pop("CHARGEN_DIST_BACKEND", None)
    if backend:
        env["CHARGEN_DIST_BACKEND"] = backend
    m = sizes.model
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "chargen", "train", str(text), "--out", str(out), "--steps", str(sizes.torchrun_steps),
               "--eval-every", str(sizes.torchrun_steps), "--device", sizes.device, "--precision", "fp32",
               "--hidden", str(m["hidden"]), "--layers", str(m["layers"]), "--embedding", str(m["embedding"]),
               "--batch-size", str(sizes.batch * 2), "--bptt", str(sizes.bptt), "--sample-chars", "0", "--quiet",
               "--force"]
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    used = backend or ("nccl" if sizes.device == "cuda" else "gloo")
    if done.returncode != 0:
        return False, f"{used}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-600:]}"
    summary = json.loads((out / 'config.json').read_text())["summary"]
    val = summary.get("best_val_loss") or math.nan
    ok = summary["step"] == sizes.torchrun_steps and math.isfinite(val)
    return ok, f"{used}, {processes} process(es): {summary['step']} steps, val loss {val:.3f}"


def correctness(report: Report, corpus, text: Path, sizes: Sizes, work: Path) -> None:
    for precision in ("fp32", "bf16", "fp16"):
        report.checks.append(timed_check(f"train {sizes.steps} steps in {precision}",
                                         lambda p=precision: precision_run(corpus, sizes, work, p)))
    report.checks.append(timed_check("exact resume", lambda: exact_resume(corpus, sizes, work)))
    fp32_run = work / "precision-fp32"
    report.checks.append(timed_check("LeanStep and nn.LSTM draw the same text",
                                     lambda: lean_matches_lstm(fp32_run, sizes)))
    report.checks.append(timed_check("the app's serving layer generates", lambda: app_serves(fp32_run, sizes, work)))
    report.checks.append(timed_check("torchrun, 1 process", lambda: torchrun(text, sizes, work, 1, None)))
    report.checks.append(timed_check("torchrun, 2 processes on one device over gloo",
                                     lambda: torchrun(text, sizes, work, 2, "gloo")))


# --- speed -------------------------------------------------------------------------------
def speed(report: Report, sizes: Sizes) -> None:
    """``benchmarks.throughput``'s rows. On CUDA, fp32 means TF32 tensor cores, in the GEMM reference
    too: chargen's trainer turns them on, so its fp32 is measured as it trains."""
    device = torch.device(sizes.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    precisions = [p for p in ("fp32", "bf16") if p == "fp32" or autocast_problem(device, throughput.DTYPES[p]) is None]
    grid = argparse.Namespace(models=list(sizes.speed_models), batch=list(sizes.speed_batches), bptt=[sizes.speed_bptt])
    gemms = {p: throughput.gemm_gflops(device, sizes.effort, p) for p in precisions}
    report.results["speed"] = {"gemm": list(gemms.values()),
                               "rows": throughput.device_rows(device, gemms, grid, sizes.effort)}
    report.write()
    report.results["speed"]["sampling"] = throughput.sampling_rows(device, grid, sizes.sampling_length,
                                                                   sizes.sampling_counts)


# --- LEGW --------------------------------------------------------------------------------
def legw_run(corpus, sizes: Sizes, work: Path, batch: int, precision: str) -> dict:
    steps_per_epoch = max(1, (len(corpus.train_ids) - 1) // (batch * sizes.bptt))
    eval_every = max(1, round(sizes.legw_epochs * steps_per_epoch / sizes.legw_evals))
    config = TrainConfig(batch_size=batch, bptt=sizes.bptt, epochs=sizes.legw_epochs, eval_every=eval_every,
                         log_every=eval_every, sample_chars=0, device=sizes.device, precision=precision, seed=5)
    result = train(corpus, work / f"legw-{batch}", model_config(corpus, sizes.legw_model), config, force=True)
    curve = [(e["elapsed"], e["val_bpc"]) for e in result.history if e["event"] == "val"]
    lr = json.loads((work / f"legw-{batch}" / "config.json").read_text())["lr_schedule"]
    return {"batch": batch, "steps": result.step, "final_bpc": curve[-1][1], "train_seconds": curve[-1][0],
            "curve": curve, "lr_schedule": lr}


def legw(report: Report, corpus, sizes: Sizes, work: Path) -> None:
    precision = "bf16" if autocast_problem(torch.device(sizes.device), torch.bfloat16) is None else "fp32"
    base, wide = (legw_run(corpus, sizes, work, b, precision) for b in sizes.legw_batches)
    target = base["final_bpc"]
    for run in (base, wide):
        run["seconds_to_base_final"] = next((t for t, bpc in run["curve"] if bpc <= target), None)
    m = sizes.legw_model
    report.results["legw"] = {"model": f"{m['layers']}x{m['hidden']}", "epochs": sizes.legw_epochs,
                              "precision": precision, "base": base, "legw": wide}


# --- quality -----------------------------------------------------------------------------
def quality(report: Report, corpus, sizes: Sizes, work: Path, seconds: float) -> None:
    precision = "bf16" if autocast_problem(torch.device(sizes.device), torch.bfloat16) is None else "fp32"
    config = TrainConfig(batch_size=sizes.quality_batch, bptt=sizes.bptt, max_time=seconds, device=sizes.device,
                         precision=precision, sample_chars=0, seed=9)
    result = train(corpus, work / "quality", model_config(corpus, sizes.quality_model), config, force=True)
    sample = chargen.load(work / "quality", device=sizes.device).generate("ROMEO:\n", 400, seed=1)
    m = sizes.quality_model
    report.results["quality"] = {
        "model": f"{m['layers']}x{m['hidden']}, embedding {m['embedding']}, dropout {m['dropout']}",
        "batch": sizes.quality_batch, "precision": precision, "seconds": seconds, "steps": result.step,
        "epochs": round(result.epoch, 2), "best_val_loss": result.best_val_loss,
        "best_val_bpc": None if result.best_val_loss is None else bpc(result.best_val_loss),
        "last_val_loss": result.last_val_loss, "sample": sample}  # (on a sample where the whole text had no time)


def quality_figure(q: dict) -> str:
    """The quality run's validation, said: the whole text's best, or where the budget left no
    time for the whole text (a slow or busy machine), its last figure on a sample."""
    if q["best_val_loss"] is not None:
        return f"best validation loss {q['best_val_loss']:.4f} nats/char ({q['best_val_bpc']:.4f} bits/char)"
    if q.get("last_val_loss") is not None:
        return (f"validation loss {q['last_val_loss']:.4f} nats/char on a sample of the validation text "
                "(the budget left no time for the whole text)")
    return "not validated (the budget left no time for it)"


# --- the targets and the report ----------------------------------------------------------
def targets(results: dict) -> list[dict]:
    """Issue 14's targets, judged on what was measured (absent parts are left out)."""
    found = []
    rows = (results.get("speed") or {}).get("rows", [])
    streams = [r for r in rows if r["recipe"] == "streams"]
    if streams:
        best = max(streams, key=lambda r: r["vs_slow"])
        found.append({"target": "streams at least 200x the slow recipe", "value": f"{best['vs_slow']:,.0f}x "
                      f"({best['layers']}x{best['hidden']} {best['precision']} B={best['batch']})",
                      "met": best["vs_slow"] >= 200})
    largest = max(streams, key=lambda r: (r["layers"] * r["hidden"], r["batch"]), default=None)
    if largest is not None:
        same = {r["precision"]: r for r in streams if (r["layers"], r["hidden"], r["batch"]) ==
                (largest["layers"], largest["hidden"], largest["batch"])}
        name = f"{largest['layers']}x{largest['hidden']} B={largest['batch']}"
        if "bf16" in same:
            share = same["bf16"]["gemm_fraction"]
            found.append({"target": f"{name} bf16 at least 25% of the bf16 GEMM", "value": f"{100 * share:.1f}%",
                          "met": share >= 0.25})
            ratio = same["bf16"]["chars_per_s"] / same["fp32"]["chars_per_s"]
            found.append({"target": f"{name}: bf16 at least 1.5x fp32", "value": f"{ratio:.2f}x", "met": ratio >= 1.5})
    sixty_four = [r for r in (results.get("speed") or {}).get("sampling", []) if r["samples"] == 64]
    if sixty_four:
        best = max(sixty_four, key=lambda r: r["chars_per_s"])
        found.append({"target": "64 samples at once at least 100,000 chars/s",
                      "value": f"{best['chars_per_s']:,.0f} ({best['layers']}x{best['hidden']})",
                      "met": best["chars_per_s"] >= 100_000})
    if legw_result := results.get("legw"):
        base, wide = legw_result["base"], legw_result["legw"]
        reach = wide["seconds_to_base_final"]
        found.append({"target": f"LEGW B={wide['batch']} reaches the final bpc of B={base['batch']} sooner",
                      "value": f"{'never' if reach is None else f'{reach:.1f} s'} "
                               f"against {base['train_seconds']:.1f} s",
                      "met": reach is not None and reach < base["train_seconds"]})
    return found


def markdown(data: dict) -> str:
    lines = [f"# chargen GPU check{' (dry run on the CPU)' if data['dry_run'] else ''}", ""]
    lines += [f"- {k}: {v}" for k, v in data["env"].items()] + [f"- total time: {data['seconds']} s", ""]
    lines += ["## Correctness", "", "| check | result | detail | s |", "| :--- | :--- | :--- | ---: |"]
    verdict = {True: "pass", False: "**FAIL**", None: "skipped"}
    lines += [f"| {c['name']} | {verdict[c['ok']]} | {c['detail'].replace('|', '/')} | {c['seconds']} |"
              for c in data["checks"]]
    if speed_result := data.get("speed"):
        lines += ["", "## Speed", "", throughput.report_tables(speed_result)]
    if legw_result := data.get("legw"):
        lines += ["", f"## LEGW ({legw_result['model']}, {legw_result['epochs']} epochs, {legw_result['precision']})",
                  "", "| batch | steps | final bpc | training s | s to the base's final bpc |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for run in (legw_result["base"], legw_result["legw"]):
            reach = run["seconds_to_base_final"]
            lines.append(f"| {run['batch']} | {run['steps']:,} | {run['final_bpc']:.4f} | {run['train_seconds']:.1f} | "
                         f"{'never' if reach is None else f'{reach:.1f}'} |")
    if q := data.get("quality"):
        lines += ["", f"## Quality ({q['seconds']:.0f} s)", "",
                  f"{q['model']}, batch {q['batch']}, {q['precision']}: {q['steps']:,} steps ({q['epochs']} epochs), "
                  f"{quality_figure(q)}.", "",
                  "```", q["sample"], "```"]
    if data["targets"]:
        lines += ["", "## Targets", "", "| target | value | met |", "| :--- | ---: | :--- |"]
        lines += [f"| {t['target']} | {t['value']} | {'yes' if t['met'] else '**no**'} |" for t in data["targets"]]
    return "\n".join(lines)


# --- the command -------------------------------------------------------------------------
def cut_text(source: Path, chars: int | None, work: Path) -> Path:
    if chars is None:
        return source
    cut = work / source.name
    cut.write_text(source.read_text(encoding="utf-8")[:chars], encoding="utf-8")
    return cut


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--dry-run", action="store_true", help="the same code paths on the CPU with tiny sizes")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts (default all)")
    parser.add_argument("--text", type=Path, default=ROOT / "corpora" / "shakespeare.txt")
    parser.add_argument("--budget", type=float, default=470,
                        help="seconds for the whole check; the quality run gets what is left, up to 180 (default 470)")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU here: run it on a GPU machine, or pass --dry-run for the CPU path")
    if not args.text.is_file():
        parser.error(f"{args.text}: no such file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    env = throughput.environment([torch.device(sizes.device)])
    report = Report(args.out, args.dry_run, env)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        text = cut_text(args.text, sizes.text_chars, work)
        corpus = load_corpus(text, mode="stream")
        steps = {"correctness": lambda: correctness(report, corpus, text, sizes, work),
                 "speed": lambda: speed(report, sizes),
                 "legw": lambda: legw(report, corpus, sizes, work),
                 "quality": lambda: quality(report, corpus, sizes, work, quality_seconds(report, sizes, args))}
        for part in args.parts:
            print(f"gpu_check: {part} ...", file=sys.stderr, flush=True)
            check = timed_check(f"part {part}", lambda p=part: completed(steps[p]))
            if check.ok is not True:
                report.checks.append(check)
            report.write()
    print((args.out / "gpu_check.md").read_text())
    return 0 if all(c.ok is not False for c in report.checks) else 1


def completed(step: Callable[[], None]) -> tuple[bool, str]:
    step()
    return True, "completed"


def quality_seconds(report: Report, sizes: Sizes, args: argparse.Namespace) -> float:
    left = args.budget - (time.perf_counter() - report.started) - 20  # the sample, the report
    return max(1.0, min(sizes.quality_seconds, left)) if not args.dry_run else sizes.quality_seconds


if __name__ == "__main__":
    sys.exit(main())
