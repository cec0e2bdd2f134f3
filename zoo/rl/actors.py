"""IMPALA's actors (Espeholt et al. 2018): processes that step their own envs with a slightly stale copy of the
policy and hand whole unrolls to the learner through shared memory. No learnable parameters here: the
learner (``zoo.rl.impala.IMPALAModule``) owns the net and passes it in.

The pool's machinery (slot-index queues, published weights with a version counter, processes from a fork
server, failures, shutdown) is ``zoo.train.actor_pool``'s, shared with GRPO's asynchronous rollouts; here are
IMPALA's slots, each holding one unroll of T steps of one actor's N envs, and the actor that fills them.
Actors thus act with a policy a few updates old, the lag V-trace corrects for (``zoo.rl.vtrace``). Episode
statistics travel as numbers in the slot (count, return sum, length sum).

Episode boundaries are gymnasium 1.x's next-step autoreset, recorded as ``zoo.rl.collector`` does: ``valid``
is False on the reset step that follows an episode end, and an unroll stores T + 1 observations so that the
learner values the observation after every step, the final one of an episode included.

Notation: K slots, T steps per unroll, N envs per actor, B slots per learner batch, M = B x N, O observation
features, A action dims.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from zoo.rl.collector import check_next_step_autoreset, env_actions, with_episode_statistics
from zoo.train import actor_pool
from zoo.train.actor_pool import ActorError, actor_seed

__all__ = ["ActorError", "ActorPool", "EnvSpec", "SharedSlots", "Trajectories", "actor_seed"]


@dataclass(frozen=True)
class EnvSpec:
    """What an actor needs to build its envs, picklable: a DataModule class, its env settings, the spaces."""

    datamodule: type
    settings: dict[str, Any]
    observation_space: gym.Space  # one env's, as the slots are shaped by them
    action_space: gym.Space

    @classmethod
    def of(cls, dm) -> EnvSpec:
        """The env settings of a ``datamodules.GymDataModule`` (its trainer and loaders stay behind)."""
        keys = ("env_id", "env_kwargs", "max_episode_steps", "wrappers")
        return cls(type(dm), {k: getattr(dm, k) for k in keys}, *dm.spaces)

    def make_envs(self, num_envs: int) -> gym.vector.VectorEnv:
        # Sync: the actors are the parallelism, and a daemonic process may not start async envs' workers.
        return self.datamodule(**self.settings).make_envs(num_envs, mode="sync")


@dataclass
class Trajectories:
    """B unrolls side by side, copied out of their slots: T steps of M = B x N envs, time first."""

    obs: Tensor  # (T + 1, M, O) row T: the observation after the last step
    actions: Tensor  # (T, M) int64 or (T, M, A) float, as sampled (before clipping to the action space)
    logprobs: Tensor  # (T, M) log mu(a_t|x_t) under the behaviour policy that acted
    rewards: Tensor  # (T, M)
    terminated: Tensor  # (T, M) bool
    truncated: Tensor  # (T, M) bool
    valid: Tensor  # (T, M) bool: False on autoreset steps
    episodes: Tensor  # (3,) float64: episodes that ended in these unrolls, sum of their returns, of their lengths
    versions: Tensor  # (B,) int64: the policy version each unroll was acted with

    @property
    def env_steps(self) -> int:
        return self.rewards.numel()


def _time_major(x: Tensor) -> Tensor:
    """(B, T, N, ...) -> (T, B x N, ...)."""
    return x.transpose(0, 1).flatten(1, 2)


@dataclass
class SharedSlots:
    """K trajectory slots preallocated in shared memory; an actor fills slot k while only it holds index k."""

    obs: Tensor  # (K, T + 1, N, O)
    actions: Tensor  # (K, T, N) int64 or (K, T, N, A) float32
    logprobs: Tensor  # (K, T, N)
    rewards: Tensor  # (K, T, N)
    terminated: Tensor  # (K, T, N) bool
    truncated: Tensor  # (K, T, N) bool
    valid: Tensor  # (K, T, N) bool
    episodes: Tensor  # (K, 3) float64: episodes ended in the unroll, their return sum, their length sum
    meta: Tensor  # (K, 3) int64: actor, that actor's unroll number, policy version it acted with

    @classmethod
    def allocate(
        cls, num_slots: int, unroll_length: int, num_envs: int, obs_space: gym.Space, action_space: gym.Space
    ) -> SharedSlots:
        t, n = unroll_length, num_envs
        # (T, N) indices of a Discrete action, (T, N, K') of a MultiDiscrete one, (T, N, A) of a Box one.
        dtype = torch.float32 if isinstance(action_space, gym.spaces.Box) else torch.int64
        spec = {
            "obs": ((t + 1, n, *obs_space.shape), torch.float32),
            "actions": ((t, n, *action_space.shape), dtype),
            "logprobs": ((t, n), torch.float32),
            "rewards": ((t, n), torch.float32),
            "terminated": ((t, n), torch.bool),
            "truncated": ((t, n), torch.bool),
            "valid": ((t, n), torch.bool),
            "episodes": ((3,), torch.float64),
            "meta": ((3,), torch.int64),
        }
        return cls(**actor_pool.shared_slots(spec, num_slots))

    def gather(self, indices: list[int], device: torch.device) -> Trajectories:
        """Copies of slots ``indices``, time first, on ``device``; the slots may be refilled once this returns."""
        idx = torch.tensor(indices)
        take = lambda x: _time_major(x[idx]).to(device)  # noqa: E731  x[idx] copies out of shared memory
        return Trajectories(
            take(self.obs),
            take(self.actions),
            take(self.logprobs),
            take(self.rewards),
            take(self.terminated),
            take(self.truncated),
            take(self.valid),
            self.episodes[idx].sum(0),
            self.meta[idx, 2].clone(),
        )


class Actor:
    """One actor's state in its process: envs, a CPU copy of the policy, and the unroll in progress."""

    def __init__(self, rank: int, envs: gym.vector.VectorEnv, policy: nn.Module, slots: SharedSlots, seed: int) -> None:
        check_next_step_autoreset(envs)
        self.rank, self.envs, self.slots = rank, with_episode_statistics(envs), slots
        self.net = copy.deepcopy(policy)  # local memory: acting never reads weights the learner is writing
        self.version = -1
        self.unrolls = 0
        t, n = slots.rewards.shape[1:]
        # The unroll builds up in local buffers and lands in its slot with one copy per field.
        self.obs = np.zeros((t + 1, n, *slots.obs.shape[3:]), dtype=np.float32)
        self.actions = torch.zeros(slots.actions.shape[1:], dtype=slots.actions.dtype)
        self.logprobs = torch.zeros((t, n))
        self.rewards = np.zeros((t, n), dtype=np.float32)
        self.terminated, self.truncated, self.valid = (np.zeros((t, n), dtype=bool) for _ in range(3))
        # Env i of actor r resets with seed + r * N + i: the seeds a single N x num_actors vector env would get.
        self.next_obs, _ = self.envs.reset(seed=seed + rank * n)
        self.next_valid = np.ones(n, dtype=bool)

    @torch.no_grad()
    def fill(self, k: int) -> None:
        """Steps the envs T times and writes the unroll into slot ``k``."""
        space = self.envs.single_action_space
        episodes = np.zeros(3)
        for t in range(self.rewards.shape[0]):
            self.obs[t], self.valid[t] = self.next_obs, self.next_valid
            action, logprob, _, _ = self.net.get_action_and_value(torch.from_numpy(self.obs[t]))
            self.actions[t], self.logprobs[t] = action, logprob
            obs, reward, term, trunc, info = self.envs.step(env_actions(action, space))
            self.rewards[t], self.terminated[t], self.truncated[t] = reward, term, trunc
            self.next_obs, self.next_valid = obs, ~(term | trunc)
            if "_episode" in info:
                done = info["_episode"]
                episodes += (done.sum(), info["episode"]["r"][done].sum(), info["episode"]["l"][done].sum())
        self.obs[-1] = self.next_obs
        s = self.slots
        s.obs[k].copy_(torch.from_numpy(self.obs))
        s.actions[k].copy_(self.actions)
        s.logprobs[k].copy_(self.logprobs)
        s.rewards[k].copy_(torch.from_numpy(self.rewards))
        s.terminated[k].copy_(torch.from_numpy(self.terminated))
        s.truncated[k].copy_(torch.from_numpy(self.truncated))
        s.valid[k].copy_(torch.from_numpy(self.valid))
        s.episodes[k] = torch.from_numpy(episodes)
        s.meta[k] = torch.tensor([self.rank, self.unrolls, self.version])
        self.unrolls += 1

    def close(self) -> None:
        self.envs.close()


