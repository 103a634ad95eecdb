"""A text batch past its token budget, trained in pieces: the same gradient, a third of the activations.

The length-mix plan (lara_serve.model_export.training.long_docs.LengthMixTask) closes a batch only once it holds
min_examples windows, so two or three long windows pass the token budget together ([3, 24,580] = 74 K padded
tokens on the State of the Union speeches). Backward keeps every activation of the batch at once: that batch set
the run's peak memory. Here such a batch is cut into runs of consecutive examples of at most the budget's padded
tokens, each cut to its own longest example, and each piece's mean loss is weighted by its share of the
examples, so the summed gradient is the batch's (up to float rounding; dropout draws differ in shape). Measured
on the speeches' 8 largest batches, one thread: peak RSS 2.75 -> 1.77 GiB, CPU 27.9 -> 20.5 s (the >32 MiB
activations of a whole batch are each mapped and page-faulted afresh by glibc: 6.5 s of system time). Freed
memory is handed back before each such batch: over an epoch 2.37 -> 2.10 GiB for +4.5 s of system time (11%).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable

from torch import Tensor, nn

Inputs = dict[str, Tensor]


def split(inputs: Inputs, max_tokens: int | None) -> list[tuple[slice, Inputs]]:
    """(rows, inputs) of each piece of at most `max_tokens` padded tokens (a longer example alone), in order;
    the batch whole when it fits, is not text, or holds one example."""
    ids = inputs.get("input_ids")
    if ids is None or max_tokens is None or ids.numel() <= max_tokens or len(ids) < 2:
        return [(slice(None), inputs)]
    lengths = inputs["attention_mask"].sum(1).tolist()  # right padding: the real length of each example
    runs: list[list[int]] = [[]]
    for i, n in enumerate(lengths):
        if runs[-1] and max(n, *(lengths[j] for j in runs[-1])) * (len(runs[-1]) + 1) > max_tokens:
            runs.append([])
        runs[-1].append(i)
    out = []
    for run in runs:
        rows, width = slice(run[0], run[-1] + 1), int(max(lengths[j] for j in run))
        out.append((rows, {k: v[rows, :width] for k, v in inputs.items()}))
    return out


def release_memory(collect: bool = True) -> None:
    """Give freed memory back to the system: glibc keeps the freed blocks of earlier activations in its arenas,
    resident, and a batch of new shapes lays its own beside them (speeches, one epoch: 0.52 GiB live between
    steps, 2.4 GiB resident). Called before training, before each batch computed in pieces, after each epoch's
    holdout evaluation and before the phases after training. `collect`: a gc pass first (not between steps)."""
    if collect:
        gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def train_step(model: nn.Module, inputs: Inputs, labels: Tensor, loss_fn: Callable[[Tensor, Tensor], Tensor],
               weight: float, max_tokens: int | None) -> tuple[int, float]:  # fmt: skip
    """Forward and backward of one batch, in pieces when it passes max_tokens; gradients accumulate into the
    model's, scaled by `weight` (a process's share of a data-parallel batch). Returns (correct predictions,
    summed loss) over the batch's examples."""
    correct, loss_sum = 0, 0.0
    parts = split(inputs, max_tokens)
    if len(parts) > 1:  # the largest batches: started from the live tensors, not beside freed ones
        release_memory(collect=False)
    for rows, piece in parts:
        y = labels[rows]
        logits = model(**piece)
        loss = loss_fn(logits, y)
        share = weight * len(y) / len(labels)
        (loss * share if share != 1.0 else loss).backward()
        correct += int((logits.argmax(-1) == y).sum())
        loss_sum += loss.item() * len(y)
    return correct, loss_sum
