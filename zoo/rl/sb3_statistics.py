"""The ``VecNormalize`` statistics beside a Stable-Baselines3 zip applied to the zoo's agent: its ``norm_obs`` and
``clip_obs`` (PPO's and A2C's ``norm_reward`` and ``clip_reward``) as SB3's wrapper had them, its ``obs_rms`` (and
``return_rms``) their numbers, so the agent sees what SB3's ``model.predict(vec_normalize.normalize_obs(obs))`` sees.
The file is read as data (``zoo.rl.vec_normalize``). ``from_pretrained`` (``zoo.rl.pretrained``) and
``init_weights: <zip>`` (``load_statistics``, at setup; ``cli.py`` sets the settings first: ``statistics_settings``)
apply them alike. Kept apart from ``zoo.rl.pretrained``, which imports the agents: an agent's setup imports this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from zoo.errors import InputError
from zoo.rl.sb3 import algorithm, read_zip
from zoo.rl.vec_normalize import VecNormalizeStats, read_vec_normalize

EPS = 1e-8  # what RunningMeanStd.normalize adds to the variance, as VecNormalize's default epsilon


def stats_beside(path: Path) -> Path | None:
    """``vec_normalize.pkl`` beside the zip, or in the folder named as it (RL Zoo's ``<env>.zip`` + ``<env>/``)."""
    for candidate in (path.parent / "vec_normalize.pkl", path.with_suffix("") / "vec_normalize.pkl"):
        if candidate.is_file():
            return candidate
    return None


def statistics_settings(path: str | Path, gamma: float) -> dict[str, Any]:
    """The agent's hyperparameters that the ``VecNormalize`` statistics beside the SB3 zip at ``path`` state
    (``normalisation_settings``), or none where it has none: what ``cli.py`` sets for ``init_weights: <zip>``."""
    found = stats_beside(Path(path))
    if found is None:
        return {}
    return normalisation_settings(read_vec_normalize(found), algorithm(read_zip(path)), gamma, str(found))


def load_statistics(module: LightningModule, path: str | Path) -> None:
    """The ``VecNormalize`` statistics beside the SB3 zip ``init_weights`` names (``path``) into ``module``, whose
    settings must be the ones they state (``normalisation_settings``): a net trained on normalised observations acts
    on them, never on raw ones. A zip with none beside it changes nothing."""
    found = stats_beside(Path(path))
    if found is None:
        return
    stats = read_vec_normalize(found)
    algo = algorithm(read_zip(path))  # the module's (zoo.rl.sb3.load_init_weights checks it)
    h = module.hparams
    differ = [
        f"{k}={h.get(k)!r} (theirs: {v!r})"
        for k, v in normalisation_settings(stats, algo, h.get("gamma", 0.99), str(found)).items()
        if h.get(k) != v
    ]
    if differ:
        raise InputError(
            f"init_weights {str(path)!r} acted on the VecNormalize statistics in {found}, and the agent's settings "
            f"differ: {', '.join(differ)}. Leave them out of the config (cli.py sets them from the statistics), "
            "build it with zoo.rl.from_pretrained, or move the file away to start without them"
        )
    set_statistics(module, stats, str(found))


def normalisation_settings(stats: VecNormalizeStats, algo: str, gamma: float, where: str) -> dict[str, Any]:
    """The agent's hyperparameters that apply ``stats`` as SB3's VecNormalize did, or one line naming what the zoo's
    agent cannot do alike."""
    if stats.epsilon != EPS:
        raise InputError(f"{where}: its epsilon is {stats.epsilon}, where the zoo's normalisation adds {EPS}")
    out: dict[str, Any] = {"norm_obs": stats.norm_obs, "clip_obs": stats.clip_obs}
    if stats.norm_reward and algo not in ("PPO", "A2C"):
        raise InputError(
            f"{where}: it scales rewards (norm_reward), which the zoo's {algo} lacks; to act with its observation "
            "statistics, save them with vec_normalize.norm_reward = False"
        )
    if stats.norm_reward and stats.gamma != gamma:
        raise InputError(
            f"{where}: it scales rewards by a return discounted with gamma {stats.gamma}, the agent's is {gamma}, "
            "and the zoo discounts it with the agent's: pass gamma or save it with norm_reward = False"
        )
    if algo in ("PPO", "A2C"):
        out |= {"norm_reward": stats.norm_reward, "clip_reward": stats.clip_reward}
    return out


def set_statistics(module: LightningModule, stats: VecNormalizeStats, where: str) -> None:
    """The running statistics of ``stats`` into the module's buffers (the return's where the module keeps one)."""
    shape = tuple(module.obs_rms.mean.shape)
    if stats.obs_mean.shape != shape:
        raise InputError(
            f"{where}: its observation statistics have the shape {stats.obs_mean.shape}, the agent's {shape}"
        )
    with torch.no_grad():
        module.obs_rms.mean.copy_(torch.from_numpy(stats.obs_mean))
        module.obs_rms.var.copy_(torch.from_numpy(stats.obs_var))
        module.obs_rms.count.fill_(stats.obs_count)
        if hasattr(module, "return_rms"):
            for buffer, value in zip(
                (module.return_rms.mean, module.return_rms.var, module.return_rms.count), stats.ret
            ):
                buffer.fill_(value)
