"""Checkpoints read back: weights-only by every path.

Every way in reads the file with ``zoo.layers.weights.load_file``: ``Module.load_from_checkpoint`` (local path or
URL; Lightning's own unpickles a remote file with ``weights_only=False``), the Trainer's ``--ckpt_path`` restore
(``WeightsOnlyCheckpointIO``), ``init_weights`` and the importers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.io import TorchCheckpointIO

from zoo.layers import compat
from zoo.layers.weights import is_remote, load_file


class WeightsOnlyLoading:
    """Mixed into every zoo LightningModule: ``load_from_checkpoint`` reads weights-only, local paths and URLs alike."""

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | Path, map_location: Any = "cpu", strict: bool | None = None, **kwargs: Any
    ) -> LightningModule:
        """The module a checkpoint (a path, or an fsspec URL such as ``https://...``) holds, rebuilt from its
        hyperparameters (``kwargs`` override them) and loaded on ``map_location``; a file that would run code when
        unpickled, a truncated one and a foreign one are refused, naming the file. ``weights_only`` is accepted
        for Lightning's signature and always true."""
        kwargs.pop("weights_only", None)
        if kwargs.pop("hparams_file", None) is not None:
            raise ValueError("hparams_file is not supported: a zoo checkpoint carries its hyperparameters")
        checkpoint = load_file(checkpoint_path, map_location=map_location)
        module = compat.module_from_checkpoint(cls, checkpoint, strict=strict, **kwargs)
        tensor = next((t for t in checkpoint.get("state_dict", {}).values() if isinstance(t, torch.Tensor)), None)
        return module if tensor is None else module.to(tensor.device)  # where map_location put the weights


class WeightsOnlyCheckpointIO(TorchCheckpointIO):
    """The Trainer's checkpoint reader (``--ckpt_path``, ``ckpt_path="best"``) through ``load_file``."""

    def load_checkpoint(self, path: str | Path, map_location: Any = None, weights_only: bool | None = None) -> dict:
        if not is_remote(path) and not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
        return load_file(path, map_location=map_location)
