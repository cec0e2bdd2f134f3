"""IMPALA's actors (Espeholt et al. 2018): processes that step their own envs with a slightly stale copy of the
policy and hand whole unrolls to the learner through shared memory. No learnable parameters here: the
learner (``zoo.rl.impala.IMPALAModule``) owns the net and passes it in.

The layout is torchbeast's monobeast (Küttler et al. 2019, "TorchBeast"):
  - ``SharedSlots``: K slots of preallocated tensors in shared memory (``share_memory_``), each holding one
    unroll of T steps of one actor's N envs;
  - two queues of slot *indices*, never tensors: an actor takes a free index, fills that slot and puts the
    index on the full queue; the learner takes ``batch_size`` full indices, copies those slots out and puts
    the indices back on the free queue. An index is in exactly one place at a time (the free queue, one
    actor, the full queue, the learner), so no slot is read while it is being written;
  - the policy's weights in shared memory with a version counter: each actor keeps a CPU copy and refreshes it,
    under a lock, at the start of an unroll when the version has changed. Actors thus act with a policy a
    few updates old, the lag V-trace corrects for (``zoo.rl.vtrace``).
Episode statistics travel as numbers in the slot (count, return sum, length sum); an actor's failure travels
as its traceback text, and the learner raises it.

Processes start fresh, never forked from the learner (whose threads, CUDA context and open files a fork
would copy): through a fork server by default, else spawned. Either way a new interpreter imports torch,
gymnasium and ``zoo.rl`` (and with it Lightning), several seconds on a busy 2-core machine. Spawned, every
actor of every fit pays that; the fork server (started fresh, like a spawned process) imports them once per
learner process and then forks each actor from its clean state in milliseconds, which is what lets the
tests, a resumed fit and the benchmark's seeds start actors again and again. The actors are daemonic (the
interpreter's exit reaps them), ignore SIGINT (Ctrl-C reaches the whole process group; the learner's
handler stops them in order) and leave when the learner's process is gone.

Episode boundaries are gymnasium 1.x's next-step autoreset, recorded as ``zoo.rl.collector`` does: ``valid``
is False on the reset step that follows an episode end, and an unroll stores T + 1 observations so that the
learner values the observation after every step, the final one of an episode included.

Notation: K slots, T steps per unroll, N envs per actor, B slots per learner batch, M = B x N, O observation
features, A action dims.
"""

from __future__ import annotations

import copy
import os
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn

from zoo.rl.collector import check_next_step_autoreset, env_actions, with_episode_statistics


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
        k, t, n = num_slots, unroll_length, num_envs
        # (K, T, N) indices of a Discrete action, (K, T, N, K') of a MultiDiscrete one, (K, T, N, A) of a Box one.
        dtype = torch.float32 if isinstance(action_space, gym.spaces.Box) else torch.int64
        actions = torch.zeros((k, t, n, *action_space.shape), dtype=dtype)
        slots = cls(
            obs=torch.zeros((k, t + 1, n, *obs_space.shape)),
            actions=actions,
            logprobs=torch.zeros((k, t, n)),
            rewards=torch.zeros((k, t, n)),
            terminated=torch.zeros((k, t, n), dtype=torch.bool),
            truncated=torch.zeros((k, t, n), dtype=torch.bool),
            valid=torch.zeros((k, t, n), dtype=torch.bool),
            episodes=torch.zeros((k, 3), dtype=torch.float64),
            meta=torch.zeros((k, 3), dtype=torch.int64),
        )
        for f in fields(slots):
            getattr(slots, f.name).share_memory_()
        return slots

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

    def refresh(self, shared: nn.Module, version: Tensor, lock) -> None:
        """Copies the learner's published weights when their version has moved on (torchbeast copies always)."""
        if int(version) != self.version:
            with lock:
                self.net.load_state_dict(shared.state_dict())
                self.version = int(version)

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


def actor_seed(seed: int, rank: int) -> int:
    """The torch seed of actor ``rank``'s action sampling."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def run_actor(
    rank: int,
    env: EnvSpec,
    num_envs: int,
    shared: nn.Module,
    version: Tensor,
    lock,
    slots: SharedSlots,
    free,
    full,
    errors,
    stop,
    seed: int,
) -> None:
    """An actor process's body: fill free slots until told to stop, or the learner's process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited from ActorPool's start too; the learner stops us
    torch.set_num_threads(1)  # an (N, O) forward gains nothing from more, and the actors share the cores
    envs, learner = None, mp.parent_process()  # the process that started us, also through a fork server
    try:
        envs = env.make_envs(num_envs)
        torch.manual_seed(actor_seed(seed, rank))
        actor = Actor(rank, envs, shared, slots, seed)
        while not stop.is_set() and learner.is_alive():
            try:
                k = free.get(timeout=0.1)
            except queue.Empty:
                continue
            actor.refresh(shared, version, lock)
            actor.fill(k)
            full.put(k)
    except Exception:
        errors.put((rank, traceback.format_exc()))
    finally:
        full.cancel_join_thread()  # exiting must not wait on a queue nobody reads any more
        if envs is not None:
            envs.close()


