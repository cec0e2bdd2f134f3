"""SACModule: soft actor-critic with a learned temperature (Haarnoja et al. 2018) on gymnasium vector envs.

One Lightning training step is ``steps_per_batch`` env steps, each followed by its gradient updates, with
manual optimisation (actor, critics and temperature have an optimizer each). An update costs a few
milliseconds on a CPU and Lightning's per-step overhead ~0.4-1 ms, so a Lightning step per env step would
cost SAC a tenth of its speed; here that overhead is paid once per ``steps_per_batch`` env steps. The
training loader only paces the steps (``datamodules.gym``); the module owns a ``TransitionCollector`` over the
DataModule's training envs and a ``ReplayBuffer``; ``zoo.rl.agent.AgentModule`` evaluates, predicts and checkpoints.

One update, in SB3's order (``SAC.train``; CleanRL's ``sac_continuous_action.py`` differs only in where the
temperature step falls):
  1. a ~ pi(.|s) reparameterised on a replay minibatch; the temperature steps on its log-probabilities;
  2. the critics step towards y = r + gamma (1 - terminated) (min_k Q_targ_k(s', a') - alpha log pi(a'|s'));
  3. the actor steps on mean(alpha log pi(a|s) - min_k Q_k(s, a)), through the just-updated critics;
  4. the target critics move towards the critics by Polyak averaging, theta' <- (1 - tau) theta' + tau theta.
Before ``learning_starts`` env steps the actions are uniformly random (SB3, CleanRL) and nothing is updated.

Checkpoints carry what acting and resuming need: the nets and the target critics, log alpha, the running
observation statistics, the env-step and update counters (buffers), the three optimizers, the RNG states and,
with ``save_buffer``, the replay buffer. A resumed run restarts the episodes that were in flight, on envs seeded
from (seed, env_steps); without the buffer it acts with its policy and updates again once it has refilled
``batch_size`` transitions.

Under manual optimisation ``trainer.global_step`` counts optimizer steps (up to three per update), so the
budget is ``total_env_steps`` and ``val_check_interval`` counts training steps (of ``steps_per_batch`` each).
Notation: B minibatch rows, N envs, O observation features, A action dims, K critics.
"""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from zoo.layers.compat import foreach_lerp_
from zoo.layers.gradnorm import grad_norm
from zoo.layers.hparams import save_hparams
from zoo.rl.agent import AgentModule
from zoo.rl.distributed import sum_over_ranks
from zoo.rl.losses import sac_actor_loss, sac_critic_loss, sac_temperature_loss, soft_q_target
from zoo.rl.normalization import RunningMeanStd
from zoo.rl.replay import ReplayBuffer, TransitionCollector
from zoo.rl.sac_nets import SoftActorCritic


