"""Data-parallel `lara train` on torch.distributed (gloo on CPU): `torchrun --nproc_per_node N -m lara_serve.clients train ...`.

Every process builds the same model (same seed) and draws the same batch plan (same seeds); each takes
every N-th example of each batch, and the gradients are summed over processes with each process's loss
weighted by its share of the batch, so a step moves the weights as one process would with the whole batch
(up to float summation order, per-process dropout/noise draws and BatchNorm statistics). Clock readings
are reduced too (max), so every process takes the same learning rate and stops at the same step.
Only process 0 writes: checkpoints, the model folder, the report.

Across machines: `torchrun --nnodes M --node_rank R --master_addr HOST --master_port PORT --nproc_per_node N
-m lara_serve.clients train DATA --out DIR` on each machine, DATA at the same path everywhere; DIR is written by the
machine of rank 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True)
class Group:
    """This process's place: rank in 0..world-1. world == 1 is a plain single-process run."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, inputs: dict[str, Tensor], labels: Tensor) -> tuple[dict[str, Tensor], Tensor, float]:
        """This process's examples of a batch (every world-th from rank) and their share of the batch."""
        if self.world == 1:
            return inputs, labels, 1.0
        idx = torch.arange(self.rank, len(labels), self.world)
        return {k: v[idx] for k, v in inputs.items()}, labels[idx], len(idx) / max(len(labels), 1)

    def share(self, obj: object) -> object:
        """Process 0's `obj` in every process (what each read of the machine may see differently)."""
        if self.world == 1:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def reduce_gradients(self, model: nn.Module) -> None:
        """Sum the (share-weighted) gradients of all processes, in one flat buffer (one collective)."""
        if self.world == 1:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def reduce_step(self, correct: int, loss_sum: float, seen: int, seconds: float, stop: bool) -> tuple:
        """Summed (correct, loss_sum, seen) of the step, the slowest clock, and stop if any process stops."""
        if self.world == 1:
            return correct, loss_sum, seen, seconds, stop
        sums = torch.tensor([correct, loss_sum, seen], dtype=torch.float64)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        maxes = torch.tensor([seconds, float(stop)], dtype=torch.float64)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        return int(sums[0]), float(sums[1]), int(sums[2]), float(maxes[0]), bool(maxes[1])


def setup() -> Group:
    """The group torchrun describes in the environment (WORLD_SIZE, RANK, MASTER_ADDR...), else one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Group()
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")  # training runs on the CPU: gloo (NCCL is for CUDA tensors)
    return Group(dist.get_rank(), dist.get_world_size())


def teardown(group: Group) -> None:
    if group.world > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
