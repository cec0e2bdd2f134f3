"""The clipped policy-gradient surrogate and advantage normalisation shared by PPO (``zoo.rl``) and GRPO (``zoo.gpt``).

PPO (Schulman et al. 2017) scores one action per row; GRPO (Shao et al. 2024, DeepSeekMath) scores every token of
a completion with its sequence's advantage, the group-relative reward. One surrogate serves both: PPO is the case
with no mask (every row one "sequence" of one token). The token aggregations follow TRL's ``GRPOTrainer``
(``loss_type``): "grpo" averages each sequence's tokens, then the batch (Shao et al.); "dr_grpo" sums the tokens
and divides by batch * max completion length, removing the length bias (Liu et al. 2025, "Understanding R1-Zero-Like
Training"); "dapo" averages over every token of the batch, and is meant with clip-higher, clip_high > clip_low (Yu
et al. 2025, DAPO).

Notation: B sequences (rows), T completion tokens, G completions per prompt (the group).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossType = Literal["grpo", "dr_grpo", "dapo"]
StepCredit = Literal["later", "own"]


def group_advantages(rewards: Tensor, group_size: int, scale_std: bool = True, eps: float = 1e-4) -> Tensor:
    """Each reward (B,) minus its group's mean, over the group's std + eps when ``scale_std``; groups are
    consecutive runs of ``group_size`` rows (the G completions of one prompt).

    GRPO divides by the std (Bessel-corrected, as TRL's ``nanstd``; eps 1e-4 as TRL); Dr. GRPO does not, since the
    std weights questions that are too easy or too hard more (Liu et al. 2025, section 3.1). A group of one has
    std 0 (TRL's rule), so its advantage is 0. PPO's per-minibatch normalisation is the case of one group.
    """
    grouped = rewards.view(-1, group_size)  # (B / G, G)
    centred = grouped - grouped.mean(1, keepdim=True)
    if scale_std:
        std = grouped.std(1, keepdim=True) if group_size > 1 else torch.zeros_like(centred)
        centred = centred / (std + eps)
    return centred.view_as(rewards)


def process_advantages(
    step_rewards: Tensor,
    step_mask: Tensor,
    group_size: int,
    scale_std: bool = True,
    eps: float = 1e-4,
    credit: StepCredit = "later",
) -> Tensor:
    """Per-token advantages (B, T) from step rewards: process supervision (Shao et al. 2024, section 4.1.3).

    ``step_rewards`` (B, T) holds each step's reward at the token that completes it, ``step_mask`` (B, T) marks
    those tokens. The rewards of all the steps of a group's G completions are normalised together (minus their
    mean, over their std + eps when ``scale_std``, Bessel-corrected as ``group_advantages``). With ``credit``
    "later" (the paper's) a token's advantage is the sum of the normalised rewards of its completion's steps that
    end at or after it; with "own", the normalised reward of its own step alone (the first ending at or after it),
    for steps scored each on its own, whose score a token cannot change by an earlier step (tokens after the last
    step: 0). With one step per completion, at its last token, either is ``group_advantages`` on every token of it.
    """
    b, t = step_rewards.shape
    r, m = step_rewards.reshape(-1, group_size * t), step_mask.reshape(-1, group_size * t).to(step_rewards.dtype)
    n = m.sum(1, keepdim=True)
    centred = (r - (r * m).sum(1, keepdim=True) / n.clamp(min=1.0)) * m
    if scale_std:
        std = ((centred**2).sum(1, keepdim=True) / (n - 1).clamp(min=1.0)).sqrt()
        centred = centred / (std + eps)
    centred = centred.view(b, t)
    if credit == "later":
        return centred.flip(-1).cumsum(-1).flip(-1)
    pos = torch.arange(t, device=centred.device).expand(b, t)
    next_end = torch.where(step_mask, pos, t).flip(-1).cummin(-1).values.flip(-1)  # t: no step ends at or after
    return torch.cat([centred, centred.new_zeros(b, 1)], 1).gather(1, next_end)


def normalize(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Zero mean, unit std over the batch (PPO's per-minibatch advantage normalisation): one group."""
    return group_advantages(x.flatten(), x.numel(), eps=eps).view_as(x)


def clipped_surrogate(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    mask: Tensor | None = None,
    loss_type: LossType = "grpo",
    max_completion_length: int | None = None,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    is_weight: Tensor | None = None,
) -> dict[str, Tensor]:
    """The clipped surrogate "loss" on per-token log-probabilities (B, T) (or (B,) with no mask), and TRL's metrics.

        r_t    = pi(y_t | x, y_<t) / pi_old(y_t | x, y_<t)
        l_t    = -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A) + beta * KL_t
        KL_t   = exp(ref_t - logp_t) - (ref_t - logp_t) - 1      (Schulman's k3 estimator, as TRL; beta 0: none)
    ``advantages`` are one per sequence (B,) or per token; ``mask`` (B, T) marks the completion tokens (1) against
    padding (0), and ``loss_type`` says how the masked l_t are averaged (module docstring); with no mask the loss
    is the plain mean, PPO's. ``max_completion_length`` is Dr. GRPO's constant divisor (default T). ``is_weight``
    (B, T), a behaviour policy's truncated importance weight (``truncated_importance_weights``), multiplies the
    clipped term of each token, not the KL, as TRL applies its ``importance_sampling_ratio``.
    Metrics: "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean" (tokens whose clipping stops
    the gradient, as TRL counts them), "kl" when beta > 0, and PPO's "approx_kl" ((r - 1) - log r) and "clipfrac".
    """
    if advantages.dim() < logp_new.dim():
        advantages = advantages.unsqueeze(-1)  # (B, 1): the sequence's advantage for each of its tokens
    logratio = logp_new - logp_old
    ratio = logratio.exp()
    per_token = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_low, 1 + clip_high))
    if is_weight is not None:
        per_token = per_token * is_weight
    if beta != 0.0:
        delta = ref_logp - logp_new
        kl = delta.exp() - delta - 1
        per_token = per_token + beta * kl
    loss = aggregate(per_token, mask, loss_type, max_completion_length)
    with torch.no_grad():
        low = (ratio < 1 - clip_low) & (advantages < 0)
        high = (ratio > 1 + clip_high) & (advantages > 0)
        out = {
            "loss": loss,
            "clip_ratio/low_mean": masked_mean(low.float(), mask),
            "clip_ratio/high_mean": masked_mean(high.float(), mask),
            "clip_ratio/region_mean": masked_mean((low | high).float(), mask),
            "approx_kl": masked_mean((ratio - 1) - logratio, mask),
            "clipfrac": masked_mean(((ratio - 1 > clip_high) | (1 - ratio > clip_low)).float(), mask),
        }
        if beta != 0.0:
            out["kl"] = masked_mean(kl, mask)
    return out


