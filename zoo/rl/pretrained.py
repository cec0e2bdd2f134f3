"""Stable-Baselines3 agents in, whole: a PPO, A2C, SAC or TD3 zip as the zoo's agent module (``from_pretrained``),
its net and weights as ``zoo.rl.sb3`` reads them, its hyperparameters SB3's where the zip's ``data`` states them in
plain JSON (a schedule, pickled, is not read: the zoo's default stands for it).

    module = zoo.rl.from_pretrained("ppo-CartPole-v1.zip", total_env_steps=50_000)   # SB3's model.save output

From the command line, ``init_weights: <zip>`` starts an agent of the config's hyperparameters from the zip's nets
(``zoo.rl.sb3.load_init_weights``; ``cli.py`` builds the net as the zip states it) and from the statistics found
beside it (``zoo.rl.sb3_statistics``; ``cli.py`` sets ``norm_obs`` and ``clip_obs`` as they state).

An agent trained under ``VecNormalize`` acted on normalised observations: its statistics (``vec_normalize.pkl``, read
as data by ``zoo.rl.vec_normalize``: the pickle is never run) become the module's ``obs_rms`` with ``norm_obs`` and
``clip_obs`` (and, for PPO and A2C, the return's statistics with ``norm_reward``), so ``act``, ``predict`` and the
exported policy see what SB3's ``model.predict(vec_normalize.normalize_obs(obs))`` sees. The file is the one given,
else ``vec_normalize.pkl`` beside the zip or in the folder named as the zip (RL Zoo's layout); a zip with neither
loads as it is.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule

from zoo.rl.a2c import A2CModule
from zoo.rl.ppo import PPOModule
from zoo.rl.sac import SACModule
from zoo.rl.sb3 import (
    NETS,
    SB3Zip,
    algorithm,
    load_exact,
    module_state,
    net_config_of,
    net_sizes,
    policy_kwargs,
    read_zip,
)
from zoo.rl.sb3_statistics import normalisation_settings, set_statistics, stats_beside
from zoo.rl.td3 import TD3Module
from zoo.rl.vec_normalize import read_vec_normalize
from zoo.train.optim import AdamOrRMSprop

AGENTS = {"PPO": PPOModule, "A2C": A2CModule, "SAC": SACModule, "TD3": TD3Module}
# zoo hyperparameter <- SB3's data field, copied where it holds a plain number (or bool).
_SHARED = {k: k for k in ("gamma", "ent_coef", "gae_lambda", "max_grad_norm")}
_REPLAY = {k: k for k in ("gamma", "tau", "batch_size", "buffer_size", "learning_starts", "gradient_steps")}
SETTINGS = {
    "PPO": {**_SHARED, "target_kl": "target_kl", "num_steps": "n_steps", "update_epochs": "n_epochs"}
    | {"norm_adv": "normalize_advantage"},
    "A2C": {**_SHARED, "vf_coef": "vf_coef", "num_steps": "n_steps", "norm_adv": "normalize_advantage"},
    "SAC": {**_REPLAY, "target_update_interval": "target_update_interval", "target_entropy": "target_entropy"},
    "TD3": {**_REPLAY, **{k: k for k in ("policy_delay", "target_policy_noise", "target_noise_clip")}},
}


def settings(z: SB3Zip, algo: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The agent module's hyperparameters that SB3's ``data`` states in plain JSON; a schedule (pickled) is not read,
    and the zoo's default stands for it."""
    d = z.data
    out = {k: d[sb3] for k, sb3 in SETTINGS[algo].items() if type(d.get(sb3)) in (int, float, bool)}
    lr = d.get("learning_rate") if type(d.get("learning_rate")) in (int, float) else None
    if algo == "PPO":
        if type(d.get("vf_coef")) in (int, float):
            out["vf_coef"] = 2 * d["vf_coef"]  # SB3 weighs the plain MSE, the zoo's PPO 0.5 MSE (CleanRL's)
        if m := re.fullmatch(
            r"ConstantSchedule\(val=([-+.e\d]+)\)", str((d.get("clip_range") or {}).get("value_schedule"))
        ):
            out["clip_coef"] = float(m.group(1))
        rollout, batch = d.get("n_steps"), d.get("batch_size")
        rollout = rollout * d.get("n_envs", 1) if type(rollout) is int and type(d.get("n_envs", 1)) is int else 0
        if type(batch) is int and batch > 0 and rollout % batch == 0 and rollout > 0:
            out["num_minibatches"] = rollout // batch
    if lr is not None:
        out |= _optimizers(algo, lr, kwargs)
    if algo == "SAC":
        out["autotune"] = "log_ent_coef" in z.variables
        temperature = z.variables.get("log_ent_coef", z.variables.get("ent_coef_tensor"))
        if temperature is not None:
            out["init_alpha"] = math.exp(temperature.item()) if out["autotune"] else temperature.item()
    return out


def _optimizers(algo: str, lr: float, kwargs: dict[str, Any]) -> dict[str, Any]:
    """SB3's optimizers at a constant rate: Adam with eps 1e-5 on-policy (ActorCriticPolicy's), A2C's RMSprop as its
    ``optimizer_kwargs`` say, torch's Adam off-policy."""
    if algo == "A2C" and "RMSprop" in str(kwargs.get("optimizer_class")):
        opt = kwargs.get("optimizer_kwargs") if isinstance(kwargs.get("optimizer_kwargs"), dict) else {}
        rms = {k: float(opt[k]) for k in ("alpha", "eps") if type(opt.get(k)) in (int, float)}
        return {"optimizer": AdamOrRMSprop("rmsprop", lr=lr, **rms), "anneal_lr": False}
    if algo in ("PPO", "A2C"):
        return {"optimizer": AdamOrRMSprop(lr=lr, eps=1e-5), "anneal_lr": False}
    parts = ("actor", "critic", "alpha") if algo == "SAC" else ("actor", "critic")
    return {f"{p}_optimizer": AdamOrRMSprop(lr=lr) for p in parts}


def from_pretrained(path: str | Path, vec_normalize: str | Path | None = None, **hparams: Any) -> LightningModule:
    """The zoo agent module (``PPOModule``, ``A2CModule``, ``SACModule`` or ``TD3Module``) of the SB3 zip at ``path``:
    its net built to the zip's architecture, every tensor of its policy loaded, its settings where the zoo has them,
    the ``VecNormalize`` statistics at ``vec_normalize`` (or found beside the zip) as its observation normalisation;
    ``hparams`` override those (``total_env_steps`` for a fit). A zip that cannot be imported exactly is refused in
    one line (``InputError``) naming why."""
    z = read_zip(path)
    algo = algorithm(z)
    net = NETS[algo](**net_config_of(z, algo)["init_args"])
    given = {**settings(z, algo, policy_kwargs(z)), **hparams}
    stats_file = Path(vec_normalize) if vec_normalize is not None else stats_beside(Path(path))
    stats = read_vec_normalize(stats_file) if stats_file is not None else None
    if stats is not None:
        given = {**normalisation_settings(stats, algo, given.get("gamma", 0.99), str(stats_file)), **hparams}
    module = AGENTS[algo](net=net, **given)
    load_exact(module, module_state(z, algo, len(net_sizes(z, algo)["hidden_sizes"])), z.path)
    if stats is not None:
        set_statistics(module, stats, str(stats_file))
    return module
