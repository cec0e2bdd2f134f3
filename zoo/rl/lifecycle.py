"""The lifecycle every RL agent shares, as one object the agent holds and calls from its hooks (``Lifecycle``).

An agent's file (``ppo.py``, ``a2c.py``, ``impala.py``, ``sac.py``, ``td3.py``) shows its hyperparameters, its step,
its update and its optimizers, as CleanRL's do; what happens around them is the same for every agent and is here: the
env-step budget, the RNG states saved and resumed, the training collector (and an off-policy agent's replay buffer)
opened and closed, the episode log, evaluation, the checkpoint state beside the state dict and the thread count. The
module keeps what its state dict carries (the ``env_steps`` buffer, nets, normalisers); the lifecycle what lives only
while fit runs. Under DDP each rank collects its own data (``zoo.rl.distributed``): seeds offset by rank, RNG forked,
the env-step counter and the budget global (a sum over ranks after each training step).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule
from torch import Tensor

from zoo.errors import InputError
from zoo.io.weights import extract_state_dict, load_file, readable
from zoo.rl.common import (
    Evaluation,
    adapt_agent,
    check_action_bounds,
    check_box,
    check_env,
    check_net_state,
    datamodule_of,
    refuse_sharding,
    require_datamodule,
    world_size,
)
from zoo.rl.distributed import fork_rng, sum_over_ranks

if TYPE_CHECKING:
    from zoo.rl.replay import ReplayBuffer

# -- the parts: budget, seeds, RNG, threads, episodes -----------------------------------------------------------


class Budget:
    """The env-step budget ``total_env_steps``: fit stops before a training step would exceed it. The spent count is
    the module's ``env_steps`` buffer (so checkpoints carry it), the same global count on every rank."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.step = 0  # env steps of one training step, every rank's together; set once the envs are known

    def progress(self, env_steps: Tensor) -> float:
        """Fraction spent, for the linear annealings of learning rate and clipping."""
        return min(1.0, int(env_steps) / self.total)

    def fits(self, env_steps: Tensor) -> bool:
        """Whether one more training step fits: every rank takes the same decision, as it holds the same count."""
        return int(env_steps) + self.step <= self.total

    def spend(self, env_steps: Tensor, mine: int) -> None:
        """Adds every rank's ``mine`` (this process's env steps) to ``env_steps``: a collective under DDP."""
        env_steps += sum_over_ranks(torch.tensor(mine, dtype=env_steps.dtype, device=env_steps.device))


def train_seed(seed: int, env_steps: int, rank: int = 0, envs_per_rank: int = 0) -> int:
    """``seed`` for a fresh run; a resumed run's new episodes get a seed drawn from (seed, env steps). Rank r of a DDP
    run adds r x ``envs_per_rank``: its envs take the seeds that follow rank r - 1's."""
    base = seed if env_steps == 0 else int(np.random.SeedSequence([seed, env_steps]).generate_state(1)[0])
    return base + rank * envs_per_rank


def rng_state() -> dict:
    """The global RNG states, in types a weights-only checkpoint load accepts."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    random.setstate(tuple(tuple(s) if isinstance(s, list) else s for s in state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RNGState:
    """The global RNGs of a run: saved in each checkpoint, put back when fit resumes from one, forked per rank."""

    def __init__(self) -> None:
        self._to_restore: dict | None = None

    def save(self, checkpoint: dict) -> None:
        checkpoint["rng"] = rng_state()

    def load(self, checkpoint: dict) -> None:
        """Keeps a checkpoint's state for ``resume``: applied only when fit resumes, never by a plain load."""
        self._to_restore = checkpoint.get("rng")

    def resume(self, rank: int) -> None:
        """At train start (the device final, a resumed checkpoint loaded): rank 0's saved state back, then rank r > 0
        forks its own stream from it."""
        if self._to_restore is not None:
            set_rng_state(self._to_restore)
            self._to_restore = None
        fork_rng(rank)


