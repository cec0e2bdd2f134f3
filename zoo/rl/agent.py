"""What every agent module shares, composed into each rather than inherited: environments, evaluation, RNG.

Each agent (``PPOModule``, ``A2CModule``, ``SACModule``, ``IMPALAModule``) is one LightningModule directly
below Lightning's base class; the parts they have in common live here as functions and one small class,
``AgentEnvs``, which each module holds and calls from its own short hooks:
  - the DataModule that builds the envs (``datamodules.GymDataModule``), checked against the net's shape;
  - the evaluators for validation and predict, on envs of their own, and the metrics they log;
  - in predict, a GIF of one episode logged to MLflow when the DataModule asks and the env can render;
  - the torch thread count pinned while the module runs (a small MLP runs fastest on one thread);
  - the global RNG state, saved in checkpoints and restored when fit resumes;
  - the seed of a resumed run's new episodes.
"""

from __future__ import annotations

import random
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from zoo.layers.weights import check_compatible
from zoo.rl.collector import Evaluator, Rollout, RolloutCollector
from zoo.rl.losses import explained_variance
from zoo.rl.video import record_episode, save_gif
from zoo.tracking import mlflow_loggers


def net_shape_for(obs_space: gym.Space, action_space: gym.Space) -> dict[str, int | bool]:
    """The net arguments an env's spaces call for: ``obs_dim``, ``action_dim``, ``continuous``."""
    continuous = isinstance(action_space, gym.spaces.Box)
    action_dim = int(np.prod(action_space.shape)) if continuous else int(action_space.n)
    return {"obs_dim": int(np.prod(obs_space.shape)), "action_dim": action_dim, "continuous": continuous}


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


def episode_rows(returns: Tensor, lengths: Tensor) -> dict[str, Tensor]:
    """Predict's rows (episode, return, length) for ``WritePredictions``, with a one-line summary."""
    rank_zero_info(
        f"Played {len(returns)} episodes: return {returns.mean():.2f} +- {returns.std(unbiased=False):.2f} "
        f"(min {returns.min():.2f}, max {returns.max():.2f}), mean length {lengths.float().mean():.1f}"
    )
    return {"episode": torch.arange(len(returns)), "return": returns, "length": lengths}


