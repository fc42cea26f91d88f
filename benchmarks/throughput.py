"""Training throughput of chargen's CharLSTM, set against the machine's matrix-product speed.

What one run measures, on the CPU and (when present) on CUDA:

1. The GEMM figure: a 2048 x 2048 x 2048 matrix product in each precision measured
   (fp32; on CUDA also bf16), in GFLOP/s (warmed up, repeated for at least a second, best
   of three). It is the reference: about as fast as this machine multiplies matrices
   through PyTorch.
2. Training throughput (characters per second) of a ``CharLSTM`` (embedding 64,
   vocabulary 100, dropout 0) of each size in ``--models`` and each precision, for
   - the slow recipe: batch 1, one time step per update, the state carried (detached)
     from update to update, AdamW and gradient clipping as in chargen's training loop;
   - the streams: every batch x bptt combination, same update, state carried and detached.
   Each row also gets its speed-up over the slow recipe, the achieved GFLOP/s (by the
   explicit count in ``train_flops_per_char``) and that as a share of the GEMM figure.
3. Sampling chars/s of each model size (random weights) with 1 and with 64 samples drawn
   in parallel, on the path ``Sampler`` takes by default.
4. Where the rest goes: ``torch.profiler`` over a few streams steps of the largest
   configuration, the top operators by self CPU time.

Run it from the repository root, on a quiet machine:

    python -m benchmarks.throughput                      # the full grid, a few minutes
    python -m benchmarks.throughput --json bench.json    # also the raw results as JSON
    python -m benchmarks.throughput --quick              # a smoke test, small grid
    python -m benchmarks.throughput --device cpu --threads 8 --models 1x512 --batch 256 --bptt 128
    python -m benchmarks.throughput --device cuda --models 1x256 3x1024 --batch 64 1024 --precision fp32 bf16

The token ids are random: throughput does not depend on the text, and a fixed vocabulary
of 100 keeps the FLOP count the same on every machine (a real corpus would change it).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import command_line, cpu_flags, cpu_name, write_json
from chargen.config import TrainConfig
from chargen.corpus import Streams, batchify
from chargen.device import autocast_problem
from chargen.model import CharLSTM, ModelConfig, detach_state
from chargen.prepare import param_groups
from chargen.sample import LEAN_MAX_SAMPLES, Sampler
from chargen.tokenizer import CharTokenizer

GEMM_SIZE = 2048
EMBEDDING = 64
VOCAB = 100
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CHUNKS_PER_PASS = 8  # the streams hold this many chunks, then wrap round like a new epoch
TOP_OPS = 8


@dataclass(frozen=True)
class Effort:
    """How hard to try: repetition counts and minimum measuring times."""

    gemm_warmup: int
    gemm_reps: int
    gemm_seconds: float
    gemm_repeats: int
    slow_warmup: int
    slow_updates: int
    streams_warmup: int
    streams_steps: int
    streams_seconds: float
    profile_steps: int


FULL = Effort(gemm_warmup=3, gemm_reps=3, gemm_seconds=1.0, gemm_repeats=3,
              slow_warmup=50, slow_updates=400, streams_warmup=3, streams_steps=3,
              streams_seconds=1.5, profile_steps=3)
QUICK = Effort(gemm_warmup=1, gemm_reps=1, gemm_seconds=0.0, gemm_repeats=1,
               slow_warmup=5, slow_updates=20, streams_warmup=1, streams_steps=1,
               streams_seconds=0.0, profile_steps=1)


# --- timing ------------------------------------------------------------------------------
def synchronizer(device: torch.device) -> Callable[[], None]:
    """CUDA work is asynchronous, so a clock read means nothing until the device is done."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def seconds_per_call(fn: Callable[[], object], device: torch.device, *, warmup: int, reps: int,
                     min_seconds: float = 0.0, repeats: int = 1) -> float:
    """The best, over ``repeats`` timings, of the mean time of one ``fn()`` call. Each timing
    runs ``reps`` calls, and more (the count is grown and the timing redone) until it lasts
    ``min_seconds``; the count is fixed inside a timing so the clock is read only twice."""
    sync = synchronizer(device)
    for _ in range(warmup):
        fn()
    sync()

    def timed(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return time.perf_counter() - start

    best = math.inf
    for _ in range(repeats):
        elapsed = timed(reps)
        while elapsed < min_seconds:
            # Aim 20% past the target so one regrowth nearly always suffices.
            reps = max(reps + 1, min(reps * 1000, math.ceil(reps * 1.2 * min_seconds / max(elapsed, 1e-9))))
            elapsed = timed(reps)
        best = min(best, elapsed / reps)
    return best


# --- what is measured ----------------------------------------------------------------------
def train_flops_per_char(config: ModelConfig) -> float:
    """Floating-point operations to train on one character (one multiply-add = 2 FLOPs).

    Forward, per character: each LSTM layer multiplies its input (size I: the embedding for
    the first layer, H after) and its previous h by the four gates' weights,
    2 * 4H * (I + H); the head multiplies h by the output matrix, 2 * H * V. Training is 3x
    the forward: the backward pass costs two more products of the same size (gradients for
    the activations and for the weights).

    Left out, as small next to the matrix products or not proportional to characters: the
    embedding lookup (a gather), biases, the elementwise gate math (sigmoids, tanhs, the
    cell update), softmax and cross-entropy, gradient clipping and the AdamW update (per
    update, not per character; for the slow recipe, one update per character, that
    optimizer work is real but counted as overhead here, not as useful FLOPs).
    """
    forward = 0
    input_size = config.embedding
    for _ in range(config.layers):
        forward += 2 * 4 * config.hidden * (input_size + config.hidden)
        input_size = config.hidden
    forward += 2 * config.hidden * config.vocab_size
    return 3.0 * forward


def gemm_gflops(device: torch.device, effort: Effort, precision: str = "fp32") -> dict:
    """The reference: achieved GFLOP/s of one GEMM_SIZE^3 matrix product in ``precision``."""
    generator = torch.Generator().manual_seed(0)
    dtype = DTYPES[precision]
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator).to(device, dtype) for _ in range(2))
    out = torch.empty(GEMM_SIZE, GEMM_SIZE, device=device, dtype=dtype)  # reused: time the product, not malloc
    seconds = seconds_per_call(lambda: torch.mm(a, b, out=out), device, warmup=effort.gemm_warmup,
                               reps=effort.gemm_reps, min_seconds=effort.gemm_seconds,
                               repeats=effort.gemm_repeats)
    return {"device": device.type, "precision": precision, "size": GEMM_SIZE, "seconds": seconds,
            "gflops": 2 * GEMM_SIZE**3 / seconds / 1e9}


