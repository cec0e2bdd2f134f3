"""What the agents share besides their lifecycle (``zoo.rl.lifecycle``): functions and small objects called by name.

- ``env_sizes``: a net's sizes as the DataModule's env fills them (the application's, before the net is built),
  and ``check_env``, ``check_box``, ``check_action_bounds``: a built net checked against the env;
- ``check_net_state``: a checkpoint's net checked against the module's before Lightning loads it;
- ``adapt_agent``: the module's ``adapt`` setting (LoRA, freezing) on its net, and ``trained``: what an optimizer takes;
- ``linear_annealing``: the on-policy agents' learning-rate schedule (their optimizers: ``zoo.train.optim``);
- ``separate_backwards``: the DDP setting an agent of several backwards (SAC, TD3) needs;
- ``Evaluation``: validation and predict episodes on envs of their own, split over the ranks under DDP, and
  predict's recording of one episode;
- ``Policy``: raw observations to the most likely actions, normaliser folded in: what ``zoo.rl.export`` traces;
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from zoo.adapt import Adaptation, adapt
from zoo.compat import trainer_of
from zoo.errors import InputError
from zoo.io.weights import check_compatible
from zoo.rl.collector import Evaluator
from zoo.rl.distributed import evaluation_share, gather_over_ranks
from zoo.rl.normalization import RunningMeanStd
from zoo.rl.video import record_episode

# -- the envs and the net ------------------------------------------------------------------------------------


def datamodule_of(module: LightningModule):
    """The DataModule that builds ``module``'s envs (``datamodules.GymDataModule``), or None."""
    trainer = trainer_of(module)
    dm = trainer.datamodule if trainer is not None else None
    return dm if dm is not None and hasattr(dm, "make_envs") else None


def require_datamodule(module: LightningModule):
    dm = datamodule_of(module)
    if dm is None:
        raise RuntimeError(
            f"{type(module).__name__} runs with a datamodule that builds its envs (datamodules.GymDataModule)"
        )
    return dm


def world_size(module: LightningModule) -> int:
    """Processes that collect and learn together (DDP ranks); 1 without a trainer."""
    trainer = trainer_of(module)
    return trainer.world_size if trainer is not None else 1


def net_shape_for(obs_space: gym.Space, action_space: gym.Space) -> dict[str, int | bool | list[int]]:
    """The net arguments an env's spaces call for: ``obs_dim``, ``action_dim``, ``continuous`` (and a MultiDiscrete
    action's ``action_nvec``). Observations must be a Box: gymnasium's ``FlattenObservation`` makes one of a Dict,
    Tuple or Discrete space."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(
            f"the agents observe Box spaces, not {obs_space}: add {{class_path: "
            "gymnasium.wrappers.FlattenObservation}} to the DataModule's wrappers"
        )
    want = {"obs_dim": int(np.prod(obs_space.shape)), "continuous": isinstance(action_space, gym.spaces.Box)}
    if isinstance(action_space, gym.spaces.Box):
        return {**want, "action_dim": int(np.prod(action_space.shape))}
    if isinstance(action_space, gym.spaces.Discrete):
        return {**want, "action_dim": int(action_space.n)}
    if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        nvec = action_space.nvec.tolist()
        return {**want, "action_dim": sum(nvec), "action_nvec": nvec}
    raise ValueError(f"the agents act in Box, Discrete or 1-D MultiDiscrete spaces, not {action_space}")


def refuse_sharding(module: LightningModule) -> None:
    if isinstance(getattr(trainer_of(module), "strategy", None), ModelParallelStrategy):
        raise ValueError(
            "RL agents are not sharded (FSDP2): their nets are small and each rank collects its own "
            "rollouts; train them data-parallel with --config configs/trainer/ddp.yaml instead"
        )


def env_sizes(given: dict, obs_space: gym.Space, action_space: gym.Space, env_id: str) -> dict[str, Any]:
    """The net arguments ``given`` (a net's init arguments, None where unset) as the env's spaces fill them: each
    size the net takes (``obs_dim``, ``action_dim``, ``continuous``, a MultiDiscrete's ``action_nvec``, an image
    encoder's ``obs_shape``, a Box's ``action_low``/``action_high``) that is unset, the env's; a given one that
    disagrees raises, naming both and the flags that fix it. The application calls it before the net is built."""
    want = net_shape_for(obs_space, action_space)
    if given.get("encoder", "flat") != "flat" or given.get("obs_shape") is not None:  # the layout matters too
        want["obs_shape"] = list(obs_space.shape)
    want = {k: v for k, v in want.items() if k in given}
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}
    have = {k: want[k] if given[k] is None else given[k] for k in want}
    if want != have:
        fix = " ".join(f"--model.init_args.net.init_args.{k}={v}".replace(" ", "") for k, v in want.items())
        raise InputError(f"{env_id} needs a net with {want}, this one has {have}: pass {fix}")
    if isinstance(action_space, gym.spaces.Box):  # the bounds are checked by the agents that take them
        bounds = {"action_low": action_space.low.tolist(), "action_high": action_space.high.tolist()}
        have |= {k: v for k, v in bounds.items() if k in given and given[k] is None}
    return have


def check_env(net: nn.Module, dm) -> None:
    """``net`` was sized for ``dm``'s env: a net built by hand for another env is refused before fit plays it."""
    sizes = ("obs_dim", "action_dim", "continuous", "action_nvec", "obs_shape")
    env_sizes({k: getattr(net, k, None) for k in sizes}, *dm.spaces, dm.env_id)


def check_box(agent: str, env_id: str, space: gym.Space) -> None:
    """Before the net is sized for it: an agent of continuous actions (SAC, TD3) refuses any other action space."""
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"{agent} acts in continuous (Box) action spaces; {env_id} has {space}")


