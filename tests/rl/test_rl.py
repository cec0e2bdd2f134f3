"""RL family units: GAE against a naive loop, PPO terms at ratio 1, the nets' distributions, running statistics,
and the collector's episode boundaries (autoreset masking, truncation bootstrapping) on hand-made envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import TimeLimit

from zoo.io.weights import CheckpointError
from zoo.rl import ActorCritic, Evaluator, RolloutCollector, RunningMeanStd, a2c_loss, gae, ppo_loss
from zoo.train.optim import param_groups

# -- GAE -------------------------------------------------------------------------------------------------


def naive_gae(rewards, values, terminated, truncated, gamma, lam):
    """Per env, per step, backwards; an episode end cuts the trace, only a termination drops the bootstrap."""
    t_len, n = rewards.shape
    adv = np.zeros((t_len, n))
    for i in range(n):
        last = 0.0
        for t in reversed(range(t_len)):
            next_value = 0.0 if terminated[t, i] else values[t + 1, i]
            delta = rewards[t, i] + gamma * next_value - values[t, i]
            if terminated[t, i] or truncated[t, i]:
                last = delta
            else:
                last = delta + gamma * lam * last
            adv[t, i] = last
    return adv


def test_gae_equals_a_naive_reversed_loop():
    g = torch.Generator().manual_seed(0)
    t_len, n = 37, 5
    rewards, values = torch.randn(t_len, n, generator=g), torch.randn(t_len + 1, n, generator=g)
    ends = torch.rand(t_len, n, generator=g)
    terminated, truncated = ends < 0.1, (ends >= 0.1) & (ends < 0.2)
    adv, ret = gae(rewards, values, terminated, truncated, 0.97, 0.9)
    expected = naive_gae(rewards.numpy(), values.numpy(), terminated.numpy(), truncated.numpy(), 0.97, 0.9)
    torch.testing.assert_close(adv, torch.from_numpy(expected).float())
    torch.testing.assert_close(ret, adv + values[:-1])


def test_gae_bootstraps_a_truncation_from_the_final_observation_and_not_a_termination():
    # One env, three steps: step 0 truncates (values[1] is V(final obs) = 10), step 1 is the autoreset step,
    # step 2 terminates. With lambda = 1 and gamma = 0.5 the arithmetic is by hand.
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[4.0], [10.0], [3.0], [7.0]])
    truncated = torch.tensor([[True], [False], [False]])
    terminated = torch.tensor([[False], [False], [True]])
    adv, _ = gae(rewards, values, terminated, truncated, gamma=0.5, gae_lambda=1.0)
    assert adv[0].item() == pytest.approx(1.0 + 0.5 * 10.0 - 4.0)  # bootstrapped, trace cut
    assert adv[2].item() == pytest.approx(2.0 - 3.0)  # no bootstrap from values[3]


# -- PPO loss --------------------------------------------------------------------------------------------


def test_ppo_loss_at_ratio_one():
    g = torch.Generator().manual_seed(1)
    b = 64
    logprob = torch.randn(b, generator=g).requires_grad_()
    adv, ret, value = torch.randn(b, generator=g), torch.randn(b, generator=g), torch.randn(b, generator=g)
    entropy = torch.rand(b, generator=g)
    for clip_vloss in (False, True):
        out = ppo_loss(
            logprob,
            logprob.detach(),
            adv,
            value,
            value,
            ret,
            entropy,
            clip_coef=0.2,
            vf_coef=0.5,
            ent_coef=0.01,
            clip_vloss=clip_vloss,
        )
        torch.testing.assert_close(out["pg_loss"], -adv.mean())
        torch.testing.assert_close(out["v_loss"], 0.5 * (value - ret).square().mean())
        expected = -adv.mean() - 0.01 * entropy.mean() + 0.25 * (value - ret).square().mean()
        torch.testing.assert_close(out["loss"], expected)
        assert out["approx_kl"].item() == 0.0 and out["clipfrac"].item() == 0.0
    # At ratio 1 the clipped surrogate's gradient is the plain policy gradient: -A / B per log-probability.
    (grad,) = torch.autograd.grad(out["pg_loss"], logprob)
    torch.testing.assert_close(grad, -adv / b)


def test_ppo_loss_clips_the_ratio():
    adv = torch.tensor([1.0, -1.0])
    logprob = torch.log(torch.tensor([2.0, 0.5]))  # ratios 2 and 0.5 against log-prob 0
    out = ppo_loss(logprob, torch.zeros(2), adv, torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), 0.2)
    # pessimistic bound: min(r * A, clip(r) * A) = [1.2 * 1, 0.8 * -1]
    torch.testing.assert_close(out["pg_loss"], -torch.tensor([1.2, -0.8]).mean())
    assert out["clipfrac"].item() == 1.0


def test_a2c_loss_terms_and_its_gradient_equals_ppos_at_ratio_one():
    g = torch.Generator().manual_seed(2)
    b = 32
    logits = torch.randn(b, 3, generator=g).requires_grad_()
    value = torch.randn(b, generator=g).requires_grad_()
    actions = torch.randint(0, 3, (b,), generator=g)
    adv, ret = torch.randn(b, generator=g), torch.randn(b, generator=g)

    def terms():
        logp = logits.log_softmax(-1)
        return logp.gather(1, actions[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)

    logprob, entropy = terms()
    a2c = a2c_loss(logprob, adv, value, ret, entropy, vf_coef=0.5, ent_coef=0.01)
    torch.testing.assert_close(a2c["pg_loss"], -(adv * logprob).mean())
    torch.testing.assert_close(a2c["v_loss"], (value - ret).square().mean())  # Baselines/SB3: no 1/2
    grads_a2c = torch.autograd.grad(a2c["loss"], (logits, value))
    # One PPO epoch on fresh data has ratio 1 everywhere, so it is A2C; ppo_loss halves the squared error.
    logprob, entropy = terms()
    ppo = ppo_loss(logprob, logprob.detach(), adv, value, value.detach(), ret, entropy, vf_coef=1.0, ent_coef=0.01)
    for mine, theirs in zip(grads_a2c, torch.autograd.grad(ppo["loss"], (logits, value))):
        torch.testing.assert_close(mine, theirs)


# -- nets ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("continuous", [False, True])
def test_actor_critic_matches_torch_distributions(continuous):
    torch.manual_seed(0)
    net = ActorCritic(obs_dim=3, action_dim=2, continuous=continuous, hidden_sizes=(8, 8))
    x = torch.randn(16, 3)
    action, logprob, entropy, value = net.get_action_and_value(x)
    out = net.actor(x)
    if continuous:
        dist = torch.distributions.Normal(out, net.actor_logstd.exp().expand_as(out))
        ref_logprob, ref_entropy = dist.log_prob(action).sum(-1), dist.entropy().sum(-1)
        assert action.shape == (16, 2)
        torch.testing.assert_close(net.act(x), out)
    else:
        dist = torch.distributions.Categorical(logits=out)
        ref_logprob, ref_entropy = dist.log_prob(action), dist.entropy()
        assert action.shape == (16,) and action.dtype == torch.int64
        torch.testing.assert_close(net.act(x), out.argmax(-1))
    torch.testing.assert_close(logprob, ref_logprob)
    torch.testing.assert_close(entropy, ref_entropy)
    assert value.shape == (16,)
    torch.testing.assert_close(net.get_value(x), value)
    # scoring a given action is differentiable and finite everywhere
    _, logprob, entropy, value = net.get_action_and_value(x, action)
    (logprob.sum() + entropy.sum() + value.sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_actor_critic_init_and_parameter_groups():
    net = ActorCritic(obs_dim=4, action_dim=3, continuous=True)
    # the policy head starts small (gain 0.01), so every action starts near-equally likely / near 0
    assert net.actor[-1].weight.abs().max() < 0.05 and net.critic[-1].weight.abs().max() > 0.1
    groups = param_groups(net, 0.01)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in net.parameters())  # every parameter exactly once
    assert id(net.actor_logstd) in {id(p) for p in groups[1]["params"]}  # 2-D, but named by no_weight_decay


# -- running statistics ----------------------------------------------------------------------------------


def test_running_mean_std_merges_batches_like_one_pass():
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(k, 3, generator=g) * 3 + 1 for k in (5, 17, 1, 40)]
    rms = RunningMeanStd((3,), epsilon=1e-8)
    for b in batches:
        rms.update(b)
    allx = torch.cat(batches).double()
    torch.testing.assert_close(rms.mean, allx.mean(0))
    torch.testing.assert_close(rms.var, allx.var(0, unbiased=False))
    assert set(rms.state_dict()) == {"mean", "var", "count"}  # buffers: a checkpoint carries them
    x = torch.randn(4, 3)
    expected = ((x - allx.mean(0)) / allx.std(0, unbiased=False)).float().clamp(-10, 10)
    torch.testing.assert_close(rms.normalize(x), expected)


# -- collector and evaluator on hand-made envs -----------------------------------------------------------


class Counter(gym.Env):
    """Observation: steps taken in this episode; reward 1 a step; terminates after ``horizon`` steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, horizon: int) -> None:
        self.horizon, self.k = horizon, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.k += 1
        return np.array([self.k], np.float32), 1.0, self.k >= self.horizon, False, {}


