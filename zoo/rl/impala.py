"""IMPALAModule: importance-weighted actor-learner architecture (Espeholt et al. 2018) on gymnasium envs.

Actor processes (``zoo.rl.actors.ActorPool``) step their own envs with a CPU copy of the policy and write
unrolls into shared-memory slots; this module is the learner. One Lightning training step takes
``batch_size`` full slots, recomputes the policy and values on them with the current net, corrects for
the actors' stale policy with V-trace (``zoo.rl.vtrace``), makes one optimizer step (manual optimisation),
and publishes the new weights, which the actors copy at their next unroll. Collection and learning overlap:
the actors keep producing while the learner updates, evaluates or checkpoints (until the slots are full).

Checkpoints carry the net, the optimizer, the env-step counter (a buffer; it counts the env steps the
learner has trained on, not those the actors produced and nobody read) and the RNG states; a resumed run
spawns fresh actors on envs seeded from (seed, env_steps). Evaluation and predict run in this process on
envs of their own, as for every agent here (``zoo.rl.lifecycle``). ``total_env_steps`` is the budget;
``val_check_interval`` counts learner steps.

The defaults of the objective and optimizer are torchbeast monobeast's (``--unroll_length`` 80,
``--baseline_cost``, ``--entropy_cost``, ``--grad_norm_clipping`` 40, RMSprop with the paper's settings); the
number of actors and the batch are sized for a small machine; the configs set CartPole's.
Notation: T steps per unroll, B slots per learner step, N envs per actor, M = B x N.
"""

from __future__ import annotations

import time
from typing import Literal

import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from zoo.adapt import Adaptation
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.rl.actors import ActorPool, EnvSpec
from zoo.rl.common import (
    Policy,
    linear_annealing,
    require_datamodule,
    trained,
)
from zoo.rl.lifecycle import HeldLifecycle, Lifecycle
from zoo.rl.nets import ActorCritic
from zoo.rl.vtrace import impala_loss, masked_mean, vtrace
from zoo.train.gradnorm import clip_grad_norm
from zoo.train.logging import lightning_writes
from zoo.train.optim import AdamOrRMSprop


