"""Choosing the device once, at the edge, so nothing below reads globals."""

from __future__ import annotations

import torch

from .errors import ChargenError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` is CUDA when present, else CPU; ``cuda``/``cuda:N`` must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ChargenError(f"unknown device {name!r}; use auto, cpu or cuda") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ChargenError("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ChargenError(f"{name}: there are only {torch.cuda.device_count()} CUDA devices")
    elif device.type != "cpu":
        raise ChargenError(f"unsupported device {name!r}; use auto, cpu or cuda")
    return device


PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def native_bf16(device: torch.device) -> bool:
    """Whether the hardware multiplies bf16 natively (so bf16 autocast is a speedup, not
    an emulated slowdown): Ampere+ GPUs, or CPUs with AVX512-BF16 or AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for training, or None for plain fp32. ``auto`` picks bf16 where
    the hardware has it (weights and optimizer state stay fp32 either way); fp16 is for
    GPUs without bf16, and its gradients are scaled against underflow."""
    if name not in PRECISIONS:
        raise ChargenError(f"--precision must be one of {', '.join(PRECISIONS)}, not {name!r}")
    if name == "fp16" and device.type != "cuda":  # oneDNN's CPU LSTM has no fp16 kernel
        raise ChargenError("--precision fp16 is for CUDA GPUs; on the CPU use bf16 or fp32")
    if name == "fp32" or (name == "auto" and not native_bf16(device)):
        return None
    return torch.float16 if name == "fp16" else torch.bfloat16
