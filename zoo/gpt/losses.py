"""The causal language-modelling objective: next-token cross-entropy, multi-token prediction, router terms."""

from __future__ import annotations

import torch
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


def mtp_loss(mtp_logits: list[Tensor], targets: Tensor) -> dict[str, Tensor]:
    """Multi-token prediction's losses (DeepSeek-V3 eq. 24-25): L_k for each depth k and their mean (1/D sum_k L_k).

    ``mtp_logits[k-1]`` (B, T-k, V) at position i predicts token t_{i+k+1}, which is ``targets[:, i+k]`` of the
    next-token targets (B, T) (targets[:, t] is the token after input t). ``tokens_{k}`` counts each depth's
    positions, to weight means over batches as ``causal_lm_loss`` does.
    """
    out, present = {}, []
    for k, logits in enumerate(mtp_logits, 1):
        if logits.shape[1] == 0:  # T <= k: no position of this depth has a target (cross-entropy's mean is 0/0)
            out[f"loss_{k}"], out[f"tokens_{k}"] = logits.sum(), targets.new_zeros(())
            continue
        depth = causal_lm_loss(logits, targets[:, k:])
        out[f"loss_{k}"], out[f"tokens_{k}"] = depth["loss"], depth["tokens"]
        present.append(out[f"loss_{k}"])
    # 1/D over the depths that had positions (the net leaves out a depth k >= T); none at all (T = 1) adds nothing
    out["loss"] = sum(present) / len(present) if present else targets.new_zeros((), dtype=torch.float32)
    return out


def causal_lm_objective(
    logits: Tensor,
    targets: Tensor,
    mtp_logits: list[Tensor] | None = None,
    aux_terms: list[Tensor] = (),
    mtp_weight: float = 0.3,
) -> dict[str, Tensor]:
    """The training loss and its named terms: L = L_main + lambda * (1/D sum_k L_k) + sum of the MLPs' auxiliary terms.

    DeepSeek-V3 eq. 25 adds the multi-token prediction losses (``mtp_logits``, each depth's as in ``mtp_loss``;
    None for a net without MTP) weighted by ``mtp_weight`` lambda; ``aux_terms`` are what the MLPs returned beside
    their outputs (a softmax-routed mixture of experts' balance term, Switch eq. 4, already times its coefficient).
    Returns "loss" and, where present, "mtp_loss", "mtp_loss_{k}" per depth and "aux_loss" (their sum).
    """
    out = {"loss": causal_lm_loss(logits, targets)["loss"]}
    if mtp_logits is not None:
        mtp = mtp_loss(mtp_logits, targets)
        out["loss"] = out["loss"] + mtp_weight * mtp["loss"]
        out["mtp_loss"] = mtp["loss"]
        out |= {f"mtp_loss_{k}": mtp[f"loss_{k}"] for k in range(1, len(mtp_logits) + 1)}
    if aux_terms:
        out["aux_loss"] = sum(aux_terms)
        out["loss"] = out["loss"] + out["aux_loss"]
    return out
