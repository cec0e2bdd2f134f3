"""Environment interaction, kept out of the objective: on-policy rollouts and evaluation episodes.

``RolloutCollector`` steps a gymnasium vector env (sync or async) with an agent and writes T steps of N
envs into preallocated tensors; ``Evaluator`` plays whole episodes with the most likely actions. Neither
has learnable parameters: the agent (``get_action_and_value``/``get_value``/``act``, as ``ActorCritic``)
and the running normalisation statistics (``RunningMeanStd``) are passed in by their owner, the module,
so that checkpoints carry them.

Episode boundaries under gymnasium 1.x's default next-step autoreset: the step that ends an episode
returns the episode's *final* observation; the following ``step`` call ignores its action and returns the
first observation of a new episode with reward 0. So:
  - the step after an episode end is a reset, not a transition: ``valid`` is False there and the loss
    masks it out;
  - ``values[t + 1]`` is V(final observation) whenever step t ended an episode, which is what a time-limit
    truncation bootstraps from (Pardo et al. 2018, "Time Limits in Reinforcement Learning"); a
    termination does not bootstrap (see ``zoo.rl.losses.gae``).

Notation: T steps per rollout, N envs, O observation features, A action dims.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from torch import Tensor

from zoo.rl.normalization import RunningMeanStd


@dataclass
class Rollout:
    """T steps of N envs, as the agent saw and did them."""

    obs: Tensor  # (T, N, O) observations as the policy saw them (normalised when enabled)
    actions: Tensor  # (T, N) int64 or (T, N, A) float, before clipping to the action space
    logprobs: Tensor  # (T, N) log pi(a_t|s_t) under the collecting policy
    values: Tensor  # (T + 1, N) V(s_t); row T values the observation after the last step
    rewards: Tensor  # (T, N) rewards (scaled when reward scaling is on)
    terminated: Tensor  # (T, N) bool: step t reached a terminal state (nothing to bootstrap)
    truncated: Tensor  # (T, N) bool: step t hit a time limit (bootstrap from values[t + 1])
    valid: Tensor  # (T, N) bool: False on autoreset steps, which are not transitions
    episode_returns: Tensor  # (E,) undiscounted, unscaled returns of the episodes that ended in it
    episode_lengths: Tensor  # (E,) their lengths

    @property
    def env_steps(self) -> int:
        return self.rewards.numel()


def check_next_step_autoreset(envs: VectorEnv) -> None:
    mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.NEXT_STEP.value):
        raise ValueError(f"the collector needs next-step autoreset (gymnasium's default); these envs use {mode}")


def with_episode_statistics(envs: VectorEnv) -> VectorEnv:
    """``envs`` wrapped in gymnasium's ``RecordEpisodeStatistics`` unless some layer already is."""
    layer = envs
    while True:
        if isinstance(layer, RecordEpisodeStatistics):
            return envs
        if not (hasattr(layer, "env") and isinstance(layer.env, VectorEnv)):
            return RecordEpisodeStatistics(envs)
        layer = layer.env


def env_actions(action: Tensor, space: gym.Space) -> np.ndarray:
    """Actions for ``envs.step``: on the host, clipped into a Box (the unclipped ones are what was sampled), a
    (Multi)Discrete space's indices (from 0, as the policy's logits count) moved to its own first action ``start``."""
    a = action.cpu().numpy()
    if isinstance(space, gym.spaces.Box):
        a = np.clip(a, space.low, space.high)
    elif isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        a = a + space.start
    return a


