"""Several processes, one training run: torchrun, DistributedDataParallel and what ranks must share.

``torchrun --nproc_per_node=N -m captioner train CONFIG`` starts N processes with ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` in their environment; :func:`setup` joins them into one process group
(NCCL when they train on GPUs, gloo on CPU) and gives each its device (``cuda:LOCAL_RANK``). A plain
``captioner train`` is a world of one: every helper here is then a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from captioner.core.devices import resolve_device
from captioner.errors import CaptionerError


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, writes checkpoints and prints."""
        return self.rank == 0


def setup(device_name: str) -> tuple[World, torch.device]:
    """The world this process belongs to (from torchrun's environment) and the device it trains on."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(device_name)
    if size == 1:
        return World(), device
    world = World(rank=int(os.environ["RANK"]), size=size, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        if world.local_rank >= torch.cuda.device_count():
            raise CaptionerError(f"LOCAL_RANK {world.local_rank}: this machine has {torch.cuda.device_count()} GPU(s)")
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return world, device


def teardown(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def all_sum(values: list[float], world: World, device: torch.device) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (the values themselves in a world of one)."""
    if not world.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def merge_dicts(local: dict, world: World) -> dict:
    """The union of every rank's ``local`` dict (picklable values), on every rank."""
    if not world.distributed:
        return local
    parts: list = [None] * world.size
    dist.all_gather_object(parts, local)
    return {key: value for part in parts for key, value in part.items()}


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()