def training_step(hidden: int, layers: int, batch: int, bptt: int, device: torch.device,
                  precision: str = "fp32") -> tuple[Callable[[], None], ModelConfig]:
    """One update of chargen's training loop as a closure over its own model, optimizer,
    streams and carried state: chunk -> forward (autocast to bf16 if asked) -> cross-entropy
    -> backward -> clip -> AdamW -> detach. (The loop's per-step learning-rate set and
    bookkeeping are left out.)"""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=VOCAB, embedding=EMBEDDING, hidden=hidden, layers=layers, dropout=0.0)
    train_config = TrainConfig(batch_size=batch, bptt=bptt)
    model = CharLSTM(config).to(device).train()
    lr = train_config.scaling(1).base_lr  # (the rate and the decay cost the same at any value)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=lr, betas=(0.9, 0.99))
    # uint8 ids, as chargen's tokenizer stores any vocabulary of up to 256.
    ids = np.random.default_rng(0).integers(0, VOCAB, size=batch * (CHUNKS_PER_PASS * bptt + 1), dtype=np.uint8)
    streams = Streams(batchify(ids, batch, device))
    position, carry = 0, None

    def step() -> None:
        nonlocal position, carry
        if streams.finished(position):  # a new epoch starts from a zero state, as in train()
            position, carry = 0, None
        x, y = streams.chunk(position, bptt)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits, state = model(x, carry)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.clip)
        optimizer.step()
        carry = detach_state(state)
        position += x.shape[0]

    return step, config