class AgentEnvs:
    """One agent module's link to its environments: DataModule, evaluators, thread pin, RNG to restore."""

    def __init__(self, module: LightningModule, num_threads: int | None) -> None:
        self.module, self.num_threads = module, num_threads
        self._evaluators: dict[str, Evaluator] = {}
        self._threads_before: int | None = None
        self.rng_to_restore: dict | None = None  # set by on_load_checkpoint, applied when fit starts

    def setup(self, net: torch.nn.Module) -> None:
        """Pins the thread count and checks that ``net`` (its ``obs_dim``, ``action_dim``, ``continuous``)
        fits the DataModule's env, when there is one."""
        if self.num_threads and self._threads_before is None:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(self.num_threads)
        dm = self.datamodule()
        if dm is not None:
            want = net_shape_for(*dm.spaces)
            have = {k: getattr(net, k, None) for k in want}
            if want != have:
                fix = " ".join(f"--model.init_args.net.init_args.{k}={v}" for k, v in want.items())
                raise ValueError(f"{dm.env_id} needs a net with {want}, this one has {have}: pass {fix}")

    def datamodule(self):
        trainer = self.module._trainer
        dm = trainer.datamodule if trainer is not None else None
        return dm if dm is not None and hasattr(dm, "make_envs") else None

    def require_datamodule(self):
        dm = self.datamodule()
        if dm is None:
            raise RuntimeError(f"{type(self.module).__name__} runs with a datamodule that builds its envs "
                               "(datamodules.GymDataModule)")
        return dm

    def restore_rng(self) -> None:
        """The RNG state of the checkpoint fit resumes from; called at train start, once the load is done."""
        if self.rng_to_restore is not None:
            set_rng_state(self.rng_to_restore)
            self.rng_to_restore = None

    def evaluate(self, stage: str, policy) -> tuple[Tensor, Tensor]:
        """(returns, lengths) of the DataModule's ``eval_episodes`` ("val") or ``predict_episodes``; in
        predict, also the recording of one episode when the DataModule asks for it."""
        dm = self.require_datamodule()
        if stage not in self._evaluators:
            episodes = dm.eval_episodes if stage == "val" else dm.predict_episodes
            envs = dm.make_envs(min(dm.eval_envs, episodes))
            self._evaluators[stage] = Evaluator(envs, episodes, seed=dm.eval_seed, device=self.module.device)
        if stage == "predict" and getattr(dm, "record_video", False):
            self.record(dm, policy)
        return self._evaluators[stage].run(policy)

    def record(self, dm, policy) -> Path | None:
        """One episode as a GIF in the DataModule's ``video_dir``, logged to MLflow; None without a renderer."""
        trainer = self.module.trainer
        if not trainer.is_global_zero:
            return None
        try:
            env = dm.make_env(render_mode="rgb_array")
            try:
                frames, total = record_episode(env, policy, seed=dm.eval_seed, device=self.module.device)
            finally:
                env.close()
        except gym.error.DependencyNotInstalled as err:
            rank_zero_warn(f"No video: {dm.env_id} cannot render here ({err}). Predict goes on without it.")
            return None
        path = save_gif(frames, Path(dm.video_dir) / f"{dm.env_id}_episode.gif", fps=dm.video_fps)
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_artifact(lg.run_id, str(path), "videos")
        rank_zero_info(f"Recorded one episode (return {total:.2f}, {len(frames)} frames) to {path.resolve()}")
        return path

    def validate(self) -> None:
        """Validation: the evaluation episodes of the module's ``act``, their metrics logged by the module."""
        returns, lengths = self.evaluate("val", self.module.act)
        self.module.log_dict(evaluation_metrics(returns, lengths, self.module.env_steps), batch_size=1, prog_bar=True)

    def play(self) -> dict[str, Tensor]:
        """Predict: the DataModule's ``predict_episodes``, as rows (episode, return, length) for WritePredictions."""
        return episode_rows(*self.evaluate("predict", self.module.act))

    def save_to(self, checkpoint: dict) -> None:
        checkpoint["rng"] = rng_state()

    def load_from(self, checkpoint: dict) -> None:
        """Checks the checkpoint's net against the module's (naming mismatches) and keeps its RNG state for
        a resumed fit."""
        net_state = {k[4:]: v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
        check_compatible(self.module.net, net_state, "checkpoint")
        self.rng_to_restore = checkpoint.get("rng")  # applied at train start, only when fit resumes

    def teardown(self) -> None:
        for evaluator in self._evaluators.values():
            evaluator.close()
        self._evaluators.clear()
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None


def rmsprop_or_adam(module: LightningModule) -> dict:
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
    spent = lambda: min(1.0, int(module.env_steps) / h.total_env_steps)  # noqa: E731
    factor = (lambda _: 1.0 - spent()) if h.anneal_lr else (lambda _: 1.0)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": LambdaLR(opt, factor), "name": "lr"}}


# -- on-policy agents (PPO, A2C): rollouts from the DataModule's training envs ----------------------------


def open_rollout_collector(module: LightningModule, envs: AgentEnvs) -> RolloutCollector:
    """The collector of an on-policy module whose hparams name ``num_steps``, ``gamma``, ``norm_obs`` and
    ``norm_reward`` and which holds ``obs_rms``, ``return_rms`` and ``env_steps``."""
    dm, h = envs.require_datamodule(), module.hparams
    return RolloutCollector(
        dm.make_envs(), h.num_steps, module.device, module.obs_rms if h.norm_obs else None,
        module.return_rms if h.norm_reward else None, h.gamma, seed=train_seed(dm.seed, int(module.env_steps)),
    )


def rollout_metrics(rollout: Rollout, returns: Tensor, stats: dict[str, Tensor], env_steps: Tensor,
                    episodes: list[Tensor]) -> dict[str, Tensor]:
    """What an on-policy training step logs: the loss terms, value fit, env steps, and the mean return and
    length of the training episodes that ended since the last log (``episodes``, emptied here)."""
    keep = rollout.valid
    metrics = {k if k.startswith("grad/") else f"train/{k}": v for k, v in stats.items()}
    metrics["train/explained_variance"] = explained_variance(rollout.values[:-1][keep], returns[keep])
    metrics["train/env_steps"] = env_steps.float()
    ended = torch.cat(episodes, 1)
    episodes.clear()
    if ended.shape[1]:
        metrics["train/episode_return"], metrics["train/episode_length"] = ended.mean(1)
    return metrics
