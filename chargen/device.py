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