class ValueIsTenTimesObs:
    """An agent whose value identifies the observation it was computed from: V(s) = 10 s + 1."""

    def get_value(self, x):
        return 10 * x[:, 0] + 1

    def get_action_and_value(self, x, action=None, deterministic=False):
        zeros = torch.zeros(len(x))
        return torch.zeros(len(x), dtype=torch.int64), zeros, zeros, self.get_value(x)

    def act(self, x, deterministic=True):
        return torch.zeros(len(x), dtype=torch.int64)


def terminating_and_truncating_envs():
    # env 0 terminates after 3 steps; env 1 hits a 4-step time limit (truncation)
    return gym.vector.SyncVectorEnv([lambda: Counter(3), lambda: TimeLimit(Counter(100), max_episode_steps=4)])


def test_collector_masks_autoreset_steps_and_bootstraps_truncations_from_the_final_observation():
    collector = RolloutCollector(terminating_and_truncating_envs(), num_steps=10, gamma=0.5, seed=0)
    r = collector.collect(ValueIsTenTimesObs())
    obs = r.obs[..., 0]
    torch.testing.assert_close(obs[:, 0], torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1.0]))  # 3 = final obs
    torch.testing.assert_close(obs[:, 1], torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4.0]))
    # the step after an episode end is gymnasium's autoreset: no transition, no reward
    assert r.valid[:, 0].tolist() == [True, True, True, False, True, True, True, False, True, True]
    assert r.valid[:, 1].tolist() == [True, True, True, True, False, True, True, True, True, False]
    assert (r.rewards[~r.valid] == 0).all() and (r.rewards[r.valid] == 1).all()
    assert r.terminated[:, 0].nonzero().flatten().tolist() == [2, 6] and not r.truncated[:, 0].any()
    assert r.truncated[:, 1].nonzero().flatten().tolist() == [3, 8] and not r.terminated[:, 1].any()
    # values[t + 1] after an episode end is the value of the final observation
    assert r.values[3, 0] == 31 and r.values[4, 1] == 41
    adv, _ = gae(r.rewards, r.values, r.terminated, r.truncated, gamma=0.5, gae_lambda=0.9)
    assert adv[2, 0].item() == pytest.approx(1 - 21)  # termination: no bootstrap
    assert adv[3, 1].item() == pytest.approx(1 + 0.5 * 41 - 31)  # truncation: bootstrap from V(final obs)
    assert sorted(r.episode_returns.tolist()) == [3, 3, 4, 4] and sorted(r.episode_lengths.tolist()) == [3, 3, 4, 4]
    assert r.env_steps == 20
    # a truncation on a rollout's last step bootstraps from the value row past its end
    short = RolloutCollector(terminating_and_truncating_envs(), num_steps=9, seed=0).collect(ValueIsTenTimesObs())
    assert short.truncated[8, 1] and short.values[9, 1] == 41


