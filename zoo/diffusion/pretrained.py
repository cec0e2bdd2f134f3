"""A diffusers model folder as a ``DiffusionModule`` ready to sample or fit: the net built from the folder's
config.json (``zoo.diffusion.diffusers_config``), its weights loaded exactly or refused (``zoo.diffusion.convert``).

    module = zoo.diffusion.from_pretrained("DiT-XL-2-256")            # a pipeline folder: its transformer/
    module = zoo.diffusion.from_pretrained("ddpm-cifar10/unet", guidance_scale=1.0)
    images = module.sample(4)

A pipeline's ``scheduler/scheduler_config.json`` sets the objective (schedule, prediction type), the sampler and
``clip_denoised``, or is refused naming a field the zoo does not implement (``zoo.diffusion.scheduler_config``); what
``init_args`` give is kept over it. A model folder outside a pipeline has the module's defaults (DDPM's linear schedule
of 1000 steps, eps prediction). A pipeline's ``vae/`` becomes the module's autoencoder. The module records
its net (and autoencoder) as ``{class_path, init_args}``, as one built by cli.py does, so its checkpoints rebuild it;
its other settings (objective, sampler, EMA, ...) are its defaults or the ``init_args`` given, as plain config values
(``objective={"class_path": "zoo.diffusion.FlowMatching"}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.diffusion.convert import Pretrained, block_embedders_differ, load_state, net_state, read_pretrained
from zoo.diffusion.diffusers_config import dit_settings, unet_settings
from zoo.diffusion.latent import load_autoencoder
from zoo.diffusion.module import DiffusionModule
from zoo.diffusion.scheduler_config import scheduler_file, scheduler_settings
from zoo.errors import InputError
from zoo.io import build
from zoo.io.checkpoint import build_module
from zoo.io.files import read_json

AUTOENCODER = {"class_path": "diffusers.AutoencoderKL"}  # the one autoencoder class a module builds (latent.py)


def net_config(path: str | Path) -> dict[str, Any] | None:
    """The net the diffusers folder at ``path`` states, as ``{class_path, init_args}`` (what ``cli.py`` builds it from
    for ``init_weights: <folder>``); None where ``path`` holds no diffusers model (a zoo checkpoint, a DiT .pt)."""
    pre = read_pretrained(path)
    return _net(pre) if pre.config is not None else None


def _net(pre: Pretrained) -> dict[str, Any]:
    """A diffusers model's net: its config.json's settings, and per-block embedders where its blocks' differ."""
    if pre.config.net == "DiT":
        settings = dit_settings(pre.config, block_embedders_differ(pre.state))
    else:
        settings = unet_settings(pre.config)
    return {"class_path": f"zoo.diffusion.{pre.config.net}", "init_args": settings}


def from_pretrained(path: str | Path, **init_args: Any) -> DiffusionModule:
    """The diffusers ``DiTTransformer2DModel`` or ``UNet2DModel`` at ``path`` (its ``save_pretrained`` folder, a
    pipeline folder with ``transformer/`` or ``unet/``) as a ``DiffusionModule`` in eval mode; ``init_args``: the
    module's other arguments. A DiT whose blocks hold embedders of their own gets ``block_embedders=True``; a
    pipeline's ``vae/`` becomes the module's autoencoder (latent diffusion: ``sample`` decodes to images)."""
    pre = read_pretrained(path)
    if pre.config is None:
        raise InputError(
            f"{str(path)!r} holds no diffusers DiTTransformer2DModel or UNet2DModel (config.json and "
            "diffusion_pytorch_model.safetensors): a zoo checkpoint loads with DiffusionModule.load_from_checkpoint, "
            "other weights with DiffusionModule(net=..., init_weights=...)"
        )
    net = _net(pre)
    build.check_net(net, str(path))
    scheduler = scheduler_file(pre.source)
    if scheduler is not None:  # the pipeline's sampling, under what the caller gives
        learned = bool(net["init_args"].get("learn_sigma"))
        init_args = {**scheduler_settings(scheduler, learned), **init_args}
    vae = Path(pre.source).parent.parent / "vae"  # a pipeline's autoencoder, beside its transformer/ or unet/
    vae = vae if "autoencoder" not in init_args and (vae / "config.json").is_file() else None
    if vae is not None:  # latent diffusion: the net samples latents, the autoencoder decodes them
        config = read_json(vae / "config.json")
        config = {k: v for k, v in config.items() if not k.startswith("_")} if isinstance(config, dict) else config
        init_args = {"clip_denoised": None, **init_args, "autoencoder": {**AUTOENCODER, "init_args": config}}
    spec = {"class_path": "zoo.diffusion.DiffusionModule", "init_args": {**init_args, "net": net}}
    module = build_module(spec, f"from_pretrained({str(path)!r})")
    load_state(module.net, net_state(module.net, pre), f"weights {pre.source!r}")
    if vae is not None:
        load_autoencoder(module.autoencoder, vae)  # its config.json checked against the one it was built from
    return module.eval()
