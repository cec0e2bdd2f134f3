"""Experience replay for off-policy agents (SAC, TD3): a preallocated circular buffer and the collector that fills it.

``ReplayBuffer`` keeps every transition as one row of a single (C, 2O + A + 2) float tensor, written in place
(circularly, the oldest rows overwritten first) and sampled uniformly with one ``index_select``: one gather per
minibatch rather than one per field, at SB3's and CleanRL's layout (obs, next_obs, action, reward, done).
Its ``state_dict`` is plain tensors and ints, so a checkpoint can carry it and still load weights-only. The action
columns follow the env's action space: a Box's A floats, a Discrete action's index (one column, returned as int64),
a MultiDiscrete action's K indices; float32 holds indices exactly up to 2^24.

``TransitionCollector`` steps a gymnasium vector env one step at a time and stores the real transitions.
Under gymnasium 1.x's default next-step autoreset the step that ends an episode returns the episode's *final*
observation, and the next ``step`` call ignores its action and returns the first observation of a new episode:
  - the stored next observation of a transition is therefore always the true s' (also on truncation, where
    the target bootstraps from it: Pardo et al. 2018, "Time Limits in Reinforcement Learning"; SB3's
    ``handle_timeout_termination``; CleanRL's ``final_observation``);
  - the autoreset step (final obs -> reset obs) is not a transition and is not stored;
  - only ``terminated`` is stored as "done": a truncated episode's target still bootstraps.

Notation: C capacity, B batch, N envs, O observation features, A action dims.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from zoo.rl.collector import check_next_step_autoreset, env_actions, with_episode_statistics


@dataclass
class Transitions:
    """B transitions (s, a, r, s', terminated), views of one gathered (B, 2O + A + 2) block."""

    obs: Tensor  # (B, O)
    next_obs: Tensor  # (B, O) the true next observation, the final one where an episode ended
    actions: Tensor  # (B, A) floats of a Box, (B,) int64 of a Discrete space, (B, K) int64 of a MultiDiscrete one
    rewards: Tensor  # (B,)
    terminated: Tensor  # (B,) 1.0 where s' is terminal (no bootstrap), else 0.0; truncation stays 0.0


class ReplayBuffer:
    """Fixed-capacity circular store of transitions, sampled uniformly."""

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        action_dim: int | None = None,
        device: torch.device | str = "cpu",
        action_space: gym.Space | None = None,
    ) -> None:
        """
        Args:
            capacity: C, transitions kept; the oldest are overwritten first once it is full.
            obs_dim: observation features O (flattened).
            action_dim: action dimensions A of a Box action; None: from ``action_space``.
            device: where the storage lives (the agent's device), so sampled batches need no copy.
            action_space: the env's (single) action space: Box, Discrete or MultiDiscrete; it sets the action
                columns, their shape and their dtype when sampled. None: a Box of ``action_dim``.
        """
        if action_space is None:
            action_space = gym.spaces.Box(-np.inf, np.inf, (action_dim,), np.float32)
        if isinstance(action_space, gym.spaces.Box):
            self.action_shape, self.action_dtype = tuple(action_space.shape), torch.float32
        elif isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            self.action_shape, self.action_dtype = tuple(action_space.shape), torch.int64
        else:
            raise ValueError(f"the replay buffer stores Box, Discrete or MultiDiscrete actions, not {action_space}")
        action_dim = int(np.prod(self.action_shape))  # a Discrete action: one column, its index
        self.capacity, self.obs_dim, self.action_dim = capacity, obs_dim, action_dim
        # torch.empty touches no pages: a 1e6-row buffer costs memory only as it fills.
        self.storage = torch.empty((capacity, 2 * obs_dim + action_dim + 2), dtype=torch.float32, device=device)
        self.pos = 0  # next row to write
        self.size = 0  # rows written so far, at most C

    def __len__(self) -> int:
        return self.size

    def to(self, device: torch.device | str) -> ReplayBuffer:
        self.storage = self.storage.to(device)
        return self

    def add(self, obs: Tensor, next_obs: Tensor, actions: Tensor, rewards: Tensor, terminated: Tensor) -> None:
        """Append k transitions: obs, next_obs (k, O), actions (k, *action_shape), rewards (k,), terminated (k,)."""
        k = obs.shape[0]
        flat = actions.reshape(k, self.action_dim).to(obs.dtype)
        rows = torch.cat([obs, next_obs, flat, rewards[:, None], terminated[:, None].to(obs.dtype)], 1)
        if k == 0:
            return
        skip = max(0, k - self.capacity)  # more rows than fit: only the last C survive
        idx = (self.pos + skip + torch.arange(k - skip, device=self.storage.device)) % self.capacity
        self.storage.index_copy_(0, idx, rows[skip:].to(self.storage))
        self.pos = (self.pos + k) % self.capacity
        self.size = min(self.size + k, self.capacity)

    def sample(self, batch_size: int) -> Transitions:
        """B transitions drawn uniformly with replacement from the rows written (torch's global RNG)."""
        idx = torch.randint(self.size, (batch_size,), device=self.storage.device)
        return self._split(self.storage.index_select(0, idx))

    def _split(self, rows: Tensor) -> Transitions:
        o, a = self.obs_dim, self.action_dim
        actions = rows[:, 2 * o : 2 * o + a]
        if self.action_dtype != actions.dtype:
            actions = actions.round().to(self.action_dtype)
        actions = actions.reshape(len(rows), *self.action_shape)  # a view for a Box's (B, A)
        return Transitions(rows[:, :o], rows[:, o : 2 * o], actions, rows[:, -2], rows[:, -1])

    def state_dict(self) -> dict:
        """The rows written, the write position and the count: tensors and ints (weights-only loadable)."""
        # A slice is cloned: torch.save of a view writes its whole underlying storage, unwritten rows included.
        rows = self.storage if self.size == self.capacity else self.storage[: self.size].clone()
        return {"storage": rows, "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        rows = state["storage"]
        if rows.shape[1] != self.storage.shape[1] or state["size"] > self.capacity:
            raise ValueError(
                f"a replay buffer of {state['size']} rows x {rows.shape[1]} columns does not fit this "
                f"one ({self.capacity} x {self.storage.shape[1]})"
            )
        if state["size"] == self.capacity or state["pos"] == state["size"]:
            self.storage[: state["size"]] = rows
            self.pos, self.size = state["pos"] % self.capacity, state["size"]
        else:  # a full buffer of a larger capacity: keep its rows in order of writing
            order = torch.cat([rows[state["pos"] :], rows[: state["pos"]]])
            self.storage[: len(order)] = order
            self.pos, self.size = len(order) % self.capacity, len(order)


class TransitionCollector:
    """Steps ``envs`` one vector step at a time and writes the real transitions into a ``ReplayBuffer``."""

    def __init__(
        self,
        envs: VectorEnv,
        buffer: ReplayBuffer,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        keep_observations: bool = False,
    ) -> None:
        """
        Args:
            envs: a gymnasium vector env with next-step autoreset (gymnasium's default); its action space is a
                bounded Box, a Discrete or a MultiDiscrete one (where the warm-up draws its uniform actions).
            buffer: where transitions go.
            device: the agent's device (observations are handed to the policy there).
            seed: seeds the envs' first reset (env i gets seed + i); None leaves them unseeded.
            keep_observations: keep the observations acted on until ``pop_observations`` (for running
                normalisation statistics, updated by their owner).
        """
        check_next_step_autoreset(envs)
        space = envs.single_action_space
        self.envs, self.buffer, self.seed = with_episode_statistics(envs), buffer, seed
        self.device = torch.device(device)
        self.num_envs = envs.num_envs
        if isinstance(space, gym.spaces.Box) and np.isfinite(space.low).all() and np.isfinite(space.high).all():
            self.low = torch.as_tensor(space.low, dtype=torch.float32, device=self.device)  # (A,)
            self.high = torch.as_tensor(space.high, dtype=torch.float32, device=self.device)  # (A,)
        elif isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            self.low = torch.zeros_like(torch.as_tensor(space.start, device=self.device))  # () or (K,) indices from 0
            self.high = self.low + torch.as_tensor(
                space.nvec if hasattr(space, "nvec") else space.n, device=self.device
            )  # one past the last index
        else:
            raise ValueError(
                f"the collector needs a bounded Box, a Discrete or a MultiDiscrete action space, not {space}"
            )
        self._obs: Tensor | None = None  # (N, O); reset lazily, on the first step
        self._valid = np.ones(self.num_envs, dtype=bool)  # False: the next step is an autoreset step
        self.keep_observations = keep_observations
        self._seen: list[Tensor] = []  # observations acted on since the last pop_observations
        self._returns: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []

    def reset(self, seed: int | None = None) -> None:
        """Start fresh episodes in every env (the collector resets itself on its first ``step``)."""
        obs, _ = self.envs.reset(seed=seed if seed is not None else self.seed)
        self._obs = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        self._valid[:] = True

    def random_actions(self) -> Tensor:
        """Uniform actions in the space: (N, A) floats in a Box, (N,) or (N, K) int64 indices of a (Multi)Discrete
        one; from torch's global RNG, so that checkpoints carry its state."""
        u = torch.rand((self.num_envs, *self.low.shape), device=self.device)
        if self.low.is_floating_point():
            return self.low + (self.high - self.low) * u
        return self.low + (u * (self.high - self.low)).long()

    @torch.no_grad()
    def step(self, policy: Callable[[Tensor], Tensor] | None) -> None:
        """One step of every env with ``policy`` (raw observations (N, O) -> actions (N, A)), or uniformly
        random actions when it is None; stores the step's transitions, except those of autoreset steps."""
        if self._obs is None:
            self.reset()
        obs = self._obs
        actions = policy(obs) if policy is not None else self.random_actions()  # (N, *action_shape)
        next_obs, reward, term, trunc, info = self.envs.step(env_actions(actions, self.envs.single_action_space))
        next_t = torch.as_tensor(next_obs, dtype=torch.float32, device=self.device)
        reward_t = torch.as_tensor(reward, dtype=torch.float32, device=self.device)
        term_t = torch.as_tensor(term, device=self.device)
        if self._valid.all():
            self.buffer.add(obs, next_t, actions, reward_t, term_t)
        elif self._valid.any():
            keep = torch.from_numpy(self._valid).to(self.device)
            self.buffer.add(obs[keep], next_t[keep], actions[keep], reward_t[keep], term_t[keep])
        if self.keep_observations:
            self._seen.append(obs)
        self._valid = ~(term | trunc)
        self._obs = next_t
        if "_episode" in info:
            done = info["_episode"]
            self._returns.append(info["episode"]["r"][done])
            self._lengths.append(info["episode"]["l"][done])

    def pop_observations(self) -> Tensor:
        """The observations acted on since the last call (k, O), for running normalisation statistics."""
        seen = torch.cat(self._seen) if self._seen else torch.zeros((0, self.buffer.obs_dim), device=self.device)
        self._seen.clear()
        return seen

    def pop_episodes(self) -> tuple[Tensor, Tensor]:
        """Undiscounted returns (E,) and lengths (E,) of the episodes that ended since the last call."""
        returns = torch.from_numpy(np.concatenate(self._returns) if self._returns else np.zeros(0)).float()
        lengths = torch.from_numpy(np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)).long()
        self._returns.clear()
        self._lengths.clear()
        return returns, lengths

    def close(self) -> None:
        self.envs.close()