class SACModule(AgentModule):
    """SAC with twin critics, Polyak-averaged targets, automatic entropy temperature and random warm-up."""

    def __init__(
        self,
        net: SoftActorCritic,
        total_env_steps: int = 100_000,
        steps_per_batch: int = 100,
        buffer_size: int = 1_000_000,
        learning_starts: int = 5_000,
        batch_size: int = 256,
        gamma: float = 0.99,
        tau: float = 0.005,
        train_freq: int = 1,
        gradient_steps: int = 1,
        target_update_interval: int = 1,
        actor_lr: float = 3e-4,
        critic_lr: float = 3e-4,
        alpha_lr: float = 3e-4,
        init_alpha: float = 1.0,
        autotune: bool = True,
        target_entropy: float | None = None,
        norm_obs: bool = False,
        clip_obs: float = 10.0,
        save_buffer: bool = False,
        num_threads: int | None = 1,
    ) -> None:
        """
        Args:
            net: actor and twin critics (``zoo.rl.SoftActorCritic``), sized and bounded for the env.
            total_env_steps: fit stops before a training step would exceed this many env steps (all envs together).
            steps_per_batch: vector-env steps per Lightning training step, each followed by its updates.
            buffer_size: replay capacity in transitions; the oldest are overwritten first.
            learning_starts: env steps of uniformly random actions, without updates, before learning starts.
            batch_size: transitions per update, sampled uniformly from the buffer.
            gamma: discount factor.
            tau: Polyak coefficient of the target critics (SAC's 0.005).
            train_freq: vector-env steps between two rounds of updates (SB3's ``train_freq``).
            gradient_steps: updates per round (SB3's ``gradient_steps``); 1 with train_freq 1 is one per step.
            target_update_interval: updates between two Polyak steps of the target critics.
            actor_lr: Adam learning rate of the actor.
            critic_lr: Adam learning rate of the critics (CleanRL: 1e-3 for critics and alpha, 3e-4 for the actor).
            alpha_lr: Adam learning rate of log alpha.
            init_alpha: the temperature alpha at the start (SB3's "auto" and CleanRL start at 1).
            autotune: learn alpha to hold the policy's entropy at ``target_entropy``; False keeps ``init_alpha``.
            target_entropy: the entropy alpha aims for; None takes -A, the heuristic of Haarnoja et al. 2018.
            norm_obs: feed the nets observations normalised by running statistics kept in this module; the
                buffer stores raw observations, normalised when sampled (as SB3's VecNormalize with replay).
            clip_obs: clip normalised observations to [-clip_obs, clip_obs].
            save_buffer: put the replay buffer in checkpoints, so that a resumed run continues with it.
            num_threads: PyTorch CPU threads while this module runs (restored after); on a shared CPU one thread
                runs these 256-wide MLPs fastest, as threads that wait on each other cost more than they share.
                None: unchanged.
        """
        super().__init__(num_threads)
        save_hparams(self, "net")
        self.net = net
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)))
        if not net.unsized:
            self.net_sized()
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))
        self.buffer: ReplayBuffer | None = None
        self._ready = False  # the replay buffers hold a minibatch (see _buffer_ready)
        self._buffer_to_restore: dict | None = None  # set by on_load_checkpoint, applied when fit starts

    def net_sized(self) -> None:
        h = self.hparams
        # The targets are a copy that only Polyak averaging moves; a submodule, so checkpoints carry them.
        self.critic_target = copy.deepcopy(self.net.critic).requires_grad_(False)
        self.target_entropy = float(-self.net.action_dim if h.target_entropy is None else h.target_entropy)
        self.obs_rms = RunningMeanStd((self.net.obs_dim,), clip=h.clip_obs)

    def _explore(self, obs: Tensor) -> Tensor:
        return self.act(obs, deterministic=False)

    # -- setup -------------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        dm = self.datamodule()
        if dm is not None and not isinstance(dm.spaces[1], gym.spaces.Box):
            raise ValueError(f"SAC acts in continuous (Box) action spaces; {dm.env_id} has {dm.spaces[1]}")
        super().setup(stage)  # sizes a net built without its sizes, then checks them against the env
        if dm is not None:
            self._check_bounds(dm.env_id, dm.spaces[1])

    def _check_bounds(self, env_id: str, space: gym.spaces.Box) -> None:
        actor = self.net.actor
        low = (actor.action_bias - actor.action_scale).cpu().numpy()
        high = (actor.action_bias + actor.action_scale).cpu().numpy()
        if low.shape != space.low.shape or not (np.allclose(low, space.low) and np.allclose(high, space.high)):
            fix = (f"--model.init_args.net.init_args.action_low={space.low.tolist()} "
                   f"--model.init_args.net.init_args.action_high={space.high.tolist()}")
            raise ValueError(f"{env_id} acts in [{space.low}, {space.high}], the actor in [{low}, {high}]: pass {fix}")

    def on_train_start(self) -> None:
        # DDP averages the gradients of each backward, and SAC's three backwards (temperature, critics, actor)
        # each reach one part of the module: DDP allows that only when it looks for the unused parameters.
        if self.world_size > 1 and not getattr(self.trainer.model, "find_unused_parameters", True):
            raise ValueError("SAC under DDP makes backwards that reach one net each: pass "
                             "--trainer.strategy=ddp_find_unused_parameters_true")
        super().on_train_start()

    def start_collecting(self, dm) -> TransitionCollector:
        """The replay buffer (a checkpoint's, when fit resumes with one) and the collector that fills it."""
        h = self.hparams
        if self.buffer is None:
            self.buffer = ReplayBuffer(h.buffer_size, self.net.obs_dim, self.net.action_dim, self.device)
        self.buffer.to(self.device)  # one kept from an earlier fit on another device
        if self._buffer_to_restore is not None:
            self.buffer.load_state_dict(self._buffer_to_restore)
            self._buffer_to_restore = None
        self._ready = False
        return TransitionCollector(dm.make_envs(), self.buffer, self.device, self.train_seed(dm), h.norm_obs)

    @property
    def batch_env_steps(self) -> int:
        return self.hparams.steps_per_batch * self.require_datamodule().num_envs

    def learn(self, write: bool) -> dict[str, Tensor]:
        """``steps_per_batch`` vector-env steps, each followed by its updates (gradient norms measured when
        ``write``, the only steps whose values Lightning keeps)."""
        h, collector = self.hparams, self.collector
        optimizers = self.optimizers()
        # Python counters inside the loop, written back once: no tensor op (or device sync) per env step.
        # env_steps counts every rank's steps (each rank steps its n envs at once), as the budget does, so that
        # every rank takes the same decisions: under DDP each update's backwards average over the ranks.
        env_steps, updates, n = int(self.env_steps), int(self.updates), collector.num_envs
        stride = n * self.world_size
        stats: dict[str, Tensor] = {}
        for _ in range(h.steps_per_batch):
            collector.step(self._explore if env_steps >= h.learning_starts else None)
            env_steps += stride
            # SB3's rule: train every train_freq vector steps once past learning_starts, given a full minibatch.
            if (env_steps > h.learning_starts and (env_steps // stride) % h.train_freq == 0
                    and self._buffer_ready()):
                for _ in range(h.gradient_steps):
                    updates += 1
                    stats = self._update(*optimizers, polyak=updates % h.target_update_interval == 0, measure=write)
        self.env_steps += n * h.steps_per_batch  # this process's steps; AgentModule sums them over the ranks
        self.updates.fill_(updates)
        if h.norm_obs:
            self.obs_rms.update(collector.pop_observations())
        return self._metrics(stats) if write else {}

    def _buffer_ready(self) -> bool:
        """Whether every rank's buffer holds a minibatch (autoreset steps are not stored, so the ranks' sizes can
        differ); a collective under DDP until it first holds, which it then does for good."""
        if not self._ready:
            enough = torch.tensor(int(len(self.buffer) >= self.hparams.batch_size), device=self.device)
            self._ready = int(sum_over_ranks(enough)) == self.world_size
        return self._ready

    def _update(self, actor_opt, critic_opt, alpha_opt, polyak: bool = True, measure: bool = False
                ) -> dict[str, Tensor]:
        """One gradient update of temperature, critics and actor on a replay minibatch, then the targets'
        Polyak step when ``polyak``; the update's terms, with each network's gradient norm when ``measure``."""
        h = self.hparams
        grads: dict[str, Tensor] | None = {} if measure else None
        data = self.buffer.sample(h.batch_size)
        obs, next_obs = self.observe(data.obs), self.observe(data.next_obs)  # (B, O)
        # 1. The actions the actor loss will score, and the temperature step on their log-probabilities.
        pi, logprob = self.net.get_action(obs)  # (B, A), (B,)
        alpha = self.log_alpha.detach().exp()  # this update's alpha, as SB3's ent_coef (taken before its step)
        temperature = sac_temperature_loss(self.log_alpha, logprob, self.target_entropy)
        if h.autotune:
            self._step(alpha_opt, temperature["loss"], [self.log_alpha], "temperature", grads)
        # 2. Critics towards the soft target, from fresh next actions and the target critics.
        with torch.no_grad():
            next_action, next_logprob = self.net.get_action(next_obs)
            next_q = self.critic_target(next_obs, next_action)  # (K, B)
            target = soft_q_target(data.rewards, data.terminated, next_q, next_logprob, alpha, h.gamma)
        critic = sac_critic_loss(self.net.get_q_values(obs, data.actions), target)
        self._step(critic_opt, critic["loss"], self.net.critic.parameters(), "critic", grads)
        # 3. Actor through the updated critics, whose own weights take no gradient from this loss.
        actor = sac_actor_loss(logprob, self.net.get_q_values(obs, pi, detach_params=True), alpha)
        self._step(actor_opt, actor["loss"], self.net.actor.parameters(), "actor", grads)
        # 4. theta' <- theta' + tau (theta - theta'): one fused op over all target tensors, no loop per tensor.
        if polyak:
            with torch.no_grad():
                foreach_lerp_(list(self.critic_target.parameters()), list(self.net.critic.parameters()), h.tau)
        return {"critic_loss": critic.pop("loss"), "actor_loss": actor.pop("loss"),
                "alpha_loss": temperature.pop("loss"), **critic, **actor, **temperature, **(grads or {})}

    def _step(self, opt, loss: Tensor, params, name: str, grads: dict[str, Tensor] | None) -> None:
        """One optimizer step on ``loss``; the gradient norm of ``params`` (``grad/norm/<name>``) goes into
        ``grads`` when given, measured between backward and step as for every family."""
        opt.zero_grad()
        self.manual_backward(loss)
        if grads is not None:
            grads |= grad_norm(params, name=name)
        opt.step()

    def _metrics(self, stats: dict[str, Tensor]) -> dict[str, Tensor]:
        """The last update's terms, the buffer's size, and the training episodes that ended since the last log."""
        metrics = {**stats, "buffer_size": torch.tensor(float(len(self.buffer)))}
        returns, lengths = self.collector.pop_episodes()
        if len(returns):
            metrics["episode_return"], metrics["episode_length"] = returns.mean(), lengths.float().mean()
        return metrics

    def configure_optimizers(self):
        h = self.hparams
        # The fused kernel (CPU and CUDA) is one op per tensor instead of about ten per parameter: SAC makes one
        # small step per env step and per optimizer, each costing little more than its per-op overhead.
        fused = all(p.device.type in ("cpu", "cuda") for p in self.parameters()) or None
        return [
            torch.optim.Adam(self.net.actor.parameters(), lr=h.actor_lr, fused=fused),
            torch.optim.Adam(self.net.critic.parameters(), lr=h.critic_lr, fused=fused),
            torch.optim.Adam([self.log_alpha], lr=h.alpha_lr, fused=fused),
        ]

    # -- checkpoints: the replay buffer, beside what every agent saves ------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.hparams.save_buffer and self.buffer is not None:
            checkpoint["replay_buffer"] = self.buffer.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._buffer_to_restore = checkpoint.get("replay_buffer")
