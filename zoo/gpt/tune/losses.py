"""Post-training's objectives: DPO's preference loss and GRPO's policy gradient on sampled completions."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from zoo.gpt.losses import IGNORE_INDEX
from zoo.train.policy_gradient import LossType, clipped_surrogate, group_advantages


def sequence_logps(logits: Tensor, targets: Tensor) -> Tensor:
    """log pi(y|x) per row: the targets' log-probabilities summed where they are not -100 (the reply's tokens)."""
    flat = logits.flatten(0, 1).float()  # (B*T, V)
    logp = -F.cross_entropy(flat, targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none")  # 0 where ignored
    return logp.view(targets.shape).sum(-1)  # (B,)


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> dict[str, Tensor]:
    """The sigmoid DPO loss (mean over pairs) with conservative label smoothing, and TRL's logged statistics."""
    chosen_logratios = policy_chosen_logps - ref_chosen_logps.detach()  # (B,) log pi/pi_ref of y_w
    rejected_logratios = policy_rejected_logps - ref_rejected_logps.detach()  # (B,) of y_l
    margin = beta * (chosen_logratios - rejected_logratios)  # (B,) the implicit reward's margin
    losses = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)  # (B,)
    chosen_rewards, rejected_rewards = beta * chosen_logratios.detach(), beta * rejected_logratios.detach()
    return {
        "loss": losses.mean(),
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "logps/chosen": policy_chosen_logps.detach().mean(),
        "logps/rejected": policy_rejected_logps.detach().mean(),
    }


def grpo_objective(
    logp: Tensor,
    old_logp: Tensor,
    rewards: Tensor,
    completion_mask: Tensor,
    group_size: int,
    loss_type: LossType = "grpo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    scale_std: bool = True,
    baseline: Tensor | None = None,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    is_weight: Tensor | None = None,
    token_advantages: Tensor | None = None,
) -> dict[str, Tensor]:
    """GRPO's loss and metrics (``zoo.train.policy_gradient.clipped_surrogate``) on completion tokens (R, T).

    ``rewards`` (R,) come in whole groups of ``group_size`` consecutive rows; each completion's advantage is its
    reward against its group (``group_advantages``; ``scale_std`` False is Dr. GRPO), or, given a ``baseline``
    (R,) such as a value estimate, reward - baseline (with groups of one, PPO's one-step advantage). ``is_weight``
    (R, T): the truncated importance weights of asynchronous rollouts (``clipped_surrogate``).
    ``token_advantages`` (R, T), process supervision's (``process_advantages``), add to each token's advantage.
    """
    if baseline is None:
        advantages = group_advantages(rewards, group_size, scale_std)
    else:
        advantages = rewards - baseline
    if token_advantages is not None:
        advantages = advantages[:, None] + token_advantages
    out = clipped_surrogate(
        logp,
        old_logp,
        advantages,
        clip_low,
        clip_high,
        completion_mask,
        loss_type,
        max_completion_length=max_completion_length,
        ref_logp=ref_logp,
        beta=beta,
        is_weight=is_weight,
    )
    return {**out, "advantages": advantages.detach()}
