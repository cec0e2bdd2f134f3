"""V-trace (Espeholt et al. 2018, "IMPALA", section 4): off-policy value targets and policy-gradient advantages
for trajectories that a behaviour policy mu collected while the learner's policy pi moved on, and the IMPALA
loss built on them. Pure functions over (T, N) tensors; the actors and the module live elsewhere.

The recursion, for n-step targets that run to the end of the unroll (the paper's remark 1):
    rho_t   = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))        truncated importance weight of the TD error
    c_t     = lambda * min(c_bar, pi(a_t|x_t) / mu(a_t|x_t))  "trace cutting" weight; lambda as Retrace's (rlax)
    delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_t - V(x_t) = delta_t + gamma_t * c_t * (v_{t+1} - V(x_{t+1}))           one reverse scan over t
    A_t     = min(rho_bar_pg, pi/mu) * (r_t + gamma_t * v_{t+1} - V(x_t))     policy-gradient advantage
With pi = mu, rho_bar, c_bar >= 1 and lambda = 1, v_t is the n-step return (the paper's remark after eq. 1);
with lambda < 1 it is the TD(lambda) return, i.e. GAE's value target (tested against ``zoo.rl.losses.gae``).

Episode boundaries follow gymnasium 1.x's next-step autoreset as ``zoo.rl.losses.gae`` does: ``values[t + 1]``
is V of the observation step t returned, the episode's final observation when step t ended it. A
termination zeroes gamma_t (nothing to bootstrap); a time-limit truncation keeps gamma_t, bootstrapping from
V(final observation) (Pardo et al. 2018), but cuts the trace, and its v_{t+1} in A_t is that value too. The
step after an episode end is a reset, not a transition: the loss masks it (``valid``).

torchbeast's ``vtrace.py`` and DeepMind's ``scalable_agent/vtrace.py`` compute the same quantities with the
bootstrap value passed separately; rlax's ``vtrace`` takes lambda as here.
Notation: T steps per unroll, N trajectories (envs x slots).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class VTrace(NamedTuple):
    vs: Tensor  # (T, N) value targets v_t
    pg_advantages: Tensor  # (T, N) A_t, already weighted by the truncated importance ratio


@torch.no_grad()
def vtrace(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    truncated: Tensor | None = None,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTrace:
    """V-trace targets and advantages for (T, N) log-ratios log pi(a|x) - log mu(a|x).

    ``discounts`` (T, N) is gamma * (1 - terminated_t); ``values`` (T + 1, N) the learner's V(x_t), row T
    valuing the observation after the last step; ``truncated`` (T, N) bool marks time-limit ends, which cut
    the trace but still bootstrap. The clip thresholds are the paper's rho_bar, rho_bar for the policy
    gradient, and c_bar (None: no clipping); ``lambda_`` scales every c_t. No gradient flows through the result.
    """
    rhos = log_rhos.exp()  # (T, N)
    clipped_rhos = rhos.clamp(max=clip_rho_threshold) if clip_rho_threshold is not None else rhos
    cs = lambda_ * (rhos.clamp(max=clip_c_threshold) if clip_c_threshold is not None else rhos)
    go_on = discounts if truncated is None else discounts * (~truncated).to(discounts.dtype)  # (T, N)
    deltas = clipped_rhos * (rewards + discounts * values[1:] - values[:-1])  # (T, N) every TD error at once
    decay = go_on * cs  # (T, N)
    vs_minus_v = torch.empty_like(deltas)
    acc = torch.zeros_like(deltas[0])  # (N,) v_{t+1} - V(x_{t+1}), 0 past the unroll's end (bootstrap)
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = torch.addcmul(deltas[t], decay[t], acc)
        vs_minus_v[t] = acc
    vs = vs_minus_v + values[:-1]
    # v_{t+1} for A_t: the next step's target, but V(x_{t+1}) itself where the trace stops (a truncation's final
    # observation, or past the unroll); a termination's discount of 0 removes it anyway.
    next_vs_minus_v = torch.cat([vs_minus_v[1:], torch.zeros_like(vs_minus_v[:1])])  # (T, N)
    if truncated is not None:
        next_vs_minus_v = next_vs_minus_v.masked_fill(truncated, 0.0)
    next_vs = values[1:] + next_vs_minus_v
    pg_rhos = rhos.clamp(max=clip_pg_rho_threshold) if clip_pg_rho_threshold is not None else rhos
    pg_advantages = pg_rhos * (rewards + discounts * next_vs - values[:-1])
    return VTrace(vs, pg_advantages)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` (same shape, bool) is True."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def impala_loss(
    logprob: Tensor,
    entropy: Tensor,
    value: Tensor,
    targets: VTrace,
    valid: Tensor,
    vf_coef: float = 0.5,
    ent_coef: float = 0.01,
) -> dict[str, Tensor]:
    """IMPALA's learner loss on (T, N) tensors (the paper's eq. 1-3, monobeast's ``learn``), over ``valid`` steps.

    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy, with
        pg_loss = -mean(A_t * log pi(a_t|x_t))       A_t = V-trace's advantage, a constant
        v_loss  = 0.5 * mean((v_t - V(x_t))^2)       v_t = V-trace's target, a constant
    Means rather than monobeast's sums, so the coefficients do not depend on T x N.
    """
    pg_loss = -masked_mean(logprob * targets.pg_advantages, valid)
    v_loss = 0.5 * masked_mean((targets.vs - value).square(), valid)
    entropy = masked_mean(entropy, valid)
    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy
    return {"loss": loss, "pg_loss": pg_loss, "v_loss": v_loss, "entropy": entropy}
