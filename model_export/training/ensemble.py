"""An ensemble of independently trained classifiers: the mean of their class probabilities.

Why: two models trained from different seeds get different documents wrong, most of all documents whose
evidence is thin (the first KB of an article that reads as another topic), where the seed decides which
side of the boundary they fall. Averaging the members' probabilities removes part of that seed noise
without changing any member.

The output is the log of the mean probability (computed as a log-sum-exp of the members' log-softmax, so
it never underflows to -inf): logits whose softmax is exactly the members' mean probability and whose
argmax is the ensemble's vote.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn


class ProbabilityMean(nn.Module):
    """Mean of the members' softmax probabilities, returned as log-probabilities [B, C]."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 members, got {len(members)}")
        self.members = nn.ModuleList(members)

    def forward(self, *inputs: Tensor, **named_inputs: Tensor) -> Tensor:
        logp = torch.stack([torch.log_softmax(m(*inputs, **named_inputs).float(), dim=-1) for m in self.members])
        return torch.logsumexp(logp, dim=0) - math.log(len(self.members))