class RolloutCollector:
    """Steps ``envs`` with an agent, ``num_steps`` at a time, into preallocated (T, N) tensors."""

    def __init__(
        self,
        envs: VectorEnv,
        num_steps: int,
        device: torch.device | str = "cpu",
        obs_norm: RunningMeanStd | None = None,
        reward_norm: RunningMeanStd | None = None,
        gamma: float = 0.99,
        seed: int | None = None,
    ) -> None:
        """
        Args:
            envs: a gymnasium vector env with next-step autoreset (gymnasium's default).
            num_steps: T, steps per env per rollout.
            device: where the rollout tensors live (the agent's device).
            obs_norm: running observation statistics; when given, the agent sees normalised observations and
                the statistics are updated after each rollout from its raw observations.
            reward_norm: running statistics of the discounted return; when given, rewards are divided by its
                std (Baselines' ``VecNormalize``), updated from the rollout's returns before scaling.
            gamma: the discount of that running return.
            seed: seeds the envs' first reset (env i gets seed + i); None leaves them unseeded.
        """
        check_next_step_autoreset(envs)
        self.envs = with_episode_statistics(envs)
        self.num_steps, self.device, self.gamma, self.seed = num_steps, torch.device(device), gamma, seed
        self.obs_norm, self.reward_norm = obs_norm, reward_norm
        n, t = envs.num_envs, num_steps
        obs_shape, act_space = envs.single_observation_space.shape, envs.single_action_space
        continuous = isinstance(act_space, gym.spaces.Box)
        f32 = dict(dtype=torch.float32, device=self.device)
        self.raw_obs = torch.zeros((t, n, *obs_shape), **f32)
        self.obs = torch.zeros((t, n, *obs_shape), **f32)
        # (T, N) indices of a Discrete action, (T, N, K) of a MultiDiscrete one, (T, N, A) floats of a Box one.
        self.actions = torch.zeros(
            (t, n, *act_space.shape), dtype=torch.float32 if continuous else torch.int64, device=self.device
        )
        self.logprobs = torch.zeros((t, n), **f32)
        self.values = torch.zeros((t + 1, n), **f32)
        # What the envs return stays in NumPy until the rollout ends: one host-to-device copy, not T.
        self.rewards = np.zeros((t, n), dtype=np.float32)
        self.terminated = np.zeros((t, n), dtype=bool)
        self.truncated = np.zeros((t, n), dtype=bool)
        self.valid = np.zeros((t, n), dtype=bool)
        self._next_obs: Tensor | None = None  # reset lazily, so a collector can be built without stepping
        self._next_valid = np.ones(n, dtype=bool)
        self._discounted = np.zeros(n, dtype=np.float64)  # running return per env, for reward scaling

    def _observe(self, obs: np.ndarray) -> Tensor:
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device)

    def reset(self, seed: int | None = None) -> None:
        """Start fresh episodes in every env (a collector resets itself on its first ``collect``)."""
        obs, _ = self.envs.reset(seed=seed if seed is not None else self.seed)
        self._next_obs = self._observe(obs)
        self._next_valid[:] = True
        self._discounted[:] = 0.0

    @torch.no_grad()
    def collect(self, agent) -> Rollout:
        """One rollout of T steps per env with ``agent.get_action_and_value``; returns views of the buffers."""
        if self._next_obs is None:
            self.reset()
        space = self.envs.single_action_space
        returns, lengths = [], []
        for t in range(self.num_steps):
            self.raw_obs[t] = self._next_obs
            x = self.obs_norm.normalize(self._next_obs) if self.obs_norm is not None else self._next_obs
            self.obs[t] = x
            action, logprob, _, value = agent.get_action_and_value(x)
            self.actions[t], self.logprobs[t], self.values[t] = action, logprob, value
            self.valid[t] = self._next_valid
            obs, reward, term, trunc, info = self.envs.step(env_actions(action, space))
            self.rewards[t], self.terminated[t], self.truncated[t] = reward, term, trunc
            self._next_valid = ~(term | trunc)
            self._next_obs = self._observe(obs)
            if "_episode" in info:
                done = info["_episode"]
                returns.append(info["episode"]["r"][done])
                lengths.append(info["episode"]["l"][done])
        x = self.obs_norm.normalize(self._next_obs) if self.obs_norm is not None else self._next_obs
        self.values[-1] = agent.get_value(x)
        rewards = self._scaled_rewards()
        if self.obs_norm is not None:
            self.obs_norm.update(self.raw_obs.flatten(0, 1))
        to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        return Rollout(
            self.obs,
            self.actions,
            self.logprobs,
            self.values,
            to(rewards),
            to(self.terminated),
            to(self.truncated),
            to(self.valid),
            torch.from_numpy(np.concatenate(returns) if returns else np.zeros(0)).float(),
            torch.from_numpy(np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)).long(),
        )

    def _scaled_rewards(self) -> np.ndarray:
        if self.reward_norm is None:
            return self.rewards
        # Baselines' VecNormalize: divide by the std of the discounted return (not of the reward), which
        # keeps the value targets of any reward scale near unit size; the running return restarts per episode.
        discounted = np.empty_like(self.rewards, dtype=np.float64)
        ended = self.terminated | self.truncated
        for t in range(self.num_steps):
            self._discounted = self._discounted * self.gamma + self.rewards[t]
            discounted[t] = self._discounted
            self._discounted[ended[t]] = 0.0
        self.reward_norm.update(torch.from_numpy(discounted[self.valid]))
        return self.reward_norm.scale(torch.from_numpy(self.rewards)).numpy()

    def close(self) -> None:
        self.envs.close()


class Evaluator:
    """Plays a fixed number of whole episodes with a policy (an agent's most likely actions, usually)."""

    def __init__(
        self, envs: VectorEnv, num_episodes: int, seed: int | None = None, device: torch.device | str = "cpu"
    ) -> None:
        """
        Args:
            envs: a vector env with next-step autoreset, kept apart from the training envs.
            num_episodes: episodes per evaluation, spread evenly over the envs.
            seed: every evaluation resets with this seed, so each one plays the same start states.
            device: the agent's device.
        """
        check_next_step_autoreset(envs)
        self.envs, self.num_episodes, self.seed, self.device = envs, num_episodes, seed, torch.device(device)
        n = envs.num_envs
        # Each env plays its own quota; stopping at the first num_episodes endings instead would favour
        # short episodes (SB3's evaluate_policy makes the same correction).
        self.quota = np.array([(num_episodes + i) // n for i in range(n)])

    @torch.no_grad()
    def run(self, policy: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        """(returns (num_episodes,), lengths (num_episodes,)), ordered by env then episode.

        ``policy`` maps raw observations (n, O) on the device to actions, e.g. ``PPOModule.act``.
        """
        n = self.envs.num_envs
        obs, _ = self.envs.reset(seed=self.seed)
        space = self.envs.single_action_space
        ret, length = np.zeros(n), np.zeros(n, dtype=np.int64)
        done_count = np.zeros(n, dtype=np.int64)
        episodes: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        active = np.ones(n, dtype=bool)  # False on autoreset steps: their reward belongs to no episode
        while (done_count < self.quota).any():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
            obs, reward, term, trunc, _ = self.envs.step(env_actions(policy(x), space))
            ret[active] += reward[active]
            length[active] += 1
            ended = active & (term | trunc)
            for i in np.flatnonzero(ended):
                if done_count[i] < self.quota[i]:
                    episodes[i].append((float(ret[i]), int(length[i])))
                done_count[i] += 1
            ret[ended], length[ended] = 0.0, 0
            active = ~ended
        flat = [e for per_env in episodes for e in per_env]
        return torch.tensor([r for r, _ in flat]), torch.tensor([steps for _, steps in flat])

    def close(self) -> None:
        self.envs.close()