class Threads:
    """torch's CPU thread count pinned while a module runs, restored after; None leaves it alone."""

    def __init__(self, num_threads: int | None) -> None:
        self.num_threads, self._before = num_threads, None

    def pin(self) -> None:
        if self.num_threads and self._before is None:
            self._before = torch.get_num_threads()
            torch.set_num_threads(self.num_threads)

    def restore(self) -> None:
        if self._before is not None:
            torch.set_num_threads(self._before)
            self._before = None


# -- logging ---------------------------------------------------------------------------------------------------


class EpisodeLog:
    """Undiscounted returns and lengths of the training episodes that ended since the last log (float64 sums)."""

    def __init__(self) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64)  # count, return sum, length sum

    def add(self, returns: Tensor, lengths: Tensor) -> None:
        count = torch.tensor(float(len(returns)), dtype=torch.float64)
        self.sums += torch.stack([count, returns.double().sum(), lengths.double().sum()])

    def add_sums(self, sums: Tensor) -> None:
        """Episodes already summed elsewhere (an actor process): (count, return sum, length sum)."""
        self.sums += sums

    def pop(self) -> dict[str, Tensor]:
        """``episode_return`` and ``episode_length`` means, or nothing when no episode ended; then starts afresh."""
        count, returns, lengths = self.sums.tolist()
        self.sums.zero_()
        if not count:
            return {}
        return {"episode_return": torch.tensor(returns / count), "episode_length": torch.tensor(lengths / count)}


def train_metrics(stats: dict[str, Tensor], env_steps: Tensor) -> dict[str, Tensor]:
    """A training step's figures under ``train/`` (gradient norms keep their ``grad/``), with the env steps."""
    return {
        **{k if k.startswith("grad/") else f"train/{k}": v for k, v in stats.items()},
        "train/env_steps": env_steps.float(),
    }


# -- the lifecycle ----------------------------------------------------------------------------------------------