def make_actor(env: EnvSpec, num_envs: int, slots: SharedSlots, seed: int, rank: int, shared: nn.Module) -> Actor:
    """Actor ``rank``'s envs and state, built in its process (``actor_pool.run_actor``)."""
    # Sync: the actors are the parallelism, and a daemonic process may not start async envs' workers.
    envs = env.make_envs(num_envs)
    try:
        return Actor(rank, envs, shared, slots, seed)
    except BaseException:
        envs.close()
        raise


class ActorPool(actor_pool.ActorPool):
    """``num_actors`` processes filling ``num_slots`` shared unroll slots; the learner ``take``s batches and
    ``publish``es weights. ``close`` (also on garbage collection and at exit) stops and joins every process."""

    def __init__(
        self,
        env: EnvSpec,
        policy: nn.Module,
        num_actors: int,
        envs_per_actor: int,
        unroll_length: int,
        num_slots: int,
        seed: int,
        start_method: Literal["forkserver", "spawn"] = "forkserver",
    ) -> None:
        """
        Args:
            env: builds each actor's ``envs_per_actor`` envs in its own process.
            policy: the learner's net; a CPU copy in shared memory becomes version 0 of the actors' policy.
            num_actors: actor processes.
            envs_per_actor: N, envs each actor steps together.
            unroll_length: T, steps per env in one slot.
            num_slots: K; at least the largest batch the learner takes, larger lets actors run further ahead.
            seed: env i of actor r resets with seed + r * N + i; actor r samples actions from
                ``actor_seed(seed, r)``.
            start_method: "forkserver" or "spawn" (``zoo.train.actor_pool``).
        """
        self.slots = SharedSlots.allocate(
            num_slots, unroll_length, envs_per_actor, env.observation_space, env.action_space
        )
        build = partial(make_actor, env, envs_per_actor, self.slots, seed)
        preload = [__name__, env.datamodule.__module__]
        super().__init__(build, policy, num_actors, num_slots, seed, preload, "IMPALA actor", start_method)

    def take(self, count: int, device: torch.device | str = "cpu") -> Trajectories:
        """``count`` full slots copied out (time first, on ``device``); their slots go straight back to the actors."""
        if count > self.num_slots:
            raise ValueError(f"a batch of {count} slots from a pool of {self.num_slots} would wait forever")
        self.check()
        indices = [self.get() for _ in range(count)]
        batch = self.slots.gather(indices, torch.device(device))
        for k in indices:
            self.release(k)
        return batch