def truncated_importance_weights(
    logp_old: Tensor, logp_behaviour: Tensor, mask: Tensor, rho_bar: float
) -> tuple[Tensor, Tensor]:
    """Per-token weights (B, T) min(rho_bar, pi_old / mu) for completions sampled by a stale behaviour policy mu,
    and which tokens the bound truncated (B, T) bool (``rho_bar`` >= 1: padding weighs 1 and is never truncated).

    V-trace's rho-bar (Espeholt et al. 2018, eq. 1) applied to each token of an asynchronous rollout, as TRL's
    ``vllm_importance_sampling_mode="token_truncate"`` does: exp((old - behaviour) * mask) clamped above at its
    ``vllm_importance_sampling_clip_max`` (no lower bound), so padding weighs 1. No gradient flows through it.
    """
    with torch.no_grad():
        ratio = ((logp_old - logp_behaviour) * mask).exp()
        return ratio.clamp(max=rho_bar), ratio > rho_bar


def aggregate(per_token: Tensor, mask: Tensor | None, loss_type: LossType, max_completion_length: int | None) -> Tensor:
    """One scalar from per-token losses (B, T), as ``loss_type`` says (module docstring); no mask: the plain mean."""
    if mask is None:
        return per_token.mean()
    mask = mask.to(per_token.dtype)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.shape[0] * (max_completion_length or mask.shape[-1]))
    if loss_type == "dapo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    raise ValueError(f"loss_type must be one of grpo, dr_grpo, dapo, got {loss_type!r}")


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of ``x`` over the tokens ``mask`` marks (all of them with no mask)."""
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)