class Lifecycle:
    """An agent's fit from setup to teardown: the budget, RNG resume, the training collector (and an off-policy
    agent's replay buffer), the episode log, evaluation, the checkpoint state beside the state dict and the thread
    count. The agent holds one and calls it from its hooks; the module's ``env_steps`` buffer is the budget's count."""

    def __init__(
        self, total_env_steps: int, num_threads: int | None, save_buffer: bool = False, targets: tuple[str, ...] = ()
    ) -> None:
        """
        Args:
            total_env_steps: the budget (``Budget``).
            num_threads: torch's CPU threads while the module runs (``Threads``).
            save_buffer: put the replay buffer in checkpoints (an off-policy agent's ``save_buffer``).
            targets: the module's target nets (SAC's, TD3's Polyak copies), which ``adapt`` leaves alone
                (``adapt_agent``).
        """
        self.targets = targets
        self.budget, self.rng, self.threads = Budget(total_env_steps), RNGState(), Threads(num_threads)
        self.evaluation, self.episodes = Evaluation(), EpisodeLog()
        self.collector = None  # the training envs (a rollout or transition collector, actor processes) while fit runs
        self.buffer: ReplayBuffer | None = None  # an off-policy agent's, kept from one fit to the next
        self.save_buffer = save_buffer
        self._buffer_to_restore: dict | None = None  # a checkpoint's, put in the buffer when fit resumes
        self._ready = False  # every rank's replay buffer holds a minibatch (``replay_ready``)

    def setup(self, module: LightningModule, box: str | None = None) -> None:
        """Refuses sharding, pins the thread count, loads ``init_weights``, applies the module's ``adapt`` setting and
        checks the net against the env; ``box``, the agent's name when it acts in continuous actions only, also checks
        the action space and the actor's bounds."""
        refuse_sharding(module)
        self.threads.pin()
        dm = datamodule_of(module)
        self.load_init_weights(module, dm)
        adapt_agent(module, self.targets)  # the weights are final: init_weights, or from_pretrained after __init__
        if dm is not None:
            if box is not None:
                check_box(box, dm.env_id, dm.spaces[1])
            check_env(module.net, dm)  # sized by whoever built the net (cli.py: from the env); checked here
            if box is not None:
                check_action_bounds(module.net.actor, dm.env_id, dm.spaces[1])

    @staticmethod
    def load_init_weights(module: LightningModule, dm) -> None:
        """The agent's ``init_weights`` into it, once: never over a checkpoint's weights (``skip_init_weights``), nor
        again at a later stage of the same module. An SB3 zip (``zoo.rl.sb3``) into its nets, the env checked against
        it, the VecNormalize statistics beside it into ``obs_rms`` (``zoo.rl.sb3_statistics.load_statistics``); a zoo
        agent's weights (a checkpoint, a registered model's ``weights.safetensors``) into the whole module,
        observation statistics included, exactly (the env is checked against the net at setup)."""
        path = module.hparams.get("init_weights")
        if path and not getattr(module, "_init_loaded", False):
            path = readable(path)
            if str(path).endswith(ZOO_WEIGHTS):
                load_zoo_agent(module, path)
            else:
                from zoo.rl.sb3 import load_init_weights
                from zoo.rl.sb3_statistics import (
                    load_statistics,
                )  # the importers name the agents, which import this file

                load_init_weights(module, path, (*dm.spaces, dm.env_id) if dm is not None else None)
                load_statistics(module, path)
            module._init_loaded = True

    def start(self, module: LightningModule, step_env_steps: int, envs_per_rank: int | None = None) -> int | None:
        """At train start, where the device is final and a resumed checkpoint (env steps, RNG, buffer) is loaded: the
        RNG states put back, the budget's step set to ``step_env_steps`` (one rank's env steps per training step) x
        the ranks. Returns the seed of this rank's training envs (``envs_per_rank`` of them, the DataModule's
        ``num_envs`` when None) when the agent is to open its collector, or None: the collector is open already, or
        the budget is spent (a resumed run; fit stops before opening any env)."""
        dm = require_datamodule(module)
        self.rng.resume(module.global_rank)
        self.budget.step = step_env_steps * world_size(module)
        if not self.budget.fits(module.env_steps):
            module.trainer.should_stop = True
            return None
        if self.collector is not None:
            return None
        return train_seed(dm.seed, int(module.env_steps), module.global_rank, envs_per_rank or dm.num_envs)

    def replay(self, module: LightningModule, new: Callable[[], ReplayBuffer]) -> ReplayBuffer:
        """The replay buffer on the module's device: an earlier fit's or ``new()``, a checkpoint's rows put in."""
        if self.buffer is None:
            self.buffer = new()
        self.buffer.to(module.device)  # one kept from an earlier fit on another device
        if self._buffer_to_restore is not None:
            self.buffer.load_state_dict(self._buffer_to_restore)
            self._buffer_to_restore = None
        self._ready = False
        return self.buffer

    def replay_ready(self, module: LightningModule, batch_size: int) -> bool:
        """Whether every rank's buffer holds a minibatch (autoreset steps are not stored, so the ranks' sizes can
        differ); a collective under DDP until it first holds, which it then does for good."""
        if not self._ready:
            enough = torch.tensor(int(len(self.buffer) >= batch_size), device=module.device)
            self._ready = int(sum_over_ranks(enough)) == world_size(module)
        return self._ready

    def end_step(self, module: LightningModule, env_steps: int, stats: dict[str, Tensor], write: bool) -> None:
        """After a training step's update: this rank's ``env_steps`` spent (a collective under DDP), the step's
        figures and the ended episodes logged when Lightning writes them, fit stopped before a step would exceed
        the budget."""
        self.budget.spend(module.env_steps, env_steps)
        if write:
            metrics = train_metrics({**stats, **self.episodes.pop()}, module.env_steps)
            module.log_dict(metrics, on_step=True, on_epoch=False)
        if not self.budget.fits(module.env_steps):
            module.trainer.should_stop = True

    def progress(self, module: LightningModule) -> float:
        """Fraction of the budget spent, for the linear annealings."""
        return self.budget.progress(module.env_steps)

    def validate(self, module: LightningModule) -> None:
        """The evaluation episodes' figures, logged. Every rank holds the same ones (gathered episodes, global env
        steps): sync_dist averages equal values."""
        metrics = self.evaluation.validate(module, require_datamodule(module), module.env_steps)
        module.log_dict(metrics, batch_size=1, prog_bar=True, sync_dist=True)

    def predict(self, module: LightningModule) -> dict[str, Tensor]:
        return self.evaluation.predict(module, require_datamodule(module))

    def save(self, checkpoint: dict) -> None:
        """What a checkpoint carries beside the state dict: the RNG states and, with ``save_buffer``, the buffer."""
        self.rng.save(checkpoint)
        if self.save_buffer and self.buffer is not None:
            checkpoint["replay_buffer"] = self.buffer.state_dict()

    def load(self, module: LightningModule, checkpoint: dict) -> None:
        """A checkpoint's net checked against the module's (adapted as its ``adapt`` says) before Lightning loads it;
        its RNG states and replay buffer kept until fit resumes (never applied by a plain load)."""
        adapt_agent(module, self.targets)  # the checkpoint's adapter keys meet adapted layers
        check_net_state(module.net, checkpoint)
        self.rng.load(checkpoint)
        self._buffer_to_restore = checkpoint.get("replay_buffer")

    def callbacks(self) -> list[Callback]:
        return [StopCollectingOnException(self)]

    def stop_collecting(self) -> None:
        if self.collector is not None:
            self.collector.close()
            self.collector = None

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.stop_collecting()
        self.evaluation.close()
        self.threads.restore()


