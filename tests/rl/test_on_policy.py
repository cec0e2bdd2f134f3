"""What A2C and PPO share (``zoo.rl.on_policy.OnPolicy``), checked on both agents without envs or a Trainer: acting
and the exported policy on normalised observations, the normalisers the collector is handed, each rollout's GAE with
the agent's own gamma and lambda, and the step's end (episodes, explained variance, budget, learning rate)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import zoo.rl.on_policy as on_policy
from zoo.rl import A2CModule, ActorCritic, PPOModule
from zoo.rl.collector import Rollout
from zoo.rl.losses import explained_variance, gae

AGENTS = [PPOModule, A2CModule]


def agent(cls, **settings):
    torch.manual_seed(0)
    module = cls(ActorCritic(3, 2, hidden_sizes=(8,)), **settings)
    module.obs_rms.update(torch.randn(200, 3) * torch.tensor([0.2, 1.0, 3.0]) + 2.0)  # far from the identity
    return module.eval()


def rollout(t: int = 6, n: int = 2) -> Rollout:
    g = torch.Generator().manual_seed(1)
    ended = torch.zeros(t, n, dtype=torch.bool)
    ended[2, 0] = True
    truncated = torch.zeros(t, n, dtype=torch.bool)
    truncated[4, 1] = True
    valid = torch.ones(t, n, dtype=torch.bool)
    valid[3, 0] = False  # the autoreset step after the ended episode
    return Rollout(
        obs=torch.randn(t, n, 3, generator=g),
        actions=torch.randint(2, (t, n), generator=g),
        logprobs=torch.randn(t, n, generator=g),
        values=torch.randn(t + 1, n, generator=g),
        rewards=torch.randn(t, n, generator=g),
        terminated=ended,
        truncated=truncated,
        valid=valid,
        episode_returns=torch.tensor([3.0, 5.0]),
        episode_lengths=torch.tensor([3.0, 4.0]),
    )


@pytest.mark.parametrize("cls", AGENTS)
def test_acting_and_the_policy_see_observations_as_the_net_trained_on_them(cls):
    obs = torch.randn(5, 3, generator=torch.Generator().manual_seed(2)) * 3  # not the suite's RNG: a fixed draw
    for norm_obs in (True, False):
        module = agent(cls, norm_obs=norm_obs)
        seen = module.obs_rms.normalize(obs) if norm_obs else obs
        torch.testing.assert_close(module.act(obs), module.net.act(seen, True))
        torch.testing.assert_close(module.policy()(obs), module.net.act(seen, True))
    assert not torch.equal(module.net.act(module.obs_rms.normalize(obs), True), module.net.act(obs, True))


@pytest.mark.parametrize("cls", AGENTS)
def test_train_start_hands_the_collector_the_normalisers_the_settings_name(cls, monkeypatch):
    made = []
    monkeypatch.setattr(on_policy, "RolloutCollector", lambda *args, **kwargs: made.append((args, kwargs)))
    monkeypatch.setattr(
        on_policy, "require_datamodule", lambda m: SimpleNamespace(num_envs=3, make_envs=lambda: "envs")
    )
    steps = []
    for norm_obs, norm_reward in ((True, False), (False, True)):
        module = agent(cls, norm_obs=norm_obs, norm_reward=norm_reward, num_steps=7, gamma=0.8)
        module.lifecycle.start = lambda m, step: steps.append(step) or 11  # the seed of this rank's envs
        module.on_train_start()
        assert steps.pop() == 7 * 3  # T x N env steps per training step
        args, kwargs = made.pop()
        assert args[:2] == ("envs", 7) and kwargs == {"seed": 11} and args[5] == 0.8
        assert args[3] is (module.obs_rms if norm_obs else None)
        assert args[4] is (module.return_rms if norm_reward else None)
    module.lifecycle.start = lambda m, step: None  # the collector is open, or the budget spent: none opened
    module.on_train_start()
    assert not made


@pytest.mark.parametrize("cls", AGENTS)
def test_a_rollouts_advantages_are_gae_with_the_agents_gamma_and_lambda(cls):
    module = agent(cls, gamma=0.9, gae_lambda=0.5)
    r = rollout()
    module.lifecycle.collector = SimpleNamespace(collect=lambda net: r)
    got, advantages, returns = module.collect()
    want = gae(r.rewards, r.values, r.terminated, r.truncated, 0.9, 0.5)
    assert got is r
    torch.testing.assert_close((advantages, returns), want)
    other = gae(r.rewards, r.values, r.terminated, r.truncated, 0.9, 1.0)
    assert not torch.allclose(advantages, other[0])


@pytest.mark.parametrize("cls", AGENTS)
def test_a_steps_end_logs_its_episodes_and_spends_its_env_steps(cls, monkeypatch):
    module = agent(cls)
    r = rollout()
    returns = r.values[:-1] + 1.0
    ended, stepped = [], []
    monkeypatch.setattr(on_policy, "lightning_writes", lambda trainer: True)
    monkeypatch.setattr(type(module), "trainer", None, raising=False)
    module.lr_schedulers = lambda: SimpleNamespace(step=lambda: stepped.append(True))
    module.lifecycle.end_step = lambda m, env_steps, stats, write: ended.append((env_steps, dict(stats), write))
    module.end_rollout(r, returns, {"loss": torch.tensor(1.0)})
    ((env_steps, stats, write),) = ended
    assert env_steps == 12 and write and stepped == [True]
    keep = r.valid
    torch.testing.assert_close(stats["explained_variance"], explained_variance(r.values[:-1][keep], returns[keep]))
    assert module.lifecycle.episodes.sums.tolist() == [2.0, 8.0, 7.0]  # count, return sum, length sum
