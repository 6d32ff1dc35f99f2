"""Splitting records over the processes of a ``torchrun`` launch and merging reports.

Under ``torchrun`` (``WORLD_SIZE`` > 1) every process validates the same inputs, folds
the records whose index ``i`` satisfies ``i % world_size == rank`` (round robin, so
that long and short records mix), and sends its summary to rank 0 once all ranks have
finished. Only small Python objects travel, so the process group always uses the
``gloo`` backend, on GPU machines too; each rank folds on ``cuda:<LOCAL_RANK>``.

Only rank 0 checks and locks the output folder (it writes ``summary.json`` and outlives
the other ranks' writes, which end before the final gather); it broadcasts the outcome,
and the other ranks start folding only once the folder is claimed.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any, List, Optional, Sequence

import torch.distributed as dist

# Ranks that finish early wait for the others at the final barrier.
BARRIER_TIMEOUT = datetime.timedelta(hours=48)


@dataclasses.dataclass
class Group:
    """This process's place in the launch (a single process is rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialized: bool = False

    @property
    def is_root(self) -> bool:
        """True on rank 0, which merges and prints the summary."""
        return self.rank == 0


def setup() -> Group:
    """Join the ``torchrun`` process group when launched by it; else a one-process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Group()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    return Group(rank=rank, world_size=world, local_rank=local_rank, initialized=True)


def shard(items: Sequence[Any], group: Group) -> List[Any]:
    """This rank's share of ``items``: every ``world_size``-th one from ``rank``."""
    return list(items[group.rank :: group.world_size])


def gather_to_root(obj: Any, group: Group) -> Optional[List[Any]]:
    """Wait for all ranks, then collect one object per rank on rank 0 (None elsewhere)."""
    if not group.initialized:
        return [obj]
    dist.barrier()
    gathered: Optional[List[Any]] = [None] * group.world_size if group.is_root else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def broadcast_from_root(obj: Any, group: Group) -> Any:
    """Rank 0's ``obj`` on every rank (``obj`` itself for a single process)."""
    if not group.initialized:
        return obj
    box = [obj if group.is_root else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def teardown(group: Group) -> None:
    """Leave the process group (no-op for a single process)."""
    if group.initialized and dist.is_initialized():
        dist.destroy_process_group()
