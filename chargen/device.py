"""Choosing the device and the training precision once, at the edge, so nothing below
reads globals.

Whether bf16 (or fp16) autocast works is decided by what the kernels do, not by what the
CPU says it has: a tiny LSTM forward and backward under autocast is run once per process
and device. On a CPU the flags can promise what oneDNN does not deliver: with AVX2 only
(most laptops, many cloud VMs, and any machine under ``ONEDNN_MAX_CPU_ISA=AVX2``) its
LSTM has no bf16 kernel at all, and on AVX-512 without AVX512-BF16 it emulates bf16 at a
quarter of fp32's speed. So ``auto`` on an x86 CPU takes bf16 where its kernels are native
(AVX512-BF16 or AMX, and oneDNN not capped below them), and fp32 where they are emulated:
a fact of the machine, so the same command makes the same run every time. A timing would
not: native bf16 measured from 1.09x to 1.8x fp32 on one machine, minutes apart. Elsewhere
(ARM) the two are timed once, and bf16 is taken only well clear of fp32.
"""

from __future__ import annotations

import functools
import os
import platform
import time

import torch
import torch.nn.functional as F

from .errors import ChargenError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` is CUDA when present, else CPU; ``cuda``/``cuda:N`` and ``mps`` (an Apple
    GPU, asked for by name) must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ChargenError(f"unknown device {name!r}; use auto, cpu, cuda or mps") from None
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ChargenError("--device mps was asked for but this machine has no MPS (an Apple-silicon GPU, with a "
                               "macOS build of torch); use --device cpu")
        return torch.device("mps")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ChargenError("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ChargenError(f"{name}: there are only {torch.cuda.device_count()} CUDA devices")
    elif device.type != "cpu":
        raise ChargenError(f"unsupported device {name!r}; use auto, cpu, cuda or mps")
    return device


def wide_dtype(device: torch.device | str) -> torch.dtype:
    """The widest float of ``device``, for sums and random draws: float64, but float32 on
    MPS (Apple GPUs have no float64)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Where the kernels cannot be told apart (not x86), auto takes bf16 on a CPU only where it
# trains at least this much faster than fp32: well clear of the noise of a timing (one
# machine's native bf16 timed 1.09x to 1.8x), and of emulated bf16 (0.25x).
MIN_BF16_SPEEDUP = 1.5
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) that keep its native bf16 kernels, by name.
BF16_ISA_MARKS = ("BF16", "AMX", "FP16", "AVX10", "ALL", "DEFAULT")


def _lstm_step(device: torch.device, dtype: torch.dtype | None, hidden: int, batch: int, steps: int) -> float:
    """One training step of a small embedding -> LSTM -> head under autocast to ``dtype``
    (None: fp32): forward, loss, backward. Returns the loss; raises what the kernels raise.
    The caller's random state is left as it was: a probe must not change what a seeded run draws."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(16, hidden, 2).to(device)
        head = torch.nn.Linear(hidden, 32).to(device)
        x = torch.randn(steps, batch, 16).to(device)
        y = torch.randint(0, 32, (steps * batch,)).to(device)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out, _ = lstm(x)
            logits = head(out)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y)
        loss.backward()
        return loss.item()


@functools.cache
def autocast_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when an LSTM trains under autocast to ``dtype`` on ``device`` (tried once per
    process: a forward and backward of a tiny one); otherwise what went wrong, in one line."""
    try:
        loss = _lstm_step(device, dtype, hidden=8, batch=2, steps=3)
    except (RuntimeError, NotImplementedError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return first.split(". Run workload with")[0]  # (oneDNN appends advice on its verbose mode)
    if loss != loss or abs(loss) == float("inf"):
        return f"a test step gave a loss of {loss}"
    return None


@functools.cache
def bf16_speedup(device: torch.device) -> float:
    """How much faster a small LSTM (2x256, 32 streams of 32) trains under bf16 autocast
    than in fp32 on ``device``: the best of a few timed steps each, after a warm-up."""
    def best_time(dtype: torch.dtype | None) -> float:
        times = []
        for _ in range(4):
            start = time.perf_counter()
            _lstm_step(device, dtype, hidden=256, batch=32, steps=32)
            times.append(time.perf_counter() - start)
        return min(times[1:])

    return best_time(None) / best_time(torch.bfloat16)


def cpu_bf16_kernels() -> tuple[str | None, str]:
    """``native`` or ``emulated``: what oneDNN's bf16 kernels are on this x86 CPU, and why
    (its flags, and the ISA cap ``ONEDNN_MAX_CPU_ISA`` where one is set); None off x86."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return None, ""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    if not any(mark in cap for mark in BF16_ISA_MARKS):
        return "emulated", f"oneDNN is capped at {cap} (ONEDNN_MAX_CPU_ISA)"
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return "native", "AVX512-BF16" + (" and AMX" if torch.cpu._is_amx_tile_supported() else "")
    return "emulated", "no AVX512-BF16 or AMX"


def bf16_is_native(device: torch.device) -> bool:
    """Whether a GPU multiplies bf16 natively (Ampere and later), not by emulation."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # older torch: no emulation to tell apart
        return torch.cuda.is_bf16_supported()


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    """The autocast dtype for training (None for plain fp32), and a note for the start-up
    line saying what was chosen and, for ``auto``, why. An explicit precision the machine
    cannot run is refused. Weights and optimizer state stay fp32 either way; fp16 is for
    GPUs without bf16, and its gradients are scaled against underflow."""
    if name not in PRECISIONS:
        raise ChargenError(f"--precision must be one of {', '.join(PRECISIONS)}, not {name!r}")
    where = {"cuda": "this GPU", "mps": "this GPU (MPS)"}.get(device.type, "this CPU")
    if name == "fp32":
        return None, "fp32"
    if name == "fp16" and device.type != "cuda":  # oneDNN's CPU LSTM has no fp16 kernel
        raise ChargenError("--precision fp16 is for CUDA GPUs; on the CPU use --precision auto (the fastest that "
                           "runs here) or fp32")
    if name in DTYPES:
        problem = autocast_problem(device, DTYPES[name])
        if problem:
            raise ChargenError(f"--precision {name} does not run on {where} ({problem}); "
                               "use --precision auto or fp32")
        return DTYPES[name], f"{name} autocast"
    # auto
    problem = autocast_problem(device, torch.bfloat16)
    if problem:
        return None, f"fp32: bf16 autocast does not run on {where}: {problem}"
    if device.type == "cuda":
        if not bf16_is_native(device):
            return None, f"fp32: {where} has no native bf16"
        return torch.bfloat16, "bf16 autocast"
    if device.type == "mps":  # (bf16 where its kernels run: macOS 14 and later; else fp32 above)
        return torch.bfloat16, "bf16 autocast"
    kernels, why = cpu_bf16_kernels()
    if kernels == "native":
        return torch.bfloat16, f"bf16 autocast: {where} has native bf16 kernels ({why})"
    if kernels == "emulated":
        return None, f"fp32: {where} has no native bf16 kernels ({why})"
    speedup = bf16_speedup(device)
    if speedup < MIN_BF16_SPEEDUP:
        return None, f"fp32: bf16 autocast timed at {speedup:.2f}x the speed of fp32 on {where} (bf16 from " \
                     f"{MIN_BF16_SPEEDUP:g}x)"
    return torch.bfloat16, f"bf16 autocast: timed at {speedup:.1f}x the speed of fp32 on {where}"
