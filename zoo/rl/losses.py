"""Objectives as pure functions: generalised advantage estimation, PPO's and A2C's loss terms, SAC's target and losses.

Notation: T steps, N envs, B minibatch rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.train.policy_gradient import normalize as normalize  # re-exported: PPO's and A2C's, shared with GRPO


def gae(
    rewards: Tensor, values: Tensor, terminated: Tensor, truncated: Tensor, gamma: float, gae_lambda: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016): (advantages (T, N), returns (T, N)).

    One reverse scan over time, vectorised over envs:
        delta_t = r_t + gamma * V(s_{t+1}) * (1 - terminated_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},    done_t = terminated_t or truncated_t
    ``values`` is (T + 1, N) and ``values[t + 1]`` is the value of the observation step t returned. Under
    next-step autoreset that is the episode's final observation when step t ended it, so a time-limit
    truncation bootstraps from V(final observation) while a termination bootstraps from nothing, and the
    lambda-trace stops at both. Steps that are autoreset steps produce values here that the loss must mask.
    Returns are the lambda-returns A_t + V(s_t), the value targets.
    """
    not_terminal = (~terminated).to(rewards.dtype)
    deltas = rewards + gamma * values[1:] * not_terminal - values[:-1]  # (T, N) every TD error at once
    decay = gamma * gae_lambda * (~(terminated | truncated)).to(rewards.dtype)  # (T, N)
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(deltas[0])  # (N,)
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = torch.addcmul(deltas[t], decay[t], running)
        advantages[t] = running
    return advantages, advantages + values[:-1]


def ppo_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    value: Tensor,
    old_value: Tensor,
    returns: Tensor,
    entropy: Tensor,
    clip_coef: float = 0.2,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    clip_vloss: bool = False,
) -> dict[str, Tensor]:
    """PPO-clip (Schulman et al. 2017) on (B,) tensors: the named terms, diagnostics, and their sum "loss".

    loss = pg_loss - ent_coef * entropy + vf_coef * v_loss, with
        pg_loss = mean(max(-A * r, -A * clip(r, 1 - eps, 1 + eps))),   r = pi(a|s) / pi_old(a|s)
        v_loss  = 0.5 * mean((V - R)^2), or with ``clip_vloss`` the max of that and the error of V clipped to
                  within clip_coef of the old value (Baselines' PPO2; CleanRL's ``clip_vloss``).
    ``approx_kl`` is the low-variance estimator mean((r - 1) - log r) (Schulman 2020, "Approximating KL
    Divergence"); ``clipfrac`` the fraction of rows whose ratio was clipped.
    """
    logratio = logprob - old_logprob
    ratio = logratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((value - returns).square(), (clipped - returns).square()).mean()
    else:
        v_loss = 0.5 * (value - returns).square().mean()
    entropy = entropy.mean()
    loss = pg_loss - ent_coef * entropy + vf_coef * v_loss
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1).abs() > clip_coef).float().mean()
    return {
        "loss": loss,
        "pg_loss": pg_loss,
        "v_loss": v_loss,
        "entropy": entropy,
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


def a2c_loss(
    logprob: Tensor,
    advantages: Tensor,
    value: Tensor,
    returns: Tensor,
    entropy: Tensor,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
) -> dict[str, Tensor]:
    """Advantage actor-critic (Mnih et al. 2016, synchronous as in OpenAI Baselines' A2C) on (B,) tensors.

    loss = pg_loss - ent_coef * entropy + vf_coef * v_loss, with
        pg_loss = -mean(A * log pi(a|s))      (A is a constant: the gradient flows through log pi only)
        v_loss  = mean((V - R)^2)             (Baselines' and SB3's A2C: no factor 1/2, vf_coef 0.5)
    Its gradient is PPO's at probability ratio 1 (one epoch on fresh data never clips), with PPO's
    ``vf_coef`` twice this one's, since ``ppo_loss`` halves the squared error.
    """
    pg_loss = -(advantages.detach() * logprob).mean()
    v_loss = (value - returns).square().mean()
    entropy = entropy.mean()
    loss = pg_loss - ent_coef * entropy + vf_coef * v_loss
    return {"loss": loss, "pg_loss": pg_loss, "v_loss": v_loss, "entropy": entropy}


def explained_variance(pred: Tensor, target: Tensor) -> Tensor:
    """1 - Var(target - pred) / Var(target): 1 for a perfect value function, <= 0 for a useless one."""
    var = target.var()
    return 1 - (target - pred).var() / var if var > 0 else torch.full_like(var, float("nan"))


# -- soft actor-critic -----------------------------------------------------------------------------------
# Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications" (the version with a learned
# temperature). K critics, B transitions; CleanRL's sac_continuous_action.py and SB3's SAC.train name the terms.


def soft_q_target(
    rewards: Tensor, terminated: Tensor, next_q: Tensor, next_logprob: Tensor, alpha: Tensor | float, gamma: float
) -> Tensor:
    """The soft Bellman target (B,): y = r + gamma * (1 - terminated) * (min_k Q_targ_k(s', a') - alpha log pi(a'|s')).

    ``next_q`` (K, B) are the target critics at (s', a'), a' ~ pi(.|s') drawn afresh; the minimum over the
    critics is clipped double Q (Fujimoto et al. 2018). Only a termination drops the bootstrap: a time-limit
    truncation's s' is the real final observation and is bootstrapped from (``zoo.rl.replay``).
    """
    soft_value = next_q.min(0).values - alpha * next_logprob  # (B,) V(s') = E[min Q - alpha log pi]
    return rewards + gamma * (1.0 - terminated) * soft_value


def sac_critic_loss(q: Tensor, target: Tensor) -> dict[str, Tensor]:
    """Each critic regressed on the (fixed) target: loss = 1/2 sum_k mean_B (Q_k - y)^2, as SB3's critic_loss.

    ``q`` (K, B) are the critics at the stored (s, a); ``target`` (B,) carries no gradient.
    """
    per_critic = (q - target.detach()).square().mean(1)  # (K,)
    terms = {f"qf{k + 1}_loss": loss for k, loss in enumerate(per_critic.detach().unbind())}
    return {"loss": 0.5 * per_critic.sum(), **terms, "q_value": q.detach().mean()}


def sac_actor_loss(logprob: Tensor, q_pi: Tensor, alpha: Tensor | float) -> dict[str, Tensor]:
    """The policy's KL projection (Haarnoja et al. 2018, eq. 7): loss = mean(alpha log pi(a|s) - min_k Q_k(s, a)).

    ``logprob`` (B,) and ``q_pi`` (K, B) belong to reparameterised actions a ~ pi(.|s), so the gradient reaches
    the actor through both; ``alpha`` is a constant here.
    """
    min_q = q_pi.min(0).values  # (B,)
    loss = (alpha * logprob - min_q).mean()
    return {"loss": loss, "entropy": -logprob.detach().mean(), "q_pi": min_q.detach().mean()}


def sac_temperature_loss(log_alpha: Tensor, logprob: Tensor, target_entropy: float) -> dict[str, Tensor]:
    """Automatic temperature (Haarnoja et al. 2018, eq. 18): loss = -mean(log alpha * (log pi + H_target)).

    Gradient descent raises alpha while the policy's entropy -log pi is below ``target_entropy`` and lowers it
    above. Optimised in log alpha, as SB3 and softlearning do (softlearning issue 37; CleanRL multiplies by
    alpha instead); the log-probabilities are detached so that this loss moves alpha only.
    """
    loss = -(log_alpha * (logprob.detach() + target_entropy)).mean()
    return {"loss": loss, "alpha": log_alpha.detach().exp()}
