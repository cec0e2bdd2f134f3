"""A diffusers pipeline's ``scheduler/scheduler_config.json`` as the module's objective, sampler and clipping: every
field is read and either sets one of them or is refused by name (as is a field the zoo does not know), so a pipeline
never samples on another schedule or parametrisation than it was trained on.

The config is data (``zoo.io.files.read_json``); its ``_class_name`` is matched as a string, never imported.

- ``num_train_timesteps``, ``beta_schedule`` (``linear``, ``scaled_linear``, ``squaredcos_cap_v2`` = the zoo's
  ``cosine``), ``beta_start``/``beta_end`` (stated at diffusers' own T: the zoo states them at T = 1000, so they are
  scaled by T / 1000), ``prediction_type`` (epsilon, v_prediction, sample = eps, v, x0) -> ``GaussianDiffusion``.
- ``clip_sample``/``clip_sample_range`` -> ``clip_denoised``.
- ``DDPMScheduler`` -> ``DDPMSampler``: ``variance_type`` fixed_small(_log) = beta-tilde, fixed_large = beta,
  learned_range = the net's own (a net with 2C outputs); its ``timestep_spacing`` does not act when every step is
  visited, as the zoo's DDPM and diffusers' DDPMPipeline by default do.
- ``DDIMScheduler`` -> ``DDIMSampler`` (50 steps, eta 0: DDIMPipeline's defaults): ``timestep_spacing``,
  ``steps_offset``, ``set_alpha_to_one``, stepping to t - T // S and keeping the net's eps-hat after clipping, as
  diffusers' DDIMScheduler and DDIMPipeline do.
- ``thresholding`` (dynamic thresholding), ``trained_betas``, ``rescale_betas_zero_snr`` and the other beta schedules
  are not implemented: refused. ``dynamic_thresholding_ratio`` and ``sample_max_value`` act only with thresholding.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from zoo.errors import InputError
from zoo.io.files import read_json

MAX_TIMESTEPS = 100_000  # T sizes the schedule's tensors: diffusers' pipelines train on 1000 (improved DDPM 4000)

# Each scheduler's fields and diffusers' defaults (a config written by hand may leave any out, as diffusers allows).
COMMON: dict[str, Any] = {
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear",
    "trained_betas": None, "clip_sample": True, "prediction_type": "epsilon", "thresholding": False,
    "dynamic_thresholding_ratio": 0.995, "clip_sample_range": 1.0, "sample_max_value": 1.0,
    "timestep_spacing": "leading", "steps_offset": 0, "rescale_betas_zero_snr": False,
}  # fmt: skip
FIELDS = {
    "DDPMScheduler": COMMON | {"variance_type": "fixed_small"},
    "DDIMScheduler": COMMON | {"set_alpha_to_one": True},
}
BETA_SCHEDULES = {"linear": "linear", "scaled_linear": "scaled_linear", "squaredcos_cap_v2": "cosine"}
PREDICTIONS = {"epsilon": "eps", "v_prediction": "v", "sample": "x0"}
VARIANCES = {"fixed_small": "beta_tilde", "fixed_small_log": "beta_tilde", "fixed_large": "beta", "learned_range": None}


def scheduler_file(source: str | Path) -> Path | None:
    """The scheduler config of the pipeline whose model weights are ``source`` (``<pipeline>/unet/<weights>``), or
    None where the model is not in a pipeline folder."""
    path = Path(source).parent.parent / "scheduler" / "scheduler_config.json"
    return path if path.is_file() else None


def scheduler_settings(path: Path, learned_variance: bool) -> dict[str, Any]:
    """The ``DiffusionModule`` arguments (objective, sampler, clip_denoised) the scheduler config at ``path`` states,
    for a net that outputs a variance or not; an ``InputError`` naming a field the zoo does not implement."""
    data, where = read_json(path), str(path)
    if not isinstance(data, dict):
        raise InputError(f"{where!r} is not a JSON object of a diffusers scheduler's settings")
    name = data.get("_class_name")
    if name not in FIELDS:
        raise InputError(
            f"{where!r} is a {name!r}, not a scheduler the zoo reads: DDPMScheduler or DDIMScheduler; or give "
            "from_pretrained objective= and sampler= (the zoo's GaussianDiffusion and a sampler) yourself"
        )
    unknown = sorted(k for k in data if not k.startswith("_") and k not in FIELDS[name])
    if unknown:
        raise InputError(f"{where!r} sets {', '.join(unknown)}, which the zoo's samplers do not implement: refused")
    c = {**FIELDS[name], **{k: v for k, v in data.items() if not k.startswith("_")}}

    def need(field: str, ok: bool, what: str) -> None:
        if not ok:
            raise InputError(
                f"{where!r} has {field}={c[field]!r}, which the zoo does not implement ({what}): refused, as sampling "
                "with it would compute something else"
            )

    for field, value in (("trained_betas", None), ("thresholding", False), ("rescale_betas_zero_snr", False)):
        need(field, c[field] == value and type(c[field]) is type(value), f"it implements {value!r} only")
    num = c["num_train_timesteps"]
    need("num_train_timesteps", type(num) is int and 1 <= num <= MAX_TIMESTEPS, f"an integer in 1..{MAX_TIMESTEPS}")
    need("beta_schedule", c["beta_schedule"] in BETA_SCHEDULES, "it implements " + ", ".join(BETA_SCHEDULES))
    start, end = c["beta_start"], c["beta_end"]
    need("beta_start", _number(start) and 0 < start < 1, "a number in (0, 1)")
    need("beta_end", _number(end) and start <= end < 1, "a number in [beta_start, 1)")
    need("prediction_type", c["prediction_type"] in PREDICTIONS, "it implements " + ", ".join(PREDICTIONS))
    need("clip_sample", type(c["clip_sample"]) is bool, "true or false")
    need("clip_sample_range", _number(c["clip_sample_range"]) and c["clip_sample_range"] > 0, "a positive number")
    need("timestep_spacing", c["timestep_spacing"] in ("leading", "trailing", "linspace"), "leading/trailing/linspace")
    need("steps_offset", type(c["steps_offset"]) is int and 0 <= c["steps_offset"] < num, f"an integer in 0..{num - 1}")
    objective = {
        "num_timesteps": num, "beta_schedule": BETA_SCHEDULES[c["beta_schedule"]], "beta_start": start * num / 1000,
        "beta_end": end * num / 1000, "prediction": PREDICTIONS[c["prediction_type"]],
    }  # fmt: skip
    if name == "DDPMScheduler":
        variance = c["variance_type"]
        need("variance_type", variance in VARIANCES, "it implements " + ", ".join(VARIANCES))
        need("variance_type", (variance == "learned_range") == learned_variance, "a net that outputs the variance")
        # diffusers offsets leading steps, and every step offset runs past T - 1: its DDPM refuses too.
        need("steps_offset", c["steps_offset"] == 0 or c["timestep_spacing"] != "leading", "0 with leading steps")
        fixed = VARIANCES[variance] or "beta_tilde"  # learned_range: the net's own, which the sampler takes first
        sampler = {"class_path": "zoo.diffusion.DDPMSampler", "init_args": {"variance": fixed}}
    else:
        need("set_alpha_to_one", type(c["set_alpha_to_one"]) is bool, "true or false")
        sampler = {
            "class_path": "zoo.diffusion.DDIMSampler",
            "init_args": {
                "steps": min(50, num), "eta": 0.0, "spacing": c["timestep_spacing"], "steps_offset": c["steps_offset"],
                "previous": "stride", "set_alpha_to_one": c["set_alpha_to_one"], "clipped_eps": False,
            },
        }  # fmt: skip
    return {
        "objective": {"class_path": "zoo.diffusion.GaussianDiffusion", "init_args": objective},
        "sampler": sampler,
        "clip_denoised": float(c["clip_sample_range"]) if c["clip_sample"] else None,
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The objective's settings the scheduler states: what the net was trained to predict, on which schedule.
_TRAINED = ("num_timesteps", "beta_schedule", "beta_start", "beta_end", "prediction")


def check_objective(init_weights: str | Path, objective: object, learned_variance: bool) -> None:
    """Refuse a module whose objective differs from the one the pipeline of its ``init_weights`` folder states (a
    net trained on v and the cosine schedule, fine-tuned on eps and the linear one, would learn something else); a
    folder outside a pipeline states none. The sampler and clipping stay the config's choice."""
    path = Path(init_weights)
    if not path.is_dir():
        return
    from zoo.diffusion.convert import diffusers_weights_file

    scheduler = scheduler_file(diffusers_weights_file(path))
    if scheduler is None:
        return
    stated = scheduler_settings(scheduler, learned_variance)["objective"]["init_args"]
    config = getattr(objective, "config", lambda: {})()
    have = (
        config.get("init_args", {}) if config.get("class_path") == "zoo.diffusion.objective.GaussianDiffusion" else {}
    )
    if stated["beta_schedule"] == "cosine":  # its ends are not read
        stated = {k: v for k, v in stated.items() if k not in ("beta_start", "beta_end")}
    wrong = [k for k in _TRAINED if k in stated and not _equal(have.get(k), stated[k])]
    if wrong:
        flags = " ".join(f"--model.init_args.objective.init_args.{k}={stated[k]}" for k in wrong)
        raise InputError(
            f"{str(scheduler)!r} states the objective the net was trained on, and the module's differs in "
            f"{', '.join(wrong)}: use class_path zoo.diffusion.GaussianDiffusion with {flags}"
        )


def _equal(a: Any, b: Any) -> bool:
    return a == b or (_number(a) and _number(b) and math.isclose(a, b, rel_tol=1e-9))
