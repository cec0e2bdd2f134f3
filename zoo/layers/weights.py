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


# What a sharded checkpoint's ``.metadata`` pickle may name: torch.distributed.checkpoint's metadata classes
# and the torch/pathlib types they hold (recorded from the files torch 2.14 writes). Anything else, such as a
# ``__reduce__`` naming os.system, is refused before it is looked up, so nothing in the file executes.
DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "BytesStorageMetadata",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name
    "torch": {"Size"},  # and every torch dtype, checked below
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
DCP_METADATA_FILE = ".metadata"


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if is_dtype or name in DCP_METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a checkpoint metadata class")


def read_sharded_metadata(path: str | Path):
    """torch.distributed.checkpoint's ``Metadata`` from ``path`` (a sharded checkpoint folder or its ``.metadata``
    file), unpickled with only the metadata classes admitted: a crafted file is refused, and runs nothing."""
    path = Path(path)
    file = path / DCP_METADATA_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{str(file)!r} does not exist: {str(path)!r} is not a sharded checkpoint folder")
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as err:
        raise UnsafeCheckpointError(
            f"refused to read {str(file)!r}: it is not the metadata torch.distributed.checkpoint writes "
            f"(it asks to unpickle other objects, which would execute code from the file). Only load sharded "
            f"checkpoints you created or trust. Detail: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from err
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"refused to read {str(file)!r}: it holds a {type(metadata).__name__}, not Metadata")
    return metadata


def classifier_head(net: nn.Module) -> str:
    """The name of the net's classifier head: its last ``nn.Linear`` (ConvNet ``head``, ResNet ``fc``, torchvision
    ViT ``heads.head``, ConvNeXt ``classifier.2``), the layer whose size is the number of classes."""
    names = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError(f"{type(net).__name__} has no nn.Linear classifier head to resize")
    return names[-1]


def replace_head(net: nn.Module, num_classes: int) -> str:
    """Give ``net`` a freshly initialised head of ``num_classes`` outputs (``net.num_classes`` follows); one line saying so."""
    name = classifier_head(net)
    old = net.get_submodule(name)
    parent, _, attr = name.rpartition(".")
    setattr(net.get_submodule(parent), attr, nn.Linear(old.in_features, num_classes, bias=old.bias is not None))
    net.num_classes = num_classes
    return f"{name}: ({old.out_features}, {old.in_features}) -> ({num_classes}, {old.in_features})"


def load_with_new_head(
    net: nn.Module, state_dict: Mapping[str, Tensor], source: str, heads: list[str] | None = None
) -> list[str]:
    """Load pretrained weights into ``net`` whose head may differ in size (fine-tuning to other classes): the
    tensors of ``heads`` (module names; default the classifier head) whose shapes differ keep ``net``'s fresh
    values, every other key must match. Returns a line per tensor left out ("fc.weight: (1000, 512) in the
    weights, (5, 512) here"), empty when all loaded."""
    prefixes = tuple(f"{h}." for h in (heads or [classifier_head(net)]))
    own = net.state_dict()
    skipped = [k for k, v in state_dict.items()
               if k.startswith(prefixes) and k in own and tuple(v.shape) != tuple(own[k].shape)]
    kept = {k: v for k, v in state_dict.items() if k not in skipped}
    check_compatible(net, {**kept, **{k: own[k] for k in skipped}}, source)
    net.load_state_dict(kept, strict=False)
    return [f"{k}: {tuple(state_dict[k].shape)} in the weights, {tuple(own[k].shape)} here" for k in skipped]
