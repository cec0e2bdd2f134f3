"""RL objectives against CleanRL's and SB3's code written out here term by term, away from the ratio-1 and
equal-value special cases the unit tests use (where a clipped and an unclipped term, or max and min, agree).

References: CleanRL ppo.py / ppo_continuous_action.py (the loss block), sac_continuous_action.py; SB3's
PPO.train (advantage normalisation, clip_range_vf) and SAC.train (ent_coef_loss, critic target).
"""

from __future__ import annotations

import pytest
import torch

from zoo.rl.losses import normalize, ppo_loss, sac_actor_loss, sac_critic_loss, sac_temperature_loss, soft_q_target


def batch(b: int = 256, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    # Log-ratios of +-0.5 put a good share of rows outside [1 - 0.2, 1 + 0.2]; values move by more than clip too.
    return dict(
        logprob=r(b) * 0.5,
        old_logprob=r(b) * 0.1,
        advantages=r(b),
        value=r(b),
        old_value=r(b) * 0.3,
        returns=r(b),
        entropy=r(b).abs(),
    )


def cleanrl_ppo(
    logprob, old_logprob, advantages, value, old_value, returns, entropy, clip_coef, vf_coef, ent_coef, clip_vloss
):
    logratio = logprob - old_logprob
    ratio = logratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    if clip_vloss:
        v_loss_unclipped = (value - returns) ** 2
        v_clipped = old_value + torch.clamp(value - old_value, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((value - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
    approx_kl = ((ratio - 1) - logratio).mean()
    clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return dict(loss=loss, pg_loss=pg_loss, v_loss=v_loss, entropy=entropy_loss, approx_kl=approx_kl, clipfrac=clipfrac)


def test_ppo_loss_equals_cleanrl_off_ratio_one_with_and_without_value_clipping():
    b = batch()
    ratio = (b["logprob"] - b["old_logprob"]).exp()
    assert ((ratio - 1).abs() > 0.2).float().mean() > 0.2  # clipping is exercised
    for clip_vloss in (False, True):
        ours = ppo_loss(**b, clip_coef=0.2, vf_coef=0.7, ent_coef=0.03, clip_vloss=clip_vloss)
        theirs = cleanrl_ppo(**b, clip_coef=0.2, vf_coef=0.7, ent_coef=0.03, clip_vloss=clip_vloss)
        for k, v in theirs.items():
            torch.testing.assert_close(ours[k], v, msg=f"{k} (clip_vloss={clip_vloss})")
    assert not torch.allclose(ppo_loss(**b, clip_vloss=True)["v_loss"], ppo_loss(**b, clip_vloss=False)["v_loss"])


def test_ppo_policy_term_is_the_shared_surrogates_unmasked_branch():
    """PPO writes its own three lines (as CleanRL); GRPO's masked token-level surrogate must agree with them when
    it has no mask, one ratio per row and no KL: the sharing is this test, not an indirection."""
    from zoo.train.policy_gradient import clipped_surrogate

    b = batch()
    for clip in (0.1, 0.2, 0.3):
        ours = ppo_loss(**b, clip_coef=clip)
        shared = clipped_surrogate(b["logprob"], b["old_logprob"], b["advantages"], clip, clip)
        for k in ("approx_kl", "clipfrac"):
            torch.testing.assert_close(ours[k], shared[k], msg=k)
        torch.testing.assert_close(ours["pg_loss"], shared["loss"])


def test_advantage_normalisation_is_cleanrls():
    adv = batch()["advantages"] * 3 + 2
    torch.testing.assert_close(normalize(adv), (adv - adv.mean()) / (adv.std() + 1e-8))


def test_sac_terms_equal_cleanrl_and_sb3():
    g = torch.Generator().manual_seed(3)
    b = 64
    rewards, next_logprob, logprob = (
        torch.randn(b, generator=g),
        torch.randn(b, generator=g),
        torch.randn(b, generator=g),
    )
    terminated = (torch.rand(b, generator=g) < 0.3).float()
    next_q, q, q_pi = torch.randn(2, b, generator=g), torch.randn(2, b, generator=g), torch.randn(2, b, generator=g)
    alpha, gamma = 0.2, 0.99
    # CleanRL: min_qf_next_target = min(qf1, qf2) - alpha * next_log_pi; next_q_value = r + (1 - d) * gamma * that
    target = rewards + (1 - terminated) * gamma * (torch.min(next_q[0], next_q[1]) - alpha * next_logprob)
    torch.testing.assert_close(soft_q_target(rewards, terminated, next_q, next_logprob, alpha, gamma), target)
    # SB3: critic_loss = 0.5 * sum(F.mse_loss(current_q, target_q_values) for current_q in current_q_values)
    expected = 0.5 * sum(torch.nn.functional.mse_loss(qk, target) for qk in q)
    torch.testing.assert_close(sac_critic_loss(q, target)["loss"], expected)
    # CleanRL: actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
    torch.testing.assert_close(
        sac_actor_loss(logprob, q_pi, alpha)["loss"], (alpha * logprob - torch.min(q_pi[0], q_pi[1])).mean()
    )
    # SB3: ent_coef_loss = -(log_ent_coef * (log_prob + target_entropy).detach()).mean(); its gradient raises
    # alpha (descends to larger log alpha) exactly when the entropy -log pi is below the target.
    log_alpha = torch.tensor(-1.0, requires_grad=True)
    out = sac_temperature_loss(log_alpha, logprob, target_entropy=-2.0)
    torch.testing.assert_close(out["loss"], -(log_alpha * (logprob + -2.0)).mean())
    (grad,) = torch.autograd.grad(out["loss"], log_alpha)
    assert torch.sign(grad) == -torch.sign((logprob - 2.0).mean())


# -- GAE through the collector, on a scripted env with episode ends at known steps ----------------------

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium.wrappers import TimeLimit  # noqa: E402

from zoo.rl import RolloutCollector, gae  # noqa: E402


class Counter(gym.Env):
    """obs = steps taken in this episode; reward k + 1 + offset at its k-th step; terminal after ``terminal_at``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, offset: float, terminal_at: int | None) -> None:
        self.offset, self.terminal_at, self.k = offset, terminal_at, 0

    def reset(self, seed=None, options=None):
        self.k = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.k += 1
        term = self.terminal_at is not None and self.k == self.terminal_at
        return np.array([self.k], np.float32), self.k + self.offset, term, False, {}


class ValueOfObs:
    """V(s) = 10 + 2 s, action 0 always: the values at every step are known in advance."""

    def get_value(self, x):
        return 10 + 2 * x[:, 0]

    def get_action_and_value(self, x):
        return torch.zeros(len(x), dtype=torch.long), torch.zeros(len(x)), None, self.get_value(x)


def reference_advantages(episode_len: int, terminal: bool, offset: float, steps: int, gamma: float, lam: float):
    """Per step of one env: the transitions written out from the script, then CleanRL's reversed loop over them
    with its bootstrap made right (a truncation bootstraps V(final obs), a termination nothing), None on the
    autoreset steps."""
    v = lambda s: 10 + 2 * s  # noqa: E731
    rows, k = [], 0  # (s, r, s', ended, terminated) per rollout step, None for the autoreset step
    for _ in range(steps):
        if k == episode_len:
            rows.append(None)
            k = 0
            continue
        k += 1
        rows.append((k - 1, k + offset, k, k == episode_len, terminal and k == episode_len))
    adv, last = [None] * steps, 0.0
    for t in reversed(range(steps)):
        if rows[t] is None:
            last = 0.0
            continue
        s, r, s_next, ended, term = rows[t]
        delta = r + gamma * (0.0 if term else v(s_next)) - v(s)
        last = delta + (0.0 if ended else gamma * lam * last)
        adv[t] = last
    return adv


def test_collector_and_gae_equal_a_reference_on_scripted_episode_ends():
    gamma, lam, steps = 0.9, 0.8, 11
    specs = [(3, True, 0.0), (4, False, 0.5), (20, False, 0.25)]  # terminates at 3; truncated at 4; never ends
    envs = gym.vector.SyncVectorEnv(
        [
            (lambda L=L, term=term, off=off: TimeLimit(Counter(off, L if term else None), L if not term else 1000))
            for L, term, off in specs
        ]
    )
    rollout = RolloutCollector(envs, steps).collect(ValueOfObs())
    adv, _ = gae(rollout.rewards, rollout.values, rollout.terminated, rollout.truncated, gamma, lam)
    for i, (L, term, off) in enumerate(specs):
        expected = reference_advantages(L, term, off, steps, gamma, lam)
        assert rollout.valid[:, i].tolist() == [a is not None for a in expected]
        got = [adv[t, i].item() for t in range(steps) if expected[t] is not None]
        assert got == pytest.approx([a for a in expected if a is not None], rel=1e-5), f"env {i}"
    envs.close()
