"""A diffusers model folder as a ``DiffusionModule`` ready to sample or fit: the net built from the folder's
config.json (``zoo.diffusion.diffusers_config``), its weights loaded exactly or refused (``zoo.diffusion.convert``).

    module = zoo.diffusion.from_pretrained("DiT-XL-2-256")            # a pipeline folder: its transformer/
    module = zoo.diffusion.from_pretrained("ddpm-cifar10/unet", guidance_scale=1.0)
    images = module.sample(4)

The module records its net as ``{class_path, init_args}``, as one built by cli.py does, so its checkpoints rebuild
it; the module's other settings (objective, sampler, EMA, ...) are its defaults or the ``init_args`` given, as
plain config values (``objective={"class_path": "zoo.diffusion.FlowMatching"}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.diffusion.convert import block_embedders_differ, load_state, net_state, read_pretrained
from zoo.diffusion.diffusers_config import dit_settings, unet_settings
from zoo.diffusion.module import DiffusionModule
from zoo.errors import InputError
from zoo.io.checkpoint import build_module


def from_pretrained(path: str | Path, **init_args: Any) -> DiffusionModule:
    """The diffusers ``DiTTransformer2DModel`` or ``UNet2DModel`` at ``path`` (its ``save_pretrained`` folder, a
    pipeline folder with ``transformer/`` or ``unet/``) as a ``DiffusionModule`` in eval mode; ``init_args``: the
    module's other arguments. A DiT whose blocks hold embedders of their own gets ``block_embedders=True``."""
    pre = read_pretrained(path)
    if pre.config is None:
        raise InputError(
            f"{str(path)!r} holds no diffusers DiTTransformer2DModel or UNet2DModel (config.json and "
            "diffusion_pytorch_model.safetensors): a zoo checkpoint loads with DiffusionModule.load_from_checkpoint, "
            "other weights with DiffusionModule(net=..., init_weights=...)"
        )
    if pre.config.net == "DiT":
        settings = dit_settings(pre.config, block_embedders_differ(pre.state))
    else:
        settings = unet_settings(pre.config)
    net = {"class_path": f"zoo.diffusion.{pre.config.net}", "init_args": settings}
    spec = {"class_path": "zoo.diffusion.DiffusionModule", "init_args": {**init_args, "net": net}}
    module = build_module(spec, f"from_pretrained({str(path)!r})")
    load_state(module.net, net_state(module.net, pre), f"weights {pre.source!r}")
    return module.eval()