def test_rollouts_continue_across_collect_calls():
    one = RolloutCollector(terminating_and_truncating_envs(), num_steps=10, seed=0).collect(ValueIsTenTimesObs())
    halves = RolloutCollector(terminating_and_truncating_envs(), num_steps=5, seed=0)
    first = halves.collect(ValueIsTenTimesObs())
    parts = [{k: getattr(first, k).clone() for k in ("obs", "valid", "rewards", "terminated", "truncated")}]
    second = halves.collect(ValueIsTenTimesObs())
    parts.append({k: getattr(second, k) for k in parts[0]})
    for k in parts[0]:
        torch.testing.assert_close(torch.cat([parts[0][k], parts[1][k]]), getattr(one, k))


def test_collector_normalises_observations_and_scales_rewards_with_the_statistics_it_is_given():
    obs_rms, ret_rms = RunningMeanStd((1,)), RunningMeanStd(())
    obs_rms.update(torch.tensor([[1.0], [3.0]]))  # mean 2, var 1 (nearly)
    before_mean, before_var = obs_rms.mean.clone(), obs_rms.var.clone()
    collector = RolloutCollector(
        terminating_and_truncating_envs(), 6, obs_norm=obs_rms, reward_norm=ret_rms, gamma=0.9, seed=0
    )
    r = collector.collect(ValueIsTenTimesObs())
    raw = collector.raw_obs.clone()
    torch.testing.assert_close(r.obs, ((raw - before_mean) / (before_var + 1e-8).sqrt()).float())
    assert obs_rms.count > 2 and not torch.equal(obs_rms.mean, before_mean)  # updated after the rollout
    raw_rewards = r.valid.float()  # 1 a step, 0 on autoreset steps
    torch.testing.assert_close(r.rewards, raw_rewards / (ret_rms.var.float() + 1e-8).sqrt())


