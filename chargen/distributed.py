"""Training across processes with torchrun: torch.distributed DDP, gloo on CPU, nccl on GPU.

    torchrun --standalone --nproc_per_node=2 -m chargen train corpora/shakespeare.txt

torchrun starts one process per rank and sets RANK, WORLD_SIZE, LOCAL_RANK and the
rendezvous address; ``from_environment`` joins the group. ``--batch-size`` stays the
global batch: each rank trains its own contiguous block of the streams, DDP averages the
gradients (so a step is the step of one process over the global batch), validation sums
are added up across ranks, and only rank 0 writes the run folder. Every rank takes every
decision that changes the plan (stop, refit to --max-time) from the same agreed values.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import ChargenError


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training processes (one of one when not distributed)."""

    rank: int = 0
    world: int = 1
    joined: bool = False  # in a process group (torchrun), even one of one

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes files, logs and shows progress."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Whether the ranks talk: DDP, sums and agreement run, even for one process."""
        return self.joined or self.world > 1

    def block(self, n: int) -> slice:
        """This rank's contiguous block of ``n`` (a multiple of the world size) streams."""
        size = n // self.world
        return slice(self.rank * size, (self.rank + 1) * size)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over all ranks (on every rank)."""
        if self.active:
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def any(self, flags: tuple[bool, ...], device: torch.device) -> tuple[bool, ...]:
        """Each flag True on every rank if it is True on any (one sync for all of them)."""
        if not self.active:
            return flags
        values = torch.tensor([1.0 if flag else 0.0 for flag in flags], device=device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return tuple(bool(v) for v in values.tolist())

    def from_main(self, value: int, device: torch.device) -> int:
        """Rank 0's ``value``, on every rank."""
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.long, device=device)
        dist.broadcast(tensor, src=0)
        return int(tensor.item())

    def gather_streams(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's (layers, streams, hidden) block of the carried state, joined in rank
        order into the state of all the streams (on every rank)."""
        if not self.active:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=1)

    def check_on_main(self, check: Callable[[], object]) -> None:
        """Run ``check`` (a refusal is a ChargenError) on rank 0 alone, and raise its error on
        every rank, so that no rank goes on to wait for one that stopped."""
        error = None
        if self.main:
            try:
                check()
            except ChargenError as e:
                error = str(e)
        if self.active:
            message = [error]
            dist.broadcast_object_list(message, src=0)
            error = message[0]
        if error:
            raise ChargenError(error)


SINGLE = Ranks()
BACKENDS = ("nccl", "gloo")
SETTLE_SECONDS = 0.1  # the GIL left free after leaving, for gloo's workers (see leave)


def from_environment(device: str = "auto") -> tuple[Ranks, str]:
    """Join the process group torchrun set up (if it did), and the device for this rank:
    ``cuda:LOCAL_RANK`` with nccl where CUDA is asked for or automatic and present, else
    the CPU with gloo. Under torchrun the group is joined whatever the number of processes,
    so one process runs the same distributed code as many.

    ``CHARGEN_DIST_BACKEND=gloo`` lets more processes than GPUs share them (round robin);
    nccl needs a GPU of its own for each process."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:  # not started by torchrun
        return SINGLE, device
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    backend = os.environ.get("CHARGEN_DIST_BACKEND") or ("nccl" if use_cuda else "gloo")
    if backend not in BACKENDS:
        raise ChargenError(f"CHARGEN_DIST_BACKEND must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if use_cuda:
        gpus, per_machine = torch.cuda.device_count(), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if backend == "nccl" and per_machine > gpus:
            raise ChargenError(f"{per_machine} processes on this machine share {gpus} GPU(s), and nccl needs one "
                               f"each; use --nproc_per_node={gpus}, or CHARGEN_DIST_BACKEND=gloo to share them")
        local %= gpus
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    elif device == "auto":
        device = "cpu"
    if backend == "nccl" and not use_cuda:
        raise ChargenError("CHARGEN_DIST_BACKEND=nccl needs CUDA GPUs; unset it to train on the CPU with gloo")
    if not dist.is_initialized():
        join_group(backend, rank, world)
    return Ranks(rank, world, joined=True), device


def join_group(backend: str, rank: int, world: int) -> None:
    """``init_process_group`` on the store torchrun's workers share. torchrun's agent keeps
    one store for all its workers' attempts by default, and after a restart
    (``--max-restarts``) it still held the dead attempt's addresses under the same keys: a
    rank that read one failed to connect ("Gloo connectFullMesh failed ... Connection
    refused", in about 1 restart in 4 here). On one machine (one agent) each attempt's keys go
    apart, under the attempt's number (TORCHELASTIC_RESTART_COUNT, which that agent sets for
    all its workers). Agents on several machines count their restarts apart (a restart for a
    new member is not counted), so there the attempts cannot be named alike: with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 every attempt gets a new store instead (see
    ``shared_store_advice``)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or several_agents():
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
        return
    store, _, _ = next(dist.rendezvous("env://"))  # (torchrun's own store, as init_process_group finds it)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"chargen/attempt-{attempt}", store), rank=rank,
                            world_size=world)


def several_agents() -> bool:
    """Whether torchrun runs on several machines (an agent each: GROUP_WORLD_SIZE of them)."""
    return os.environ.get("GROUP_WORLD_SIZE", "1") != "1"


def shared_store_advice() -> str | None:
    """A line for a job on several machines whose restarts would share one store (above)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and several_agents():
        return ("torchrun on several machines: export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun on each, "
                "so that a restart (--max-restarts) starts with a store of its own (docs/training.md)")
    return None


def leave(finished: bool = False) -> None:
    """Leave the process group, so that the process can exit cleanly.

    gloo's worker threads let go of a collective's tensors only after the caller has its
    result, and letting go takes the GIL. A worker that reaches for it once the interpreter
    has begun to shut down aborts the process ("terminate called without an active
    exception"; the last collective before exit, in about 1 run in 10 of a script whose
    last call was an all_gather). So after a finished run the ranks first meet at a barrier
    (its wait leaves the GIL free), and after leaving, the GIL stays free a moment more for
    any worker still letting go."""
    if dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()
        time.sleep(SETTLE_SECONDS)
