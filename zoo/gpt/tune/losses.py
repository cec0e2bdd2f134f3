"""Post-training's objectives: DPO's preference loss and GRPO's policy gradient on sampled completions."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.losses import IGNORE_INDEX
from zoo.train.policy_gradient import (
    LossType,
    StepCredit,
    clipped_surrogate,
    group_advantages,
    process_advantages,
    truncated_importance_weights,
)


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


@dataclass(frozen=True)
class GRPOLoss:
    """GRPO's objective: the advantages of a batch of scored completions and the clipped surrogate on their tokens.

    ``model.init_args.loss`` in a config (``{loss_type: dapo, clip_high: 0.28}``; a field left out keeps its
    default); each name is the one ``zoo.train.policy_gradient`` gives the same quantity (TRL's in brackets where it
    differs). An advantage option is a field here and the method that reads it; the module hands in the group size G
    (``GRPOModule``'s sampling setting) and the rollouts' token budget.

    Args:
        loss_type: how token losses are averaged (TRL's): grpo, dr_grpo or dapo.
        clip_low: the ratio's clip below 1 (TRL's epsilon).
        clip_high: the ratio's clip above 1 (TRL's epsilon_high); above clip_low: DAPO's clip-higher.
        scale_std: divide the group-centred rewards (and step scores) by the group's std (TRL's scale_rewards;
            false: Dr. GRPO).
        beta: the weight of the k3 KL to the starting weights; 0 builds no reference. With LoRA adapters alone
            training, the reference is the net with its adapters off (no copy), so not with adapter_weights.
        step_credit: with step rewards (``StepReward``), what each token is credited with: "later", the sum of the
            group-normalised scores of the steps ending at or after it (DeepSeekMath's process supervision), or
            "own", its own step's alone (for steps each scored on its own, as ``WorkedLines``).
        rho_bar: the bound of the per-token importance weight min(rho_bar, pi_old / mu) of asynchronous rollouts,
            1 or more (TRL's vllm_importance_sampling_clip_max, whose default this is; V-trace's 1 never weighs a
            token up).
    """

    loss_type: LossType = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    scale_std: bool = True
    beta: float = 0.0
    step_credit: StepCredit = "later"
    rho_bar: float = 3.0

    def __post_init__(self) -> None:
        # Checked when the config is read, before any model is built or rollout sampled.
        rules = (
            ("loss_type", self.loss_type in ("grpo", "dr_grpo", "dapo"), "grpo, dr_grpo or dapo"),
            ("clip_low", 0 <= self.clip_low < 1, "in [0, 1)"),
            ("clip_high", self.clip_high >= 0, "0 or more"),
            ("beta", self.beta >= 0, "0 or more (0: no KL term)"),
            ("step_credit", self.step_credit in ("later", "own"), "later or own"),
            ("rho_bar", self.rho_bar >= 1, "1 or more"),
        )
        for name, ok, rule in rules:
            if not ok:
                raise InputError(
                    f"model.init_args.loss.{name}={getattr(self, name)!r} must be {rule}: pass "
                    f"--model.init_args.loss.{name}=<such a value>"
                )

    @classmethod
    def of(cls, value: GRPOLoss | dict) -> GRPOLoss:
        """From itself or from its fields as a dict (how checkpoints' hyperparameters carry it)."""
        return value if isinstance(value, cls) else cls(**value)

    def advantages(self, rewards: Tensor, group_size: int, steps: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Each completion's advantage (R,) from its reward (R,), rows in whole groups of ``group_size``; with
        ``steps``, step rewards placed at their steps' last tokens and those tokens' mask (R, T), each token's
        (R, T): the completion's plus its process advantage."""
        advantages = self.outcome(rewards, group_size)
        if steps is not None:
            advantages = advantages[:, None] + self.process(*steps, group_size)
        return advantages

    def outcome(self, rewards: Tensor, group_size: int) -> Tensor:
        """Each reward (R,) against its group's mean, over the group's std when ``scale_std`` (GRPO, Dr. GRPO)."""
        return group_advantages(rewards, group_size, self.scale_std)

    def process(self, step_rewards: Tensor, step_mask: Tensor, group_size: int) -> Tensor:
        """Process supervision's per-token advantages (R, T), credited as ``step_credit`` says."""
        return process_advantages(step_rewards, step_mask, group_size, self.scale_std, credit=self.step_credit)

    def importance_weights(self, logp_old: Tensor, logp_behaviour: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """An asynchronous rollout's per-token weights min(rho_bar, pi_old / mu) (R, T) and which were truncated."""
        return truncated_importance_weights(logp_old, logp_behaviour, mask, self.rho_bar)

    def objective(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        completion_mask: Tensor,
        ref_logp: Tensor | None = None,
        is_weight: Tensor | None = None,
        max_completion_length: int | None = None,
    ) -> dict[str, Tensor]:
        """The loss and TRL's metrics (``zoo.train.policy_gradient.clipped_surrogate``) on completion tokens (R, T):
        ``advantages`` (R,) or (R, T) from ``advantages``, ``ref_logp`` pi_ref's when ``beta`` > 0, ``is_weight``
        (R, T) the truncated importance weights of asynchronous rollouts, ``max_completion_length`` the rollouts'
        token budget (Dr. GRPO's divisor)."""
        return clipped_surrogate(
            logp,
            old_logp,
            advantages,
            self.clip_low,
            self.clip_high,
            completion_mask,
            self.loss_type,
            max_completion_length=max_completion_length,
            ref_logp=ref_logp,
            beta=self.beta,
            is_weight=is_weight,
        )
