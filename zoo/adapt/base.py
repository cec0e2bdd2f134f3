"""Checkpoints of a LoRA fine-tune hold the adapters (and what else trains), not the frozen base again.

The base is what ``init_weights`` names: a checkpoint records the SHA-256 of the frozen tensors it left out, and a
load reads them again from the ``init_weights`` the user gives (the stored config drops locations), checks the
digest, and puts them back before the state dict is loaded, so the load stays strict and exact. A base that differs
(another folder, another revision) is refused by name, never trained on silently.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from zoo.adapt.lora import adapted
from zoo.adapt.settings import Adaptation
from zoo.errors import CheckpointError, MissingBaseError

BASE_KEY = "adapter_base"  # in the checkpoint: {"sha256": hex, "tensors": count}


NET = "net."  # what init_weights loads: a family's other frozen parts (a latent autoencoder) stay in the checkpoint


def _frozen_keys(module: nn.Module, state_dict: dict) -> list[str]:
    """The state dict's keys of the net that hold a frozen parameter (a tied one under each of its names)."""
    frozen = {p.data_ptr() for p in module.parameters() if not p.requires_grad}
    return sorted(
        k for k, v in state_dict.items() if k.startswith(NET) and isinstance(v, torch.Tensor) and v.data_ptr() in frozen
    )


def digest(state_dict: dict, keys: list[str]) -> str:
    h = hashlib.sha256()
    for k in keys:
        t = state_dict[k].detach().cpu().contiguous()
        h.update(f"{k}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def drop_base(module: nn.Module, checkpoint: dict) -> None:
    """Leave the frozen base out of ``checkpoint`` when it trains LoRA on a base its ``init_weights`` names."""
    settings = Adaptation.of(module.hparams.get("adapt"))
    sd = checkpoint.get("state_dict")
    if sd is None or settings is None or settings.lora is None or not module.hparams.get("init_weights"):
        return
    if not adapted(module):
        return
    live = module.state_dict()
    keys = [k for k in _frozen_keys(module, live) if k in sd]
    checkpoint[BASE_KEY] = {"sha256": digest(sd, keys), "tensors": len(keys)}
    for k in keys:
        del sd[k]


@contextlib.contextmanager
def unwrapped(module: nn.Module) -> Iterator[None]:
    """The adapted layers' plain layers in their places for a while (the same objects: what loads into them stays)."""
    from peft.tuners.lora import LoraLayer

    swapped = []
    for name, layer in list(module.named_modules()):
        if isinstance(layer, LoraLayer):
            parent, _, child = name.rpartition(".")
            owner = module.get_submodule(parent)
            setattr(owner, child, layer.get_base_layer())
            swapped.append((owner, child, layer))
    try:
        yield
    finally:
        for owner, child, layer in swapped:
            setattr(owner, child, layer)


def restore_base(module: nn.Module, checkpoint: dict, load_base: Callable[[], None], adapt: Callable[[], None]) -> None:
    """Before a checkpoint without its base loads: the base from ``init_weights`` (``load_base`` reads it into the
    plain net), adapters applied (``adapt``), the digest checked, the base's tensors put back into the state dict."""
    info = checkpoint.get(BASE_KEY)
    if info is None:
        return adapt()
    if not module.hparams.get("init_weights"):
        raise MissingBaseError(
            f"the checkpoint holds LoRA adapters without their frozen base ({info['tensors']} tensors, sha256 "
            f"{info['sha256'][:12]}...): give the base it was trained on as init_weights (--model.init_args."
            "init_weights=<folder or file>, or load_from_checkpoint(path, init_weights=...))"
        )
    if adapted(module):
        training = {n: p.requires_grad for n, p in module.named_parameters()}
        with unwrapped(module):
            load_base()
        for n, p in module.named_parameters():  # a loader that assigns new tensors: the same ones train
            p.requires_grad_(training[n])
    else:
        load_base()
        adapt()
    live = module.state_dict()
    keys = _frozen_keys(module, live)
    if len(keys) != info["tensors"] or digest(live, keys) != info["sha256"]:
        raise CheckpointError(
            f"init_weights {module.hparams.init_weights!r} is not the base these LoRA adapters were trained on (its "
            f"frozen tensors' sha256 differs from the checkpoint's {info['sha256'][:12]}...): give that base"
        )
    checkpoint["state_dict"].update({k: live[k] for k in keys})
