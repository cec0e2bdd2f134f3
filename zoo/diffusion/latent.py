"""The autoencoder stage of latent diffusion: images to the latents a denoiser trains on, and samples back to images.

Latent diffusion (Rombach et al. 2022, "High-Resolution Image Synthesis with Latent Diffusion Models") trains the
denoiser on z = s (E(x) - b) for a frozen KL-regularised autoencoder E, D, and decodes samples with
x = D(z / s + b); DiT (Peebles & Xie 2023) trains on Stable Diffusion's VAE latents the same way, s = 0.18215, b = 0.
The scale s makes the latents about unit variance, which the noise schedules and the flow's path assume: the
autoencoder's own ``config.scaling_factor`` (and ``shift_factor`` b, SD3 and Flux's), or 1 / std of the first
batch's latents (LDM sec. 4.3.2 and its ``scale_by_std``, for an autoencoder without a published factor).

The autoencoder is any module with diffusers' ``AutoencoderKL`` interface: ``encode(x).latent_dist`` (a diagonal
Gaussian with ``mean`` and ``std``), ``decode(z).sample`` and a ``config`` with ``in_channels``, ``latent_channels``,
``block_out_channels``, ``scaling_factor`` and ``shift_factor``. A config names it as ``{class_path:
diffusers.AutoencoderKL, init_args: {...}}``, which ``build_autoencoder`` builds: not jsonargparse, because
diffusers annotates ``down_block_types``, ``block_out_channels``, ... as one-element tuples (``Tuple[str]``), which
jsonargparse enforces, so no autoencoder that downsamples would parse. Only the classes in ``AUTOENCODERS`` are
built, and diffusers is imported then, never with this file (it is the extra ``latent``).

Training encodes a posterior sample z ~ N(mean, std^2), as DiT's ``latent_dist.sample()`` and LDM do, rather than
the mean: the decoder was trained to decode samples, the noise it adds is a small augmentation, and the latents'
statistics (and the estimated scale) are those of the distribution the decoder saw. The sample's noise comes from
the training step's own generator, so a resumed run draws what an unbroken one would.

Notation: B batch, C image channels, Z latent channels, H/W image side, h/w latent side (H / f, f the downsampling).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zoo.errors import InputError, import_extra
from zoo.io.files import read_json
from zoo.io.weights import load_weights, readable

# What a config's autoencoder may name (each path of the one class), and the module and class it imports.
AUTOENCODERS = {
    path: ("diffusers", "AutoencoderKL")
    for path in (
        "diffusers.AutoencoderKL",
        "diffusers.models.AutoencoderKL",
        "diffusers.models.autoencoders.autoencoder_kl.AutoencoderKL",
    )
}
# Where diffusers' save_pretrained puts an AutoencoderKL's weights, in a folder or a pipeline's vae/ subfolder.
WEIGHT_FILES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")


def build_autoencoder(config: Mapping[str, Any]) -> nn.Module:
    """The autoencoder ``{class_path, init_args}`` names, built with its init arguments (random weights)."""
    class_path = config.get("class_path") if isinstance(config, Mapping) else None
    if class_path not in AUTOENCODERS:
        raise InputError(
            f"autoencoder class_path {class_path!r} is not one this module builds: use "
            f"{{class_path: diffusers.AutoencoderKL, init_args: {{...}}}} (or pass the module itself from Python)"
        )
    module_name, name = AUTOENCODERS[class_path]
    module = import_extra(module_name, f"the autoencoder {class_path} (latent diffusion)")
    init_args = dict(config.get("init_args") or {})
    try:
        return getattr(module, name)(**init_args)
    except TypeError as err:  # an unknown argument: one line naming it
        raise InputError(f"autoencoder {class_path}: {err}") from None


def autoencoder_sizes(autoencoder: nn.Module) -> tuple[int, int, int]:
    """(C, Z, f): the image channels it encodes, the latent channels and the side's downsampling factor."""
    config = getattr(autoencoder, "config", None)
    try:
        c, z, widths = config.in_channels, config.latent_channels, config.block_out_channels
    except AttributeError:
        raise InputError(
            f"autoencoder {type(autoencoder).__name__} has no config with in_channels, latent_channels and "
            "block_out_channels: use diffusers.AutoencoderKL (class_path: diffusers.AutoencoderKL)"
        ) from None
    return c, z, 2 ** (len(widths) - 1)  # every encoder block but the last halves the side


def configured_scale(autoencoder: nn.Module) -> float:
    scale = getattr(autoencoder.config, "scaling_factor", None)
    if scale is None:
        raise InputError(
            f"autoencoder {type(autoencoder).__name__} states no config.scaling_factor: set latent_scale to a number "
            "or to 'estimate'"
        )
    return float(scale)


