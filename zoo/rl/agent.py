"""AgentModule: what every agent module shares, so that an agent writes only its nets and its update.

``PPOModule``, ``A2CModule``, ``SACModule`` and ``IMPALAModule`` subclass it (the only level between them
and Lightning's base class) and write ``__init__`` (nets, statistics), ``configure_optimizers``,
``start_collecting`` (their collector over the DataModule's envs), ``batch_env_steps`` and ``learn`` (collect,
loss, optimizer steps). Everything else is here:
  - the DataModule that builds the envs (``datamodules.GymDataModule``), checked against the net's shape;
  - the training step around ``learn``: the learning-rate schedule, the metrics on the steps Lightning writes,
    the stop before a step would exceed ``total_env_steps`` (also when a resumed run has spent it already);
  - acting (``act``) with the running observation statistics of the agents that keep them;
  - the evaluators for validation and predict, on envs of their own, and the metrics they log;
  - in predict, the frames of one episode (written as a GIF or MP4 by ``WritePredictions``) when the DataModule
    asks and the env can render;
  - the torch thread count pinned while the module runs (a small MLP runs fastest on one thread);
  - the global RNG state, saved in checkpoints and restored when fit resumes;
  - the seed of a resumed run's new episodes;
  - the collector closed at the end of fit, and when fit fails or is interrupted;
  - under DDP, one agent over several processes (``zoo.rl.distributed``): each rank collects its own data
    (seeds offset by rank, RNG forked), the env-step counter and the budget count every rank's steps (a sum
    over ranks after each ``learn``), and validation splits its episodes over the ranks and gathers them.
"""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from zoo.layers.checkpoint import WeightsOnlyLoading
from zoo.layers.compat import trainer_of
from zoo.layers.logging import lightning_writes
from zoo.layers.weights import check_compatible
from zoo.rl.collector import Evaluator, Rollout, RolloutCollector
from zoo.rl.distributed import evaluation_share, fork_rng, gather_over_ranks, sum_over_ranks
from zoo.rl.losses import explained_variance, gae
from zoo.rl.video import record_episode


def net_shape_for(obs_space: gym.Space, action_space: gym.Space) -> dict[str, int | bool | list[int]]:
    """The net arguments an env's spaces call for: ``obs_dim``, ``action_dim``, ``continuous`` (and a MultiDiscrete
    action's ``action_nvec``). Observations must be a Box: gymnasium's ``FlattenObservation`` makes one of a Dict,
    Tuple or Discrete space."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"the agents observe Box spaces, not {obs_space}: add {{class_path: "
                         "gymnasium.wrappers.FlattenObservation}} to the DataModule's wrappers")
    want = {"obs_dim": int(np.prod(obs_space.shape)), "continuous": isinstance(action_space, gym.spaces.Box)}
    if isinstance(action_space, gym.spaces.Box):
        return {**want, "action_dim": int(np.prod(action_space.shape))}
    if isinstance(action_space, gym.spaces.Discrete):
        return {**want, "action_dim": int(action_space.n)}
    if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        nvec = action_space.nvec.tolist()
        return {**want, "action_dim": sum(nvec), "action_nvec": nvec}
    raise ValueError(f"the agents act in Box, Discrete or 1-D MultiDiscrete spaces, not {action_space}")


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


def train_seed(seed: int, env_steps: int) -> int:
    """``seed`` for a fresh run; a resumed run's new episodes get a seed drawn from (seed, env steps)."""
    return seed if env_steps == 0 else int(np.random.SeedSequence([seed, env_steps]).generate_state(1)[0])


def evaluation_metrics(returns: Tensor, lengths: Tensor, env_steps: Tensor) -> dict[str, Tensor]:
    """What validation logs: mean and std return of the evaluation episodes, their length, the env steps."""
    return {"val/return": returns.mean(), "val/return_std": returns.std(unbiased=False),
            "val/episode_length": lengths.float().mean(), "val/env_steps": env_steps.float()}


