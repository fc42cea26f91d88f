"""What a training run will take in memory, and what the machine has, so that a model too
big for it is refused with figures before anything is built (instead of the allocator's
traceback, or the kernel's OOM killer an hour in).

The estimate, in fp32 bytes (autocast only shrinks the activations):

- the model's state: weights, gradients and AdamW's two moments are 4 copies of the
  parameters, and the fused optimizer step and gradient clipping take about one more;
- a checkpoint copies the weights and moments to the CPU, hashes and serializes them: about
  9 more copies, for a moment, in host memory, between steps;
- activations, per position of a batch (``time x batch``) kept for the backward pass: the
  embedding, the LSTM's gates and states in each layer (oneDNN's and cuDNN's workspaces),
  and the logits with their softmax and gradient;
- on a CPU, about 96 MB that training adds for any model (oneDNN, autograd, threads).

The factors were fitted to the peak resident memory of real training runs on a CPU
(``python -m benchmarks.memory_estimate``): the estimate came out between 0.97 and 1.6 times
the measurement, over models from 1x256 to 2x1024 and vocabularies up to 3,000.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ChargenError
from .model import ModelConfig

STATE_COPIES = 5  # weights, gradients, 2 AdamW moments, and the optimizer's temporaries
CHECKPOINT_COPIES = 9  # weights and moments cloned to the CPU, hashed and serialized
# fp32 values kept per position of a batch: per embedding unit; per hidden unit of the first
# LSTM layer and of each further one; per vocabulary entry (logits, log-softmax, gradient).
PER_EMBEDDING, PER_HIDDEN_FIRST, PER_HIDDEN_MORE, PER_VOCAB = 3, 22, 12, 3
LOAD_COPIES = 3  # loading a model: the file's tensors, the model, the sampler's packed weights
RUNTIME_CPU = 96 * 2**20  # what training adds on a CPU for any model: oneDNN, autograd, threads


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes a training run needs on its device, by part."""

    parameters: int
    state: int  # weights, gradients, optimizer moments and temporaries
    checkpoint: int  # host memory while a checkpoint is written
    activations: int  # for the largest batch
    batch: tuple[int, int]  # (time, batch) of that batch

    def on(self, device: torch.device) -> int:
        """The peak on ``device``: on a CPU the checkpoint copies share the same memory (at a
        checkpoint the activations are already freed); on a GPU they are host memory."""
        if device.type == "cpu":
            return RUNTIME_CPU + self.state + max(self.activations, self.checkpoint)
        return self.state + self.activations


def parameter_count(config: ModelConfig) -> int:
    """The parameters of a model of ``config``, without building it."""
    h, e, v, layers = config.hidden, config.embedding, config.vocab_size, config.layers
    return v * e + 4 * h * (e + h + 2) + (layers - 1) * 4 * h * (2 * h + 2) + v * (h + 1)


def estimate(config: ModelConfig, time_steps: int, batch: int) -> TrainingMemory:
    """The memory a training step of ``config`` takes on batches of ``time_steps x batch``."""
    h, e, v, layers = config.hidden, config.embedding, config.vocab_size, config.layers
    params = parameter_count(config)
    per_position = PER_EMBEDDING * e + PER_HIDDEN_FIRST * h + PER_HIDDEN_MORE * h * (layers - 1) + PER_VOCAB * v
    return TrainingMemory(
        parameters=params,
        state=4 * params * STATE_COPIES,
        checkpoint=4 * params * CHECKPOINT_COPIES,
        activations=4 * per_position * time_steps * batch,
        batch=(time_steps, batch),
    )


def _meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What a container's memory limit leaves (cgroup v2, else v1); None without a limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's huge "no limit"
            return max(0, int(limit) - usage)
    return None


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new run on ``device``: a GPU's free memory, or on the CPU what
    /proc/meminfo and a container's limit leave (psutil elsewhere); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    found = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    if not found:
        try:
            import psutil
        except ImportError:
            return None
        found = [psutil.virtual_memory().available]
    # Processes of one torchrun on this machine share its memory.
    return min(found) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def check_loadable(config: ModelConfig, device: torch.device) -> None:
    """Refuse, before anything is allocated, a model (as a folder's config.json describes
    it) that ``device`` cannot hold while it is read: the file's tensors, the model, and the
    sampler's packed copy of its weights."""
    need, available = 4 * parameter_count(config) * LOAD_COPIES, available_bytes(device)
    if available is not None and need > available:
        raise ChargenError(f"loading this {config.layers}x{config.hidden} model ({parameter_count(config):,} "
                           f"parameters) needs about {size_text(need)}, but this machine has {size_text(available)} "
                           "free; is its config.json right?")


def size_text(n: float) -> str:
    if n >= 2**29:
        return f"{n / 2**30:,.1f} GB"
    return f"{n / 2**20:,.0f} MB" if n >= 10 * 2**20 else f"{n / 2**20:,.1f} MB"


def check_fits(need: TrainingMemory, device: torch.device, available: int | None) -> None:
    """Refuse a run whose estimate exceeds ``available`` bytes, saying what to lower."""
    total = need.on(device)
    if available is None or total <= available:
        return
    where = "this GPU has" if device.type == "cuda" else "this machine has"
    time_steps, batch = need.batch
    parts = [f"{size_text(need.state)} for the weights, gradients and AdamW state of {need.parameters:,} parameters",
             f"{size_text(need.activations)} of activations for batches of {batch} x {time_steps}"]
    if device.type == "cpu" and need.checkpoint > need.activations:
        parts[1] = f"{size_text(need.checkpoint)} to write a checkpoint"
    advice = "lower --hidden or --layers" if need.state > need.activations else \
        "lower --batch-size or --bptt (or --hidden)"
    raise ChargenError(f"training this model needs about {size_text(total)} ({', '.join(parts)}) but {where} "
                       f"{size_text(available)} free; {advice}")