def shift_of(autoencoder: nn.Module) -> float:
    """b of z = s (E(x) - b): SD3's and Flux's VAEs state one, SD's and DiT's none (0)."""
    return float(getattr(autoencoder.config, "shift_factor", None) or 0.0)


def sample_latents(autoencoder: nn.Module, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """E(x): a sample of the posterior of ``images`` (B, C, H, W) in [-1, 1], (B, Z, h, w), unscaled."""
    return posterior_sample(autoencoder.encode(images).latent_dist, generator)


def posterior_sample(posterior, generator: torch.Generator | None = None) -> Tensor:
    """z = mean + std eps of a diagonal Gaussian (diffusers' ``DiagonalGaussianDistribution``), eps drawn on
    ``generator``'s device (the CPU for validation's fixed draws) and moved."""
    mean, std = posterior.mean, posterior.std
    device = generator.device if generator is not None else mean.device
    eps = torch.randn(mean.shape, generator=generator, device=device, dtype=mean.dtype).to(mean.device)
    return mean + std * eps


def decode_latents(autoencoder: nn.Module, latents: Tensor, scale: Tensor | float, shift: float) -> Tensor:
    """D(z / s + b): scaled latents (B, Z, h, w) -> images (B, C, H, W), about [-1, 1] (not clamped)."""
    return autoencoder.decode(latents / scale + shift).sample


def std_scale(latents: Tensor, reduce=None) -> Tensor:
    """1 / std of all the values of ``latents`` (LDM's ``scale_by_std``); ``reduce(tensor)``: a sum over the
    processes, so every rank of a distributed run takes the same scale."""
    x = latents.detach().double().flatten()
    moments = torch.stack([x.new_tensor(x.numel()), x.sum(), x.pow(2).sum()])
    n, s, ss = reduce(moments) if reduce is not None else moments
    var = (ss - s * s / n) / (n - 1)
    return (1 / var.sqrt()).float()


def weights_file(path: str | Path) -> str | Path:
    """The weights file of ``path``: itself, or in a diffusers folder (``save_pretrained``, or a pipeline's with a
    ``vae/`` subfolder); an ``InputError`` naming what to pass when there is none."""
    path = readable(path, "autoencoder_weights")
    if isinstance(path, str) and "://" in path:
        return path  # a URL: load_file reads it and says what is wrong with it
    local = Path(path)
    if local.is_file():
        return local
    for folder in (local, local / "vae"):
        for name in WEIGHT_FILES:
            if (folder / name).is_file():
                return folder / name
    what = "holds no diffusers weights" if local.is_dir() else "does not exist"
    raise InputError(
        f"autoencoder_weights {str(path)!r} {what}: pass an AutoencoderKL folder (save_pretrained, or a pipeline's "
        f"vae/ with {WEIGHT_FILES[0]}), a .safetensors/.pt file of its keys, or a zoo checkpoint that holds one"
    )


def load_autoencoder(autoencoder: nn.Module, path: str | Path) -> None:
    """``path``'s weights into ``autoencoder``, weights-only, every key and shape checked: a diffusers folder or
    file, or a zoo checkpoint (its ``autoencoder.`` keys: a latent diffusion model's, or an autoencoder trained by
    ``zoo.diffusion.AutoencoderModule``, configs/diffusion/autoencoder_shapes.yaml)."""
    weights = weights_file(path)
    check_config(autoencoder, weights)
    load_weights(autoencoder, weights, prefix="autoencoder.")


def check_config(autoencoder: nn.Module, weights: str | Path) -> None:
    """Refuse diffusers weights whose config.json differs from the built autoencoder's in any field: norm groups,
    activations or the latents' scale change what it computes, and show in no weight's shape."""
    config = Path(weights).parent / "config.json" if isinstance(weights, Path) else None
    if config is None or not weights.name.startswith("diffusion_pytorch_model.") or not config.is_file():
        return
    data = read_json(config)
    if not isinstance(data, Mapping):
        raise InputError(f"{str(config)!r} is not a JSON object of an autoencoder's settings")
    have = dict(getattr(autoencoder, "config", {}))
    fields = [k for k in data if not k.startswith("_")]  # _class_name, _diffusers_version: never imported
    wrong = [f"{k}={data[k]!r} (built: {have.get(k, 'no such field')!r})" for k in fields if _plain(have, k) != data[k]]
    if wrong:
        raise InputError(
            f"{str(config)!r} describes another autoencoder than the one built from autoencoder.init_args: "
            f"{', '.join(wrong[:6])}: set those init_args to the folder's values"
        )


def _plain(config: dict, key: str) -> Any:
    """A built config's value as its JSON reads (tuples are lists), or a marker no JSON value equals."""
    return json.loads(json.dumps(config[key])) if key in config else object()