def episode_rows(returns: Tensor, lengths: Tensor, first: int = 0) -> dict[str, Tensor]:
    """Predict's rows (episode, return, length) for ``WritePredictions``, numbered from ``first``, with a
    one-line summary."""
    rank_zero_info(
        f"Played {len(returns)} episodes: return {returns.mean():.2f} +- {returns.std(unbiased=False):.2f} "
        f"(min {returns.min():.2f}, max {returns.max():.2f}), mean length {lengths.float().mean():.1f}"
    )
    return {"episode": first + torch.arange(len(returns)), "return": returns, "length": lengths}


class StopCollectingOnException(Callback):
    """Closes an agent's collector (envs, actor processes) when fit fails or is interrupted: Lightning then
    skips the module's ``teardown`` hook, which closes it on a normal exit."""

    def on_exception(self, trainer, pl_module: AgentModule, exception: BaseException) -> None:
        pl_module.stop_collecting()


class AgentModule(WeightsOnlyLoading, LightningModule):
    """An RL agent on the envs of a ``GymDataModule``: one training step is one ``learn``, manually optimised."""

    family = "rl"
    monitor = "val/return"
    monitor_mode = "max"

    def __init__(self, num_threads: int | None = 1) -> None:
        """
        Args:
            num_threads: PyTorch CPU threads while this module runs (restored after). None: unchanged.
        """
        super().__init__()
        # One training step holds many optimizer steps (minibatches, env steps): Lightning's per-step
        # overhead would otherwise cost as much as a small MLP's update.
        self.automatic_optimization = False
        self.num_threads = num_threads
        self.register_buffer("env_steps", torch.zeros((), dtype=torch.int64))
        self.collector = None  # from start_collecting, while fit runs
        self._evaluators: dict[str, Evaluator] = {}
        self._threads_before: int | None = None
        self._rng_to_restore: dict | None = None  # set by on_load_checkpoint, applied when fit starts

    # -- what an agent writes ----------------------------------------------------------------------------

    def start_collecting(self, dm):
        """The collector of training data over ``dm``'s envs, seeded with ``self.train_seed(dm)``; has ``close()``."""
        raise NotImplementedError

    @property
    def batch_env_steps(self) -> int:
        """Env steps of one training step, all envs of this process together."""
        raise NotImplementedError

    def num_train_envs(self, dm) -> int:
        """Training envs this process steps: under DDP, rank r's seeds start r x this after rank 0's."""
        return dm.num_envs

    def learn(self, write: bool) -> dict[str, Tensor]:
        """One training step: collect, losses, optimizer steps, ``env_steps`` advanced by this process's env steps
        (``AgentModule`` then sums them over the ranks). Every backward and every other collective must happen
        on every rank, the same number of times (DDP averages gradients in each). Returns the step's metrics
        when ``write`` (Lightning writes this step's logs): loss terms under their names (logged as ``train/...``)
        and ``zoo.layers.gradnorm``'s ``grad/...``; return ``{}`` otherwise, as its values would be dropped."""
        raise NotImplementedError

    # -- acting ------------------------------------------------------------------------------------------

    def observe(self, x: Tensor) -> Tensor:
        """Raw observations (B, O) as the nets see them: normalised by the running statistics of an agent that
        keeps them (``obs_rms``, with ``norm_obs``)."""
        return self.obs_rms.normalize(x) if self.hparams.get("norm_obs") else x

    @torch.no_grad()
    def act(self, obs: Tensor | np.ndarray, deterministic: bool = True) -> Tensor:
        """Actions for raw observations (B, O): the policy's mode, or a sample of it."""
        x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return self.net.act(self.observe(x), deterministic)

    # -- environments ------------------------------------------------------------------------------------

    def datamodule(self):
        trainer = trainer_of(self)
        dm = trainer.datamodule if trainer is not None else None
        return dm if dm is not None and hasattr(dm, "make_envs") else None

    def require_datamodule(self):
        dm = self.datamodule()
        if dm is None:
            raise RuntimeError(f"{type(self).__name__} runs with a datamodule that builds its envs "
                               "(datamodules.GymDataModule)")
        return dm

    def train_seed(self, dm) -> int:
        """``dm.seed`` for a fresh run; a resumed run's new episodes get one drawn from (seed, env steps). Rank r
        of a DDP run adds r x ``num_train_envs``: its envs take the seeds that follow rank r - 1's."""
        return train_seed(dm.seed, int(self.env_steps)) + self.global_rank * self.num_train_envs(dm)

    def setup(self, stage: str) -> None:
        """Pins the thread count and checks that the net (its ``obs_dim``, ``action_dim``, ``continuous``)
        fits the DataModule's env, when there is one."""
        if isinstance(getattr(trainer_of(self), "strategy", None), ModelParallelStrategy):
            raise ValueError("RL agents are not sharded (FSDP2): their nets are small and each rank collects its own "
                             "rollouts; train them data-parallel with --config configs/trainer/ddp.yaml instead")
        if self.num_threads and self._threads_before is None:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(self.num_threads)
        dm = self.datamodule()
        if dm is not None and getattr(self.net, "unsized", False):
            self._size_net_for(dm)
        if dm is not None:
            want = net_shape_for(*dm.spaces)
            if getattr(self.net, "obs_shape", None) is not None:  # an image encoder: the layout matters too
                want["obs_shape"] = list(dm.spaces[0].shape)
            have = {k: getattr(self.net, k, None) for k in want}
            have = {k: list(v) if isinstance(v, tuple) else v for k, v in have.items()}
            if want != have:
                fix = " ".join(f"--model.init_args.net.init_args.{k}={v}".replace(" ", "") for k, v in want.items())
                raise ValueError(f"{dm.env_id} needs a net with {want}, this one has {have}: pass {fix}")

    def _size_net_for(self, dm) -> None:
        """Replaces a net built without its sizes (obs_dim, action_dim, ... left None) by one sized for ``dm``'s env;
        the sizes go into the hyperparameters, so checkpoints and MLflow models rebuild the sized net."""
        obs_space, action_space = dm.spaces
        shape = {**net_shape_for(obs_space, action_space), "obs_shape": list(obs_space.shape)}
        if isinstance(action_space, gym.spaces.Box):
            shape |= {"action_low": action_space.low.tolist(), "action_high": action_space.high.tolist()}
        self.net = self.net.for_env(shape)
        net_cfg = self.hparams.get("net")
        if isinstance(net_cfg, dict) and isinstance(net_cfg.get("init_args"), dict):
            given = net_cfg["init_args"]
            given.update({k: v for k, v in self.net.init_args.items() if given.get(k, v) is None})
        self.net_sized()

    def net_sized(self) -> None:
        """Builds what the module keeps beside the net and sizes from it (observation statistics, target nets):
        called by ``__init__`` for a sized net, else by setup once the env has sized it."""

    def configure_callbacks(self) -> list[Callback]:
        return [StopCollectingOnException()]

    def stop_collecting(self) -> None:
        if self.collector is not None:
            self.collector.close()
            self.collector = None

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self.stop_collecting()
        for evaluator in self._evaluators.values():
            evaluator.close()
        self._evaluators.clear()
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    # -- training ----------------------------------------------------------------------------------------

    def progress(self) -> float:
        """Fraction of the env-step budget spent, for the linear annealings of learning rate and clipping."""
        return min(1.0, int(self.env_steps) / self.hparams.total_env_steps)

    def _budget_left(self) -> bool:
        # env_steps is the same global count on every rank, so every rank takes the same decision.
        return int(self.env_steps) + self.batch_env_steps * self.world_size <= self.hparams.total_env_steps

    @property
    def world_size(self) -> int:
        """Processes that collect and learn together (DDP ranks); 1 without a trainer."""
        trainer = trainer_of(self)
        return trainer.world_size if trainer is not None else 1

    def on_train_start(self) -> None:
        # Here rather than in setup: the device is final and a resumed checkpoint (env steps, RNG) is loaded.
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)  # rank 0's state, saved in the checkpoint
            self._rng_to_restore = None
        fork_rng(self.global_rank)
        if not self._budget_left():
            self.trainer.should_stop = True  # a resumed run whose budget is already spent: no envs opened
        elif self.collector is None:
            self.collector = self.start_collecting(self.require_datamodule())

    def training_step(self, batch: int, batch_idx: int) -> None:
        write = lightning_writes(self.trainer)
        before = self.env_steps.clone()
        stats = self.learn(write)
        self.env_steps.copy_(before + sum_over_ranks(self.env_steps - before))  # every rank's env steps
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()  # the rate for the next step's updates (a function of env steps, see progress)
        if write:
            metrics = {k if k.startswith("grad/") else f"train/{k}": v for k, v in stats.items()}
            self.log_dict({**metrics, "train/env_steps": self.env_steps.float()}, on_step=True, on_epoch=False)
        if not self._budget_left():
            self.trainer.should_stop = True

    # -- evaluation and prediction -----------------------------------------------------------------------

    def evaluate(self, stage: str) -> tuple[Tensor, Tensor]:
        """(returns, lengths) of ``act`` over the DataModule's ``eval_episodes`` ("val") or ``predict_episodes``;
        in predict, also the recording of one episode when the DataModule asks for it.

        Under DDP each rank plays its share of the episodes (``evaluation_share``: together the ones one process
        would play); validation gathers them, so every rank logs the same figures, and predict keeps its own
        (``WritePredictions`` writes a file per rank)."""
        dm = self.require_datamodule()
        episodes = dm.eval_episodes if stage == "val" else dm.predict_episodes
        shares = evaluation_share(episodes, dm.eval_envs, self.world_size)
        mine = shares[self.global_rank]
        if stage not in self._evaluators and mine.num_envs:
            envs = dm.make_envs(mine.num_envs)
            self._evaluators[stage] = Evaluator(envs, mine.num_episodes, seed=dm.eval_seed + mine.first_env,
                                                device=self.device)
        if mine.num_envs:
            returns, lengths = self._evaluators[stage].run(self.act)
        else:
            returns, lengths = torch.zeros(0), torch.zeros(0, dtype=torch.int64)
        if stage == "predict":
            return returns, lengths
        counts = [s.num_episodes for s in shares]
        return (gather_over_ranks(returns.to(self.device), counts).cpu(),
                gather_over_ranks(lengths.to(self.device), counts).cpu())

    def record(self, dm) -> dict | None:
        """One episode's frames, as predict hands a video to ``WritePredictions`` (``callbacks.media``: written beside
        the predictions, or in the DataModule's ``video_dir`` inside the run's folder, and logged to MLflow); None without a renderer."""
        if not self.trainer.is_global_zero:
            return None
        try:
            env = dm.make_env(render_mode="rgb_array")
            try:
                frames, total = record_episode(env, self.act, seed=dm.eval_seed, device=self.device)
            finally:
                env.close()
        except gym.error.DependencyNotInstalled as err:
            rank_zero_warn(f"No video: {dm.env_id} cannot render here ({err}). Predict goes on without it.")
            return None
        rank_zero_info(f"Recorded one episode: return {total:.2f}, {len(frames)} frames")
        return {"frames": frames, "fps": dm.video_fps, "name": f"{dm.env_id.rsplit(':', 1)[-1]}_episode",
                "dir": dm.video_dir, "format": getattr(dm, "video_format", "gif")}

    def validation_step(self, batch: int, batch_idx: int) -> None:
        """The evaluation episodes of ``act``: mean and std return, episode length, env steps so far."""
        # Every rank holds the same figures (gathered episodes, global env steps): sync_dist averages equal values.
        self.log_dict(evaluation_metrics(*self.evaluate("val"), self.env_steps), batch_size=1, prog_bar=True,
                      sync_dist=True)

    def predict_step(self, batch: int, batch_idx: int) -> dict[str, Tensor]:
        """Plays the DataModule's ``predict_episodes``; rows (episode, return, length) go to WritePredictions
        (under DDP, each rank's share, numbered as one process would number them)."""
        dm = self.require_datamodule()
        shares = evaluation_share(dm.predict_episodes, dm.eval_envs, self.world_size)
        video = self.record(dm) if getattr(dm, "record_video", False) else None
        rows = episode_rows(*self.evaluate("predict"), sum(s.num_episodes for s in shares[: self.global_rank]))
        return rows if video is None else {**rows, "video": video}

    # -- checkpoints -------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng"] = rng_state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Checks the checkpoint's net against the module's (naming mismatches) and keeps its RNG state for
        a resumed fit."""
        net_state = {k[4:]: v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
        check_compatible(self.net, net_state, "checkpoint")
        self._rng_to_restore = checkpoint.get("rng")  # applied at train start, only when fit resumes


def rmsprop_or_adam(module: AgentModule) -> dict:
    """configure_optimizers for a module whose hparams name ``optimizer`` ("rmsprop" or "adam"), ``lr``,
    ``rms_alpha``, ``optim_eps``, ``anneal_lr`` and ``total_env_steps`` (A2C, IMPALA), with the learning rate
    decayed linearly over the env-step budget when annealed."""
    h, params = module.hparams, module.net.parameters()
    if h.optimizer == "rmsprop":
        # torch adds eps outside the square root, TF (Baselines, the IMPALA paper) inside; SB3 and monobeast
        # use torch's, as here.
        opt = torch.optim.RMSprop(params, lr=h.lr, alpha=h.rms_alpha, eps=h.optim_eps)
    else:
        fused = all(p.device.type in ("cpu", "cuda") for p in module.net.parameters())
        opt = torch.optim.Adam(params, lr=h.lr, eps=h.optim_eps, fused=fused or None)
    # Stepped once per training step; a function of the env steps spent, so resuming needs no schedule state.
    factor = (lambda _: 1.0 - module.progress()) if h.anneal_lr else (lambda _: 1.0)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": LambdaLR(opt, factor), "name": "lr"}}


# -- on-policy agents (PPO, A2C): rollouts from the DataModule's training envs ----------------------------
# For a module whose hparams name ``num_steps``, ``gamma``, ``gae_lambda``, ``norm_obs`` and ``norm_reward`` and
# which holds ``obs_rms``, ``return_rms`` and ``ended_episodes`` (a list).


def open_rollout_collector(module: AgentModule, dm) -> RolloutCollector:
    """The collector of T = ``num_steps`` steps of the DataModule's N envs, with the module's statistics."""
    h = module.hparams
    return RolloutCollector(
        dm.make_envs(), h.num_steps, module.device, module.obs_rms if h.norm_obs else None,
        module.return_rms if h.norm_reward else None, h.gamma, seed=module.train_seed(dm),
    )


def rollout_env_steps(module: AgentModule) -> int:
    """Env steps of one rollout: T = ``num_steps`` steps of each of the DataModule's N envs."""
    return module.hparams.num_steps * module.require_datamodule().num_envs