def check_action_bounds(actor: nn.Module, env_id: str, space: gym.spaces.Box) -> None:
    """A bounded actor (``action_bias`` +- ``action_scale``) acts in the env's Box, or the flags to fix it are named."""
    low = (actor.action_bias - actor.action_scale).cpu().numpy()
    high = (actor.action_bias + actor.action_scale).cpu().numpy()
    if low.shape != space.low.shape or not (np.allclose(low, space.low) and np.allclose(high, space.high)):
        fix = (
            f"--model.init_args.net.init_args.action_low={space.low.tolist()} "
            f"--model.init_args.net.init_args.action_high={space.high.tolist()}"
        )
        raise ValueError(f"{env_id} acts in [{space.low}, {space.high}], the actor in [{low}, {high}]: pass {fix}")


def check_net_state(net: nn.Module, checkpoint: dict) -> None:
    """A checkpoint's net fits ``net`` (mismatches named) before Lightning loads it."""
    check_compatible(net, {k[4:]: v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}, "checkpoint")


def adapt_agent(module: LightningModule, targets: tuple[str, ...] = ()) -> None:
    """The module's ``adapt`` setting (``zoo.adapt``) applied once, to its net: the parameters beside the net (SAC's
    temperature, the target nets) keep training or not as they did. An agent with target nets (``targets``: SAC's and
    TD3's Polyak copies) takes ``trainable`` alone."""
    settings = Adaptation.of(module.hparams.get("adapt"))
    if settings is not None and settings.lora is not None and targets:
        raise InputError(
            f"adapt.lora is not wired for {type(module).__name__}: its {' and '.join(targets)} follow the nets by "
            "Polyak averaging over parameter lists, which adapters would misalign; freeze by name with adapt.trainable"
        )
    beside = {n: p.requires_grad for n, p in module.named_parameters() if not n.startswith("net.")}
    adapt(module, settings)
    for name, p in module.named_parameters():
        if name in beside:
            p.requires_grad_(beside[name])


def trained(params, what: str) -> list[Tensor]:
    """The parameters of ``params`` that train (``adapt`` froze the others), as an optimizer of ``what`` takes them;
    none is refused by name."""
    kept = [p for p in params if p.requires_grad]
    if not kept:
        raise InputError(
            f"adapt leaves no parameter of {what} training, and its optimizer would step none: name some of them in "
            "adapt.trainable"
        )
    return kept


def separate_backwards(module: LightningModule, agent: str) -> None:
    """An agent whose backwards each reach one part of the module (SAC's temperature, critics and actor; TD3's critics
    and actor) runs under DDP only where DDP looks for the unused parameters, which it otherwise refuses."""
    if world_size(module) > 1 and not getattr(module.trainer.model, "find_unused_parameters", True):
        raise ValueError(
            f"{agent} under DDP makes backwards that reach one net each: pass "
            "--trainer.strategy=ddp_find_unused_parameters_true"
        )


def linear_annealing(opt: torch.optim.Optimizer, progress: Callable[[], float], anneal: bool) -> dict:
    """configure_optimizers' answer: ``opt`` with its rate decayed linearly to 0 over the budget when ``anneal``.
    Stepped once per training step; a function of the env steps spent, so resuming needs no schedule state
    (CleanRL's ``frac = 1 - (iteration - 1) / num_iterations``)."""
    factor = (lambda _: 1.0 - progress()) if anneal else (lambda _: 1.0)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": LambdaLR(opt, factor), "name": "lr"}}


# -- acting, evaluation and prediction ------------------------------------------------------------------------


