"""What SAC and TD3 share around their updates, held as functions of the agent: the envs and the replay buffer at the
start of fit, SB3's schedule of env steps and updates in one training step, and one optimizer step with its gradient
norm. Each agent's file keeps its own update (the losses, their order, the targets' Polyak step)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from zoo.rl.common import require_datamodule, separate_backwards, world_size
from zoo.rl.replay import ReplayBuffer, TransitionCollector
from zoo.train.gradnorm import grad_norm
from zoo.train.logging import lightning_writes

Update = Callable[[int, bool], dict[str, Tensor]]  # (update number from 1, measure gradient norms) -> its terms


def start(module: LightningModule, agent: str) -> None:
    """Fit's start: the DDP setting of several backwards, then (unless the budget is spent) the vector envs and the
    replay buffer, a checkpoint's rows in it when fit resumes with them."""
    separate_backwards(module, agent)
    h, dm, lifecycle = module.hparams, require_datamodule(module), module.lifecycle
    if (seed := lifecycle.start(module, h.steps_per_batch * dm.num_envs)) is not None:
        buffer = lifecycle.replay(
            module,
            lambda: ReplayBuffer(h.buffer_size, module.net.obs_dim, device=module.device, action_space=dm.spaces[1]),
        )
        lifecycle.collector = TransitionCollector(dm.make_envs(), buffer, module.device, seed, h.norm_obs)


def collect_and_update(module: LightningModule, explore: Callable[[Tensor], Tensor], update: Update) -> None:
    """One training step: ``steps_per_batch`` vector-env steps, uniform actions before ``learning_starts`` and
    ``explore``'s after, each followed by ``gradient_steps`` calls of ``update`` every ``train_freq`` vector steps once
    past ``learning_starts`` with a full minibatch (SB3's schedule); gradient norms measured when Lightning writes
    this step's logs, the only steps whose values it keeps."""
    h, lifecycle, write = module.hparams, module.lifecycle, lightning_writes(module.trainer)
    collector = lifecycle.collector
    # Python counters inside the loop, written back once: no tensor op (or device sync) per env step. env_steps counts
    # every rank's steps (each rank steps its n envs at once), as the budget does, so that every rank takes the same
    # decisions: under DDP each update's backwards average over the ranks.
    env_steps, updates, n = int(module.env_steps), int(module.updates), collector.num_envs
    stride = n * world_size(module)
    stats: dict[str, Tensor] = {}
    for _ in range(h.steps_per_batch):
        collector.step(explore if env_steps >= h.learning_starts else None)
        env_steps += stride
        if (
            env_steps > h.learning_starts
            and (env_steps // stride) % h.train_freq == 0
            and lifecycle.replay_ready(module, h.batch_size)
        ):
            for _ in range(h.gradient_steps):
                updates += 1
                stats |= update(updates, write)  # the latest of each term (TD3's actor terms come every few)
    module.updates.fill_(updates)
    if h.norm_obs:
        module.obs_rms.update(collector.pop_observations())
    lifecycle.episodes.add(*collector.pop_episodes())
    if write:
        stats["buffer_size"] = torch.tensor(float(len(collector.buffer)))
    lifecycle.end_step(module, n * h.steps_per_batch, stats, write)


def optimizer_step(
    module: LightningModule, opt, loss: Tensor, params, name: str, grads: dict[str, Tensor] | None
) -> None:
    """One optimizer step on ``loss``; the gradient norm of ``params`` (``grad/norm/<name>``) goes into ``grads``
    when given, measured between backward and step as for every family."""
    opt.zero_grad()
    module.manual_backward(loss)
    if grads is not None:
        grads |= grad_norm(params, name=name)
    opt.step()