def collect_rollout(module: AgentModule) -> tuple[Rollout, Tensor, Tensor]:
    """The next rollout of the module's collector, with its GAE advantages and returns (T, N)."""
    h, rollout = module.hparams, module.collector.collect(module.net)
    advantages, returns = gae(rollout.rewards, rollout.values, rollout.terminated, rollout.truncated,
                              h.gamma, h.gae_lambda)
    return rollout, advantages, returns


def finish_rollout(module: AgentModule, rollout: Rollout, returns: Tensor, stats: dict[str, Tensor],
                   write: bool) -> dict[str, Tensor]:
    """Counts the rollout's env steps and ended episodes; when ``write``, what an on-policy step logs: the update's
    terms (``stats``), the value fit, and the mean return and length of the training episodes that ended since
    the last log."""
    module.env_steps += rollout.env_steps
    module.ended_episodes.append(torch.stack([rollout.episode_returns, rollout.episode_lengths.float()]))
    if not write:
        return {}
    keep = rollout.valid
    metrics = {**stats, "explained_variance": explained_variance(rollout.values[:-1][keep], returns[keep])}
    ended = torch.cat(module.ended_episodes, 1)
    module.ended_episodes.clear()
    if ended.shape[1]:
        metrics["episode_return"], metrics["episode_length"] = ended.mean(1)
    return metrics