class Policy(nn.Module):
    """Raw observations (B, *obs_shape) -> the most likely actions: the observation normaliser (when one is given),
    then the net's ``act``. An agent's ``policy()`` returns one; ``zoo.rl.export`` traces it."""

    def __init__(self, net: nn.Module, obs_rms: RunningMeanStd | None = None) -> None:
        super().__init__()
        self.net, self.obs_rms = net, obs_rms

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """One observation's shape, as the net takes it (an image net names ``obs_shape``; an MLP ``obs_dim``)."""
        return tuple(getattr(self.net, "obs_shape", None) or (self.net.obs_dim,))

    def forward(self, obs: Tensor) -> Tensor:
        x = obs.to(torch.float32)
        if self.obs_rms is not None:
            x = self.obs_rms.normalize(x)
        return self.net.act(x, deterministic=True)


def evaluation_metrics(returns: Tensor, lengths: Tensor, env_steps: Tensor) -> dict[str, Tensor]:
    """What validation logs: mean and std return of the evaluation episodes, their length, the env steps."""
    return {
        "val/return": returns.mean(),
        "val/return_std": returns.std(unbiased=False),
        "val/episode_length": lengths.float().mean(),
        "val/env_steps": env_steps.float(),
    }


def episode_rows(returns: Tensor, lengths: Tensor, first: int = 0) -> dict[str, Tensor]:
    """Predict's rows (episode, return, length) for ``WritePredictions``, numbered from ``first``, with a
    one-line summary."""
    rank_zero_info(
        f"Played {len(returns)} episodes: return {returns.mean():.2f} +- {returns.std(unbiased=False):.2f} "
        f"(min {returns.min():.2f}, max {returns.max():.2f}), mean length {lengths.float().mean():.1f}"
    )
    return {"episode": first + torch.arange(len(returns)), "return": returns, "length": lengths}


class Evaluation:
    """Validation and predict episodes of an agent's ``act``, on envs of their own (one ``Evaluator`` per stage,
    kept between evaluations). Under DDP each rank plays its share of the episodes (``evaluation_share``: together
    the ones one process would play); validation gathers them, so every rank logs the same figures, and predict keeps
    its own (``WritePredictions`` writes a file per rank)."""

    def __init__(self) -> None:
        self.evaluators: dict[str, Evaluator] = {}

    def _play(self, module: LightningModule, dm, stage: str) -> tuple[Tensor, Tensor, list]:
        episodes = dm.eval_episodes if stage == "val" else dm.predict_episodes
        shares = evaluation_share(episodes, dm.eval_envs, world_size(module))
        mine = shares[module.global_rank]
        if not mine.num_envs:
            return torch.zeros(0), torch.zeros(0, dtype=torch.int64), shares
        if stage not in self.evaluators:
            self.evaluators[stage] = Evaluator(
                dm.make_envs(mine.num_envs), mine.num_episodes, seed=dm.eval_seed + mine.first_env, device=module.device
            )
        return *self.evaluators[stage].run(module.act), shares

    def validate(self, module: LightningModule, dm, env_steps: Tensor) -> dict[str, Tensor]:
        """The evaluation episodes' mean and std return, episode length, and the env steps so far."""
        returns, lengths, shares = self._play(module, dm, "val")
        counts = [s.num_episodes for s in shares]
        returns = gather_over_ranks(returns.to(module.device), counts).cpu()
        lengths = gather_over_ranks(lengths.to(module.device), counts).cpu()
        return evaluation_metrics(returns, lengths, env_steps)

    def predict(self, module: LightningModule, dm) -> dict[str, Tensor]:
        """Predict's rows (episode, return, length), numbered as one process would number them, and the video of
        one episode when the DataModule asks for it (``record_video``)."""
        video = self.record(module, dm) if getattr(dm, "record_video", False) else None
        returns, lengths, shares = self._play(module, dm, "predict")
        rows = episode_rows(returns, lengths, sum(s.num_episodes for s in shares[: module.global_rank]))
        return rows if video is None else {**rows, "video": video}

    def record(self, module: LightningModule, dm) -> dict | None:
        """One episode's frames, as predict hands a video to ``WritePredictions`` (``callbacks.media``: written beside
        the predictions, or in the DataModule's ``video_dir`` inside the run's folder, and logged to MLflow); None
        without a renderer."""
        if not module.trainer.is_global_zero:
            return None
        try:
            env = dm.make_env(render_mode="rgb_array")
            try:
                frames, total = record_episode(env, module.act, seed=dm.eval_seed, device=module.device)
            finally:
                env.close()
        except gym.error.DependencyNotInstalled as err:
            rank_zero_warn(f"No video: {dm.env_id} cannot render here ({err}). Predict goes on without it.")
            return None
        rank_zero_info(f"Recorded one episode: return {total:.2f}, {len(frames)} frames")
        return {
            "frames": frames,
            "fps": dm.video_fps,
            "name": f"{dm.env_id.rsplit(':', 1)[-1]}_episode",
            "dir": dm.video_dir,
            "format": getattr(dm, "video_format", "gif"),
        }

    def close(self) -> None:
        for evaluator in self.evaluators.values():
            evaluator.close()
        self.evaluators.clear()