def test_evaluator_gives_each_env_its_quota_and_skips_autoreset_steps():
    envs = gym.vector.SyncVectorEnv([lambda: Counter(3), lambda: Counter(5)])
    returns, lengths = Evaluator(envs, num_episodes=5, seed=0).run(ValueIsTenTimesObs().act)
    # quotas 2 and 3: the short env's extra episodes do not crowd out the long one's
    assert returns.tolist() == [3, 3, 5, 5, 5] and lengths.tolist() == [3, 3, 5, 5, 5]


class OffsetActions(Counter):
    """Counter acting in Discrete(3, start=1), the actions {1, 2, 3}; it keeps the actions it is given."""

    action_space = gym.spaces.Discrete(3, start=1)

    def __init__(self) -> None:
        super().__init__(horizon=4)
        self.given: list[int] = []

    def step(self, action):
        self.given.append(int(action))
        return super().step(action)


def test_a_discrete_space_starting_at_1_is_stepped_with_its_own_actions():
    env = OffsetActions()
    torch.manual_seed(0)
    collector = RolloutCollector(gym.vector.SyncVectorEnv([lambda: env]), num_steps=12, seed=0)
    r = collector.collect(ActorCritic(1, 3, hidden_sizes=(8,)))
    indices = r.actions[:, 0][r.valid[:, 0]]  # what the policy sampled: indices from 0, as its logits count
    assert env.given == (indices + 1).tolist() and set(env.given) == {1, 2, 3}
    envs = gym.vector.SyncVectorEnv([lambda: env])
    env.given.clear()
    Evaluator(envs, num_episodes=1, seed=0).run(lambda x: torch.zeros(len(x), dtype=torch.int64))
    assert env.given == [1] * 4  # index 0 is the space's first action