class ActorError(RuntimeError):
    """An actor process failed; the message carries its traceback or exit code."""


class ActorPool:
    """``num_actors`` processes filling ``num_slots`` shared slots; the learner ``take``s batches and ``publish``es
    weights. ``close`` (also on garbage collection and at exit) stops and joins every process."""

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
            start_method: "forkserver" imports the actors' modules once per learner process, "spawn" once per
                actor (see above). Both start from a fresh interpreter, safe under the CLI, pytest and CUDA.
        """
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            start_fork_server(ctx, ["__main__", __name__, env.datamodule.__module__])
        self.slots = SharedSlots.allocate(
            num_slots, unroll_length, envs_per_actor, env.observation_space, env.action_space
        )
        self.shared = copy.deepcopy(policy).cpu().requires_grad_(False).share_memory()
        self.version = torch.zeros((), dtype=torch.int64).share_memory_()
        self.lock = ctx.Lock()
        self.free, self.full, self.errors, self.stop = ctx.Queue(), ctx.Queue(), ctx.SimpleQueue(), ctx.Event()
        for k in range(num_slots):
            self.free.put(k)
        self.processes = [
            ctx.Process(
                target=run_actor,
                name=f"impala-actor-{r}",
                daemon=True,
                args=(
                    r,
                    env,
                    envs_per_actor,
                    self.shared,
                    self.version,
                    self.lock,
                    self.slots,
                    self.free,
                    self.full,
                    self.errors,
                    self.stop,
                    seed,
                ),
            )
            for r in range(num_actors)
        ]
        self._close = weakref.finalize(self, _shutdown, self.stop, self.processes, (self.free, self.full))
        with sigint_ignored():
            for p in self.processes:
                p.start()

    @property
    def num_slots(self) -> int:
        return self.slots.rewards.shape[0]

    def get(self) -> int:
        """The index of a full slot, waiting for one; raises ``ActorError`` when an actor has died."""
        while True:
            try:
                return self.full.get(timeout=0.05)
            except queue.Empty:
                self.check()

    def release(self, k: int) -> None:
        """Hands slot ``k`` back to the actors."""
        self.free.put(k)

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

    @torch.no_grad()
    def publish(self, net: nn.Module) -> int:
        """Copies ``net``'s weights to the actors' shared policy; they pick it up at their next unroll."""
        with self.lock:
            for dst, src in zip(self.shared.state_dict().values(), net.state_dict().values()):
                dst.copy_(src)
            self.version += 1
        return int(self.version)

    def check(self) -> None:
        """Raises ``ActorError`` with the traceback (or exit code) of an actor that has stopped."""
        dead = [(r, p) for r, p in enumerate(self.processes) if not p.is_alive()]
        if not dead and self.errors.empty():
            return
        if not self.errors.empty():
            rank, text = self.errors.get()
            raise ActorError(f"IMPALA actor {rank} failed:\n{text}")
        r, p = dead[0]
        raise ActorError(f"IMPALA actor {r} (pid {p.pid}) exited with code {p.exitcode} while the learner ran")

    def close(self) -> None:
        """Stops and joins the actors (idempotent)."""
        self._close()


def start_fork_server(ctx, preload: list[str]) -> None:
    """Starts the fork server with ``preload`` imported, unless it runs already (then it keeps its modules)."""
    from multiprocessing import forkserver

    ctx.set_forkserver_preload(preload)
    # Before Python 3.12.8 the server is handed the learner's sys.path but does not apply it, so preloading what
    # only a run-time path makes importable (pytest's rootdir, a script's sys.path.insert) fails silently and
    # every actor imports it again; PYTHONPATH is the workaround CPython's fix names (gh-117378).
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        with sigint_ignored():  # the server hands its SIGINT disposition down to the actors it forks
            forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


@contextmanager
def sigint_ignored():
    """SIGINT ignored in this process meanwhile, a disposition the processes it starts inherit: a Ctrl-C while an
    actor imports would otherwise kill it with a traceback before ``run_actor`` can ignore it."""
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, before)


def _shutdown(stop, processes: list, queues: tuple, timeout: float = 5.0) -> None:
    stop.set()
    deadline = time.monotonic() + timeout
    for p in processes:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.pid is not None and p.is_alive():  # stuck in an env step: no longer our problem to wait for
            p.kill()
            p.join()
    for q in queues:
        q.cancel_join_thread()
        q.close()
