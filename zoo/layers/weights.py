"""Loading weights that come from outside: weights-only, with errors that name what is wrong.

A ``.pt``/``.pth``/``.ckpt`` file is read with ``torch.load(weights_only=True)``, which refuses any
pickled object that is not a tensor or a plain container, so a crafted file cannot run code.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint asked to unpickle something other than tensors and plain containers."""


def load_file(path: str | Path) -> dict:
    """Read a checkpoint or weights file without executing pickled code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist: pass the path of a local file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file as load_safetensors

        return load_safetensors(str(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"refused to load {str(path)!r}: it carries pickled objects that are not weights "
            f"(loading it would execute code from the file). Only load files you created or trust "
            f"in the safetensors or weights-only format. Detail: {str(err).splitlines()[0]}"
        ) from err


def extract_state_dict(obj: Mapping, prefix: str = "") -> dict[str, Tensor]:
    """Accept a bare state dict, a Lightning checkpoint, or ``{"model": ...}``.

    With ``prefix`` (``"net."``: a zoo module's net) and keys under it, only those keys, the prefix stripped:
    the module's other state (EMA or target copies, buffers of the objective) is not the net's.
    """
    for key in ("state_dict", "model", "module"):
        if key in obj and isinstance(obj[key], Mapping):
            obj = obj[key]
            break
    if prefix and any(k.startswith(prefix) for k in obj):
        return {k[len(prefix):]: v for k, v in obj.items() if k.startswith(prefix)}
    return dict(obj)


def shape_mismatches(net: nn.Module, state_dict: Mapping[str, Tensor]) -> list[str]:
    """Keys whose shapes differ, and keys present on only one side, as readable lines."""
    own = net.state_dict()
    lines = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    lines += [f"{k}: missing from checkpoint" for k in own.keys() - state_dict.keys()]
    lines += [f"{k}: not in model" for k in state_dict.keys() - own.keys()]
    return sorted(lines)


def check_compatible(net: nn.Module, state_dict: Mapping[str, Tensor], source: str) -> None:
    """Raise a ValueError listing every mismatched key if ``state_dict`` does not fit ``net``."""
    bad = shape_mismatches(net, state_dict)
    if bad:
        listing = "\n  ".join(bad[:50]) + ("\n  ..." if len(bad) > 50 else "")
        raise ValueError(
            f"{source} does not match the configured {type(net).__name__} "
            f"({len(bad)} mismatched keys):\n  {listing}\n"
            "Use the config the checkpoint was trained with, or a checkpoint of this model."
        )


def load_weights(net: nn.Module, path: str | Path, prefix: str = "") -> nn.Module:
    """Load a local weights file into ``net`` weights-only, after checking every key and shape."""
    state_dict = extract_state_dict(load_file(path), prefix)
    check_compatible(net, state_dict, f"weights file {str(path)!r}")
    net.load_state_dict(state_dict)
    return net