class IMPALAModule(HeldLifecycle, WeightsOnlyLoading, LightningModule):
    """IMPALA's learner: V-trace actor-critic on batches of unrolls from actor processes."""

    def __init__(
        self,
        net: ActorCritic,
        total_env_steps: int = 1_000_000,
        num_actors: int = 2,
        envs_per_actor: int = 8,
        unroll_length: int = 80,
        batch_size: int = 4,
        num_slots: int | None = None,
        start_method: Literal["forkserver", "spawn"] = "forkserver",
        gamma: float = 0.99,
        clip_rho_threshold: float = 1.0,
        clip_pg_rho_threshold: float = 1.0,
        clip_c_threshold: float = 1.0,
        vtrace_lambda: float = 1.0,
        vf_coef: float = 0.5,
        ent_coef: float = 0.0006,
        max_grad_norm: float = 40.0,
        anneal_lr: bool = True,
        optimizer: AdamOrRMSprop = AdamOrRMSprop("rmsprop", lr=4.8e-4, eps=0.01),
        num_threads: int | None = 1,
        adapt: Adaptation | None = None,
    ) -> None:
        """
        Args:
            net: the actor-critic (``zoo.rl.ActorCritic``), sized for the env's spaces.
            total_env_steps: fit stops before a learner step would exceed this many env steps trained on.
            num_actors: actor processes, each with its own envs; about one per spare CPU core.
            envs_per_actor: N, envs each actor steps together (one batched policy forward per step).
            unroll_length: T, steps per env in one unroll (one slot); V-trace bootstraps at its end.
            batch_size: B, unrolls (slots) per learner step: M = B x N trajectories of T steps.
            num_slots: K, shared-memory slots; None: max(2 x num_actors, batch_size), as monobeast's
                ``--num_buffers``. More slots let the actors run further ahead, with a staler policy.
            start_method: how actor processes start, both from a fresh interpreter: "forkserver" imports their
                modules once per learner process (seconds) and forks each actor from there; "spawn" imports
                them in every actor of every fit (``zoo.rl.actors``).
            gamma: discount factor.
            clip_rho_threshold: rho-bar, the truncation of the importance weights in the value targets.
            clip_pg_rho_threshold: rho-bar for the policy-gradient advantages.
            clip_c_threshold: c-bar, the truncation of the trace coefficients c_t.
            vtrace_lambda: scales every c_t (1: the paper's V-trace; below 1, TD(lambda)-like targets).
            vf_coef: weight of the value (baseline) loss.
            ent_coef: weight of the entropy bonus.
            max_grad_norm: global gradient-norm clip.
            anneal_lr: decay the learning rate linearly to 0 over ``total_env_steps`` (monobeast).
            optimizer: the net's optimizer (``zoo.train.optim.AdamOrRMSprop``): RMSprop, the paper's and monobeast's,
                with monobeast's lr 4.8e-4, the paper's decay alpha 0.99 and eps 0.01; ``algorithm: adam`` for Adam.
            num_threads: PyTorch CPU threads of the learner while this module runs (restored after); the
                actors use one each. None: unchanged.
            adapt: what a fine-tune trains (``zoo.adapt.Adaptation``): LoRA adapters on some layers of the net
                (``lora: {r: 8, alpha: 16}``: the hidden layers, not those ``ActorCritic.io_layers`` names: the
                observation's readers and the heads) and the parameters named by ``trainable`` globs
                (``["net.critic.*"]``); None: every weight. The actors act with the adapted net.
        """
        AdamOrRMSprop.of(optimizer)  # a checkpoint's hyperparameters (a dict): checked as the config's are
        super().__init__()
        save_hparams(self, "net")
        self.automatic_optimization = False  # one optimizer step per batch of unrolls, then the weights published
        self.net = net
        self.register_buffer("env_steps", torch.zeros((), dtype=torch.int64))  # trained on, every rank's
        self.lifecycle = Lifecycle(total_env_steps, num_threads)

    @property
    def actors(self) -> ActorPool | None:
        """The actor processes: this agent's collector, while fit runs."""
        return self.lifecycle.collector

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """Actions for raw observations (B, O): the policy's mode, or a sample of it."""
        return self.net.act(torch.as_tensor(obs, dtype=torch.float32, device=self.device), deterministic)

    def policy(self) -> Policy:
        """The deterministic policy on raw observations (what ``zoo.rl.export`` traces)."""
        return Policy(self.net)

    # -- fit: the actor processes, then one V-trace step on B unrolls per training step --------------------------------

    def on_train_start(self) -> None:
        h, dm = self.hparams, require_datamodule(self)
        # B unrolls of T steps of N envs per learner step; rank r's actors take the env seeds after rank r - 1's.
        step, envs = h.batch_size * h.unroll_length * h.envs_per_actor, h.num_actors * h.envs_per_actor
        if (seed := self.lifecycle.start(self, step, envs)) is not None:
            self.lifecycle.collector = ActorPool(
                EnvSpec.of(dm),
                self.net,
                h.num_actors,
                h.envs_per_actor,
                h.unroll_length,
                h.num_slots or max(2 * h.num_actors, h.batch_size),
                seed=seed,
                start_method=h.start_method,
            )

    def training_step(self, batch: int, batch_idx: int) -> None:
        """B unrolls from the actors, one V-trace actor-critic step on them, the new weights published."""
        h, write = self.hparams, lightning_writes(self.trainer)
        t0 = time.perf_counter()
        traj = self.actors.take(h.batch_size, self.device)  # (T, M) of M = B x N trajectories
        waited = time.perf_counter() - t0
        t, m = traj.rewards.shape
        # One forward over all T + 1 observations: the values of row T bootstrap the unroll's end, and its
        # action (a placeholder) scores nothing.
        actions = torch.cat([traj.actions, torch.zeros_like(traj.actions[:1])])  # (T + 1, M, ...)
        _, logprob, entropy, value = self.net.get_action_and_value(traj.obs.flatten(0, 1), actions.flatten(0, 1))
        logprob, entropy, value = logprob.view(t + 1, m)[:-1], entropy.view(t + 1, m)[:-1], value.view(t + 1, m)
        log_rhos = logprob.detach() - traj.logprobs  # (T, M) log pi/mu for the actions the actors took
        discounts = h.gamma * (~traj.terminated).to(value.dtype)
        targets = vtrace(
            log_rhos,
            discounts,
            traj.rewards,
            value.detach(),
            traj.truncated,
            h.clip_rho_threshold,
            h.clip_pg_rho_threshold,
            h.clip_c_threshold,
            h.vtrace_lambda,
        )
        stats = impala_loss(logprob, entropy, value[:-1], targets, traj.valid, h.vf_coef, h.ent_coef)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(stats["loss"])
        stats |= clip_grad_norm(self.net.parameters(), h.max_grad_norm)  # grad/norm before clipping
        opt.step()
        version = self.actors.publish(self.net)

        self.lifecycle.episodes.add_sums(traj.episodes)
        if write:
            with torch.no_grad():
                rhos = log_rhos.exp()
                stats["rho"] = masked_mean(rhos, traj.valid)
                stats["rho_clipfrac"] = masked_mean((rhos > h.clip_rho_threshold).float(), traj.valid)
            # Policy lag: learner updates between the weights an unroll was acted with and the ones it trains.
            stats["policy_lag"] = (version - 1 - traj.versions).float().mean()
            stats["learner_wait_ms"] = torch.tensor(waited * 1e3)
        self.lifecycle.end_step(self, traj.env_steps, stats, write)
        self.lr_schedulers().step()  # the rate for the next step (a function of the env steps spent)

    def configure_optimizers(self):
        h = self.hparams
        # One group, as checkpoints hold it: the parameters that train (all of them unless adapt freezes some).
        opt = AdamOrRMSprop.of(h.optimizer).build(trained(self.net.parameters(), "net"))
        return linear_annealing(opt, lambda: self.lifecycle.progress(self), h.anneal_lr)

    # -- the end of fit, or of a failed one: the lifecycle's -----------------------------------------------------------
