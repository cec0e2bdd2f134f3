"""Gymnasium environments as a DataModule: the env id, how many envs, their seeds, wrappers, sync or async.

How reinforcement learning maps onto Lightning's data model here: the data of an on-policy agent is made by
the agent itself, with the current policy, so it cannot be prefetched by a loader (Lightning's fetcher reads
one batch ahead, which would collect each rollout with the previous policy). The loaders therefore yield
*ticks*, placeholders that pace the loops, and the agent module drives the environments that this
DataModule builds:
  - ``train_dataloader``: an endless stream of ticks; each training step is one rollout plus all the updates
    on it. The module stops fit when its budget of environment steps is spent, and ``val_check_interval``
    (an int) counts rollouts between evaluations.
  - ``val_dataloader`` / ``predict_dataloader``: one tick; the step plays ``eval_episodes`` or
    ``predict_episodes`` whole episodes on envs of their own.
The module asks for envs through ``make_envs`` and owns them from then on (collector and evaluator).
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import os
from typing import Any, Literal

import gymnasium as gym
from gymnasium.vector import VectorEnv
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, IterableDataset

from datamodules.base import check_settings
from zoo.errors import InputError
from zoo.io.files import check_output_name


class Ticks(IterableDataset):
    """``count`` placeholders 0, 1, ... (None: without end)."""

    def __init__(self, count: int | None = None) -> None:
        self.count = count

    def __iter__(self):
        return iter(range(self.count)) if self.count is not None else itertools.count()


def accepted_arguments(env_id: str) -> str:
    """ "; it takes: a, b" from the signature of the env's entry point ("" where it cannot be read)."""
    try:
        creator = gym.spec(env_id).entry_point
        creator = _import(creator.replace(":", ".")) if isinstance(creator, str) else creator
        names = [p for p in inspect.signature(creator).parameters if p not in ("self", "args", "kwargs")]
    except (gym.error.Error, ImportError, AttributeError, TypeError, ValueError):
        return ""
    return f"; it takes: {', '.join(names)}" if names else "; it takes none"


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class GymDataModule(LightningDataModule):
    """Builds gymnasium vector envs for training, evaluation and prediction; loaders yield ticks."""

    def __init__(
        self,
        env_id: str = "CartPole-v1",
        num_envs: int = 8,
        vectorization_mode: Literal["sync", "async"] = "sync",
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        max_episode_steps: int | None = None,
        wrappers: list[str | dict[str, Any]] | None = None,
        eval_episodes: int = 10,
        eval_envs: int = 10,
        eval_seed: int = 10_000,
        predict_episodes: int = 10,
        record_video: bool = False,
        video_dir: str | None = None,
        video_fps: int = 30,
        video_format: Literal["gif", "mp4"] = "gif",
    ) -> None:
        """
        Args:
            env_id: a registered gymnasium id.
            num_envs: N, training envs stepped together.
            vectorization_mode: "sync" steps the envs in this process; "async" in one subprocess each
                (worth it when one env step costs more than the inter-process round trip, ~50 us).
            seed: the training envs' first reset gets seed, seed + 1, ...; None takes the run's
                ``seed_everything`` (PL_GLOBAL_SEED), else 0.
            env_kwargs: keyword arguments for ``gymnasium.make``.
            max_episode_steps: time limit replacing the registered one.
            wrappers: single-env wrappers applied in order, each an import path called with the env alone
                (``gymnasium.wrappers.ClipAction``) or ``{class_path, init_args}`` called with the env and the
                arguments (``{class_path: gymnasium.wrappers.FrameStackObservation, init_args: {stack_size: 4}}``).
            eval_episodes: deterministic episodes per validation.
            eval_envs: envs the evaluation episodes are spread over.
            eval_seed: every evaluation resets its envs with this seed, so all evaluations play the same
                start states; keep it apart from the training seeds.
            predict_episodes: episodes ``predict`` plays.
            record_video: ``predict`` also plays one episode on an env rendering RGB frames, saves it as a video
                in ``video_dir`` and logs it to MLflow (skipped with a warning when the env's renderer, e.g.
                pygame for classic control, is not installed).
            video_dir: the video's folder, a name inside the run's folder (never outside it; a checkpoint's stored
                value is not used); None: ``videos/`` beside the predictions file.
            video_fps: frames per second of the video.
            video_format: "gif" (Pillow only; MLflow shows it inline) or "mp4" (needs moviepy, as gymnasium's
                ``RecordVideo``).
        """
        super().__init__()
        # Recorded in checkpoints, so that `predict --ckpt_path <model>` without a config plays in the same env.
        self.save_hyperparameters()
        check_settings(at_least=1, num_envs=num_envs)
        self.env_id, self.num_envs, self.vectorization_mode = env_id, num_envs, vectorization_mode
        self._seed = seed
        self.env_kwargs, self.max_episode_steps = dict(env_kwargs or {}), max_episode_steps
        self.wrappers = list(wrappers or [])
        self.eval_episodes, self.eval_envs, self.eval_seed = eval_episodes, eval_envs, eval_seed
        self.predict_episodes = predict_episodes
        self.record_video, self.video_fps = record_video, video_fps
        self.video_dir = check_output_name("data.init_args.video_dir", video_dir)
        self.video_format = video_format
        self._spaces: tuple[gym.Space, gym.Space] | None = None

    @property
    def seed(self) -> int:
        if self._seed is not None:
            return self._seed
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def make_env(self, render_mode: str | None = None) -> gym.Env:
        """One env with the configured time limit and wrappers (``render_mode="rgb_array"`` for recording)."""
        kwargs = {**self.env_kwargs, **({"render_mode": render_mode} if render_mode else {})}
        try:
            env = gym.make(self.env_id, max_episode_steps=self.max_episode_steps, **kwargs)
        except gym.error.Error as err:  # an id gymnasium does not know (NameNotFound, VersionNotFound, ...)
            if isinstance(err, gym.error.DependencyNotInstalled):  # the CLI names the package to install
                raise
            raise InputError(f"data.init_args.env_id={self.env_id!r}: {err}") from err
        except TypeError as err:  # gymnasium passes the env's own refusal of a keyword on, as a TypeError
            if not self.env_kwargs:
                raise
            raise InputError(
                f"data.init_args.env_kwargs={self.env_kwargs}: {self.env_id} refused them "
                f"({str(err).split(' was raised')[0]}){accepted_arguments(self.env_id)}: "
                f"fix or drop data.init_args.env_kwargs"
            ) from err
        for wrapper in self.wrappers:
            if isinstance(wrapper, str):
                wrapper = {"class_path": wrapper}
            try:
                cls = _import(wrapper["class_path"])
            except (ImportError, AttributeError, ValueError) as err:
                raise InputError(
                    f"data.init_args.wrappers: {wrapper['class_path']!r} cannot be imported ({err})"
                ) from err
            env = cls(env, **wrapper.get("init_args", {}))
        return env

    def make_envs(self, num_envs: int | None = None, mode: Literal["sync", "async"] | None = None) -> VectorEnv:
        """A vector env of ``num_envs`` (default N) with next-step autoreset; the caller closes it."""
        fns = [self.make_env] * (num_envs or self.num_envs)
        if (mode or self.vectorization_mode) == "async":
            return gym.vector.AsyncVectorEnv(fns)
        return gym.vector.SyncVectorEnv(fns)

    @property
    def spaces(self) -> tuple[gym.Space, gym.Space]:
        """(single observation space, single action space), read from one env made for the purpose."""
        if self._spaces is None:
            env = self.make_env()
            self._spaces = (env.observation_space, env.action_space)
            env.close()
        return self._spaces

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Ticks(), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Ticks(1), batch_size=None)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(Ticks(1), batch_size=None)