def gpu_utilisation(fn: Callable[[], object], device: torch.device, seconds: float = 1.0) -> float | None:
    """The GPU's own busy figure (NVML, as nvidia-smi shows it) while ``fn`` runs over and over
    for ``seconds``: the share of time a kernel was running. None where it cannot be read."""
    read = utilisation_reader(device)
    if read is None:
        return None
    readings: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.05):
            if (value := read()) is not None:
                readings.append(value)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
    torch.cuda.synchronize(device)
    done.set()
    poller.join()
    kept = readings[len(readings) // 4:]  # skip the ramp-up
    return sum(kept) / len(kept) if kept else None


def utilisation_reader(device: torch.device) -> Callable[[], float | None] | None:
    """How to read the GPU's busy share now: torch (through pynvml) where it can, else the
    nvidia-smi command; None where neither answers."""
    try:
        torch.cuda.utilization(device)
        return lambda: float(torch.cuda.utilization(device))
    except Exception:  # no pynvml: ask nvidia-smi
        pass
    command = ["nvidia-smi", f"--id={device.index or 0}", "--query-gpu=utilization.gpu",
               "--format=csv,noheader,nounits"]

    def from_smi() -> float | None:
        try:
            return float(subprocess.run(command, capture_output=True, text=True, timeout=5).stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError):
            return None

    return from_smi if from_smi() is not None else None


def train_throughput(recipe: str, hidden: int, layers: int, batch: int, bptt: int, device: torch.device,
                     precision: str, *, warmup: int, steps: int, min_seconds: float) -> dict:
    step, config = training_step(hidden, layers, batch, bptt, device, precision)
    seconds = seconds_per_call(step, device, warmup=warmup, reps=steps, min_seconds=min_seconds)
    busy = gpu_utilisation(step, device) if device.type == "cuda" else None
    chars_per_s = batch * bptt / seconds
    return {"device": device.type, "hidden": hidden, "layers": layers, "precision": precision, "recipe": recipe,
            "batch": batch, "bptt": bptt, "seconds_per_update": seconds, "chars_per_s": chars_per_s,
            "gflops": chars_per_s * train_flops_per_char(config) / 1e9,
            "train_flops_per_char": train_flops_per_char(config), "gpu_utilisation": busy}


def device_rows(device: torch.device, gemms: dict[str, dict], args: argparse.Namespace, effort: Effort) -> list[dict]:
    """The slow recipe and every streams configuration, per model and precision, on one
    device; each set against the matrix-product figure of its own precision."""
    rows = []
    for hidden, layers in args.models:
        for precision in gemms:
            slow = train_throughput("slow", hidden, layers, 1, 1, device, precision, warmup=effort.slow_warmup,
                                    steps=effort.slow_updates, min_seconds=0.0)
            group = [slow] + [
                train_throughput("streams", hidden, layers, batch, bptt, device, precision,
                                 warmup=effort.streams_warmup, steps=effort.streams_steps,
                                 min_seconds=effort.streams_seconds)
                for batch in args.batch for bptt in args.bptt
            ]
            for row in group:
                row["vs_slow"] = row["chars_per_s"] / slow["chars_per_s"]
                row["gemm_fraction"] = row["gflops"] / gemms[precision]["gflops"]
                print(f"  {device.type} {layers}x{hidden} {precision} B={row['batch']} bptt={row['bptt']}: "
                      f"{row['chars_per_s']:,.0f} chars/s", file=sys.stderr, flush=True)
            rows += group
    return rows


def sampling_rows(device: torch.device, args: argparse.Namespace, length: int,
                  counts: tuple[int, ...] = (1, 64)) -> list[dict]:
    """Sampling chars/s (all samples together) for each count of samples drawn in parallel,
    on the path ``Sampler`` takes by default (the lean step up to LEAN_MAX_SAMPLES samples)."""
    tokenizer = CharTokenizer([chr(0x100 + i) for i in range(VOCAB - 4)])
    rows = []
    for hidden, layers in args.models:
        torch.manual_seed(0)
        model = CharLSTM(ModelConfig(vocab_size=tokenizer.vocab_size, embedding=EMBEDDING, hidden=hidden,
                                     layers=layers, dropout=0.0)).to(device).eval()
        for n in counts:
            sampler = Sampler(model, tokenizer, tokenizer.chars[0], num_samples=n, seed=0)
            list(sampler.pieces(10))  # the prime and the first steps
            steps = max(20, length // (1 if hidden * layers <= 1024 else 10))
            sync = synchronizer(device)
            sync()
            start = time.perf_counter()
            drawn = sum(1 for _ in sampler.pieces(steps, temperature=1.0))
            sync()
            rows.append({"device": device.type, "hidden": hidden, "layers": layers, "samples": n,
                         "path": "lean" if n <= LEAN_MAX_SAMPLES else "nn.LSTM",
                         "chars_per_s": drawn * n / (time.perf_counter() - start)})
            print(f"  {device.type} {layers}x{hidden} sampling x{n}: {rows[-1]['chars_per_s']:,.0f} chars/s",
                  file=sys.stderr, flush=True)
    return rows


def top_ops(device: torch.device, hidden: int, layers: int, batch: int, bptt: int, effort: Effort) -> dict:
    """The operators that take the most self CPU time over a few streams steps."""
    step, _ = training_step(hidden, layers, batch, bptt, device)
    # Run (and discard) a few steps first so allocations and first-call setup stay out of the profile.
    seconds_per_call(step, device, warmup=effort.streams_warmup, reps=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        seconds_per_call(step, device, warmup=0, reps=effort.profile_steps)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP_OPS]
    return {"device": device.type, "hidden": hidden, "layers": layers, "batch": batch, "bptt": bptt,
            "steps": effort.profile_steps,
            "total_self_cpu_ms": total / 1e3,
            "ops": [{"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                     "share": e.self_cpu_time_total / total} for e in ranked]}


# --- reporting -----------------------------------------------------------------------------
def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def environment(devices: list[torch.device]) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
           "cpu": cpu_name(), "cpu_flags": " ".join(cpu_flags()), "cpu_cores": os.cpu_count(),
           "load_average_1min": load_average(), "mkldnn": torch.backends.mkldnn.is_available(),
           "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if any(d.type == "cuda" for d in devices):
        # cuDNN's LSTM may use TF32 while the reference GEMM (matmul precision "highest") does
        # not, which can put the LSTM rows above 100% of the GEMM figure.
        env |= {"cuda_device": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
                "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    return env


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    align = ["---:" if i else ":---" for i in range(len(headers))]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [headers, align, *rows])


def report_tables(results: dict) -> str:
    """The GEMM reference, the training rows and the sampling rows, as markdown."""
    lines = []
    lines += ["## Reference: the matrix product", ""]
    lines.append(markdown_table(
        ["device", "precision", "size", "ms per product", "GFLOP/s"],
        [[g["device"], g["precision"], f"{g['size']}³", f"{g['seconds'] * 1e3:.2f}", f"{g['gflops']:,.1f}"]
         for g in results["gemm"]]))
    lines += ["", "## Training throughput (CharLSTM, embedding 64, vocabulary 100)", ""]
    lines.append(markdown_table(
        ["device", "model", "precision", "recipe", "batch", "bptt", "ms / update", "chars/s", "× slow", "GFLOP/s",
         "% of GEMM", "GPU busy"],
        [[r["device"], f"{r['layers']}x{r['hidden']}", r["precision"], r["recipe"], str(r["batch"]), str(r["bptt"]),
          f"{r['seconds_per_update'] * 1e3:.2f}", f"{r['chars_per_s']:,.0f}", f"{r['vs_slow']:,.1f}",
          f"{r['gflops']:,.2f}", f"{100 * r['gemm_fraction']:.1f}%",
          "" if r["device"] != "cuda" else "n/a" if r["gpu_utilisation"] is None else f"{r['gpu_utilisation']:.0f}%"]
         for r in results["rows"]]))
    lines += ["", "GFLOP/s counts only the matrix products (3 x forward of 2·4H(I+H) + 2HV per char); "
              "gate math, softmax and the optimizer are not counted."]
    if results.get("sampling"):
        lines += ["", "## Sampling (random weights; chars/s of all samples together)", ""]
        lines.append(markdown_table(
            ["device", "model", "samples", "path", "chars/s"],
            [[r["device"], f"{r['layers']}x{r['hidden']}", str(r["samples"]), r["path"], f"{r['chars_per_s']:,.0f}"]
             for r in results["sampling"]]))
    return "\n".join(lines)


def report(results: dict) -> str:
    env = results["env"]
    lines = [f"# chargen training throughput ({'quick smoke test' if results['quick'] else 'full run'})", ""]
    lines += [f"- {key}: {value}" for key, value in env.items()] + [""]
    lines.append(report_tables(results))
    p = results["profile"]
    steps = f"{p['steps']} step{'s' * (p['steps'] != 1)}"
    lines += ["", f"## Where the rest goes ({p['device']}, {p['layers']}x{p['hidden']}, batch {p['batch']}, "
              f"bptt {p['bptt']}, {steps}, top {len(p['ops'])} ops by self CPU time)", ""]
    lines.append(markdown_table(
        ["op", "calls", "self CPU ms", "share"],
        [[f"`{o['name']}`", str(o["calls"]), f"{o['self_cpu_ms']:,.1f}", f"{100 * o['share']:.1f}%"]
         for o in p["ops"]]))
    shown = sum(o["share"] for o in p["ops"])
    lines += ["", f"Total self CPU time {p['total_self_cpu_ms']:,.1f} ms; the ops above are "
              f"{100 * shown:.1f}% of it."]
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--quick", action="store_true",
                        help="tiny repetition counts and a small grid: a smoke test, not a measurement")
    parser.add_argument("--models", nargs="+", metavar="LAYERSxHIDDEN",
                        help="model sizes, e.g. 1x256 3x1024 (default: 1x256 1x512; quick: 1x256)")
    parser.add_argument("--precision", nargs="+", choices=list(DTYPES),
                        help="training precisions (default: fp32 on the CPU; fp32 and bf16 on CUDA)")
    parser.add_argument("--batch", type=int, nargs="+", help="streams batch sizes (default: 64 256; quick: 16)")
    parser.add_argument("--bptt", type=int, nargs="+", help="streams chunk lengths (default: 64 128; quick: 32)")
    parser.add_argument("--device", choices=["all", "cpu", "cuda"], default="all",
                        help="all: the CPU, and CUDA when available (default)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the raw results here")
    args = parser.parse_args(argv)
    # The quick grid is small because one step at hidden 512 x 256 streams x 128 takes
    # seconds on a small CPU; explicit sizes still win.
    try:
        args.models = [tuple(int(v) for v in m.lower().split("x"))[::-1] for m in args.models or
                       (["1x256"] if args.quick else ["1x256", "1x512"])]
    except ValueError:
        parser.error("--models takes sizes like 1x256 (layers x hidden)")
    if any(len(m) != 2 or min(m) <= 0 for m in args.models):
        parser.error("--models takes sizes like 1x256 (layers x hidden)")
    defaults = {"batch": ([16], [64, 256]), "bptt": ([32], [64, 128])}
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if min(getattr(args, name)) <= 0:
            parser.error(f"--{name} must be positive")
    if args.threads is not None and args.threads <= 0:
        parser.error("--threads must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    effort = QUICK if args.quick else FULL
    names = {"all": ["cpu"] + (["cuda"] if torch.cuda.is_available() else []), "cpu": ["cpu"], "cuda": ["cuda"]}
    devices = [torch.device(name) for name in names[args.device]]

    results: dict = {"quick": args.quick, "env": environment(devices), "effort": asdict(effort),
                     "gemm": [], "rows": []}
    load = results["env"]["load_average_1min"]
    if load is not None and load > 0.5:
        # Other work on the cores stalls torch's threads at every parallel region: small
        # ops (the slow recipe, the optimizer) can get 10-100x slower, so the numbers mislead.
        print(f"warning: load average {load:.2f} before starting; measure on a quiet machine "
              "(or pass --threads with fewer threads than free cores)", file=sys.stderr)
    results["sampling"] = []
    for device in devices:
        print(f"measuring on {device.type} ...", file=sys.stderr, flush=True)
        precisions = list(args.precision or (["fp32", "bf16"] if device.type == "cuda" else ["fp32"]))
        for name in [p for p in precisions if p != "fp32"]:
            if problem := autocast_problem(device, DTYPES[name]):
                print(f"  {name} skipped on {device.type}: autocast does not run here ({problem})", file=sys.stderr)
                precisions.remove(name)
        gemms = {precision: gemm_gflops(device, effort, precision) for precision in precisions}
        results["gemm"] += gemms.values()
        results["rows"] += device_rows(device, gemms, args, effort)
        results["sampling"] += sampling_rows(device, args, 100 if args.quick else 1000)
    # Profile the first device (the CPU unless only CUDA was asked for) at the largest config.
    hidden, layers = max(args.models)
    results["profile"] = top_ops(devices[0], hidden, layers, max(args.batch), max(args.bptt), effort)

    print(report(results))
    if args.json is not None:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