def test_sync_and_async_envs_give_the_same_rollout():
    from datamodules import GymDataModule

    dm = GymDataModule("CartPole-v1", num_envs=3, seed=7)
    rollouts = []
    for mode in ("sync", "async"):
        torch.manual_seed(0)
        net = ActorCritic(4, 2, hidden_sizes=(8,))
        collector = RolloutCollector(dm.make_envs(mode=mode), num_steps=40, seed=dm.seed)
        r = collector.collect(net)
        rollouts.append({k: getattr(r, k).clone() for k in ("obs", "actions", "rewards", "valid", "terminated")})
        collector.close()
    for k in rollouts[0]:
        torch.testing.assert_close(rollouts[0][k], rollouts[1][k])


# -- optimizers and checkpoints from before the settings objects -------------------------------------------


def test_each_agents_optimizer_is_the_one_its_reference_uses():
    from zoo.rl import A2CModule, IMPALAModule, PPOModule, SACModule, SoftActorCritic

    def settings(opt: torch.optim.Optimizer, *keys: str) -> tuple:
        return (type(opt).__name__, *(opt.param_groups[0][k] for k in keys))

    net = ActorCritic(3, 2)
    ppo = PPOModule(net).configure_optimizers()["optimizer"]  # CleanRL's and Baselines' PPO
    assert settings(ppo, "lr", "eps", "weight_decay") == ("AdamW", 2.5e-4, 1e-5, 0.0)
    a2c = A2CModule(net).configure_optimizers()["optimizer"]  # SB3's A2C
    assert settings(a2c, "lr", "alpha", "eps") == ("RMSprop", 7e-4, 0.99, 1e-5)
    impala = IMPALAModule(net).configure_optimizers()["optimizer"]  # monobeast's
    assert settings(impala, "lr", "alpha", "eps") == ("RMSprop", 4.8e-4, 0.99, 0.01)
    for opt in SACModule(SoftActorCritic(3, 1)).configure_optimizers():  # actor, critics, temperature
        assert settings(opt, "lr", "eps", "betas", "weight_decay") == ("AdamW", 3e-4, 1e-8, (0.9, 0.999), 0.0)
    assert all(len(o.param_groups) == 1 for o in (a2c, impala))  # one group, as their checkpoints hold it


OLD_HPARAMS = {  # as checkpoints stored them before the optimizer settings objects and the off-policy nets' file
    "PPOModule": ({"lr": 1e-3, "adam_eps": 1e-6}, "ActorCritic"),
    "A2CModule": ({"optimizer": "adam", "rms_alpha": 0.9}, "ActorCritic"),
    "SACModule": ({"actor_lr": 1e-3}, "SoftActorCritic"),
}


@pytest.mark.parametrize("agent", list(OLD_HPARAMS))
def test_an_old_checkpoint_is_refused_in_one_line_naming_the_version(agent, tmp_path):
    """No migration before a release (STYLE): the flat optimizer keys of before the settings objects are refused,
    saying which zoo wrote the file, not read into today's shape."""
    import zoo.rl

    flat, net_path = OLD_HPARAMS[agent]
    cls = getattr(zoo.rl, agent)
    sizes = {"obs_dim": 3, "action_dim": 1 if agent == "SACModule" else 2, "hidden_sizes": [8, 8]}
    old = {"_class_path": f"zoo.rl.{agent}", "net": {"class_path": f"zoo.rl.{net_path}", "init_args": sizes}, **flat}
    stored = {"state_dict": {}, "hyper_parameters": {**old, "_zoo_version": "0.0.1"}}
    torch.save(stored | {"pytorch-lightning_version": "2.5.0"}, tmp_path / "old.ckpt")
    with pytest.raises(CheckpointError, match=r"written by zoo 0\.0\.1 and this is zoo .* retrain") as err:
        cls.load_from_checkpoint(tmp_path / "old.ckpt")
    assert "\n" not in str(err.value)
    torch.save(stored, tmp_path / "foreign.ckpt")
    with pytest.raises(CheckpointError, match="not a Lightning checkpoint"):
        cls.load_from_checkpoint(tmp_path / "foreign.ckpt")
