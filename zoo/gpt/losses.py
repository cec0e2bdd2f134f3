"""The causal language-modelling objective."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # targets at padding (and any position not to be learned) carry this


def causal_lm_loss(logits: Tensor, targets: Tensor) -> dict[str, Tensor]:
    """Mean next-token cross-entropy over the positions whose target is not IGNORE_INDEX.

    ``logits`` (B, T, V) predict ``targets`` (B, T), already shifted: targets[:, t] is the token after
    input t. Autocast runs cross-entropy in fp32, so bf16 logits lose nothing here. ``tokens`` is how
    many positions counted, to weight means over batches of different padding.
    """
    flat_targets = targets.reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat_targets, ignore_index=IGNORE_INDEX)
    return {"loss": loss, "tokens": (flat_targets != IGNORE_INDEX).sum()}