class StopCollectingOnException(Callback):
    """Closes an agent's collector (envs, actor processes) when fit fails or is interrupted: Lightning then skips the
    module's ``teardown`` hook, which closes it on a normal exit."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle

    def on_exception(self, trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.lifecycle.stop_collecting()


ZOO_WEIGHTS = (".ckpt", ".pt", ".pth", ".safetensors")  # a zoo agent's checkpoint or registered weights, not a zip


def load_zoo_agent(module: LightningModule, path) -> None:
    """Every tensor of a zoo agent's weights at ``path`` into ``module``, which must have the same ones at the same
    shapes (the same algorithm, a net of the same sizes); else one line naming what differs."""
    theirs, own = extract_state_dict(load_file(path)), module.state_dict()
    unused, unset = sorted(theirs.keys() - own.keys()), sorted(own.keys() - theirs.keys())
    both = sorted(own.keys() & theirs.keys())
    shapes = [
        f"{k} {tuple(theirs[k].shape)} for {tuple(own[k].shape)}" for k in both if theirs[k].shape != own[k].shape
    ]
    parts = [
        f"{what}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
        for what, names in (("tensors it has no place for", unused), ("tensors unset", unset), ("shapes", shapes))
        if names
    ]
    if parts:
        raise InputError(
            f"init_weights {str(path)!r} is not an agent of this one's algorithm and net ({'; '.join(parts)}): start "
            f"from weights of a {type(module).__name__} of these sizes"
        )
    module.load_state_dict(theirs)


class HeldLifecycle:
    """The Lightning hooks every agent answers with its ``self.lifecycle`` alone, mixed in before the module's base
    classes: an agent's file keeps only the hooks that are its own (its step, update and optimizers). ``BOX``: the
    agent whose action space must be a bounded Box (``Lifecycle.setup``), None for any."""

    BOX: str | None = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)  # the zoo version that wrote it (zoo.io.checkpoint)
        self.lifecycle.save(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.lifecycle.load(self, checkpoint)

    def validation_step(self, batch: int, batch_idx: int) -> None:
        self.lifecycle.validate(self)

    def predict_step(self, batch: int, batch_idx: int) -> dict[str, Tensor]:
        return self.lifecycle.predict(self)

    def setup(self, stage: str) -> None:
        self.lifecycle.setup(self, box=self.BOX)

    def configure_callbacks(self) -> list[Callback]:
        return self.lifecycle.callbacks()

    def teardown(self, stage: str) -> None:
        self.lifecycle.teardown(stage)
