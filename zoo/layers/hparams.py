"""Hyperparameters that rebuild a module from its checkpoint alone, and stay weights-only loadable.

Through ``cli.py``, LightningCLI hands ``save_hyperparameters`` the parsed config, where an injected
net is a ``{class_path, init_args}`` dict: kept, it lets ``load_from_checkpoint(path)`` rebuild the
same net. A module built in Python gets the net object itself, which would be pickled into the
checkpoint (and refused by a weights-only load), so it is left out: pass ``net=`` when loading. Settings
objects (dataclasses such as ``AdamWCosine``) are kept as plain dicts of their fields, for the same reason.
"""

from __future__ import annotations

import dataclasses
import inspect

from lightning.pytorch import LightningModule
from torch import nn

from zoo.layers.compat import given_hyperparameters


def save_hparams(module: LightningModule, *module_args: str) -> None:
    """``save_hyperparameters`` from the caller's ``__init__``, dropping ``module_args`` given as nn.Modules."""
    frame = inspect.currentframe().f_back
    given = given_hyperparameters()
    if given is not None:
        ignore = [a for a in module_args if isinstance(given.get(a), nn.Module)]
    else:
        ignore = [a for a in module_args if isinstance(frame.f_locals.get(a), nn.Module)]
    module.save_hyperparameters(ignore=ignore, frame=frame)
    for key, value in module.hparams.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            module.hparams[key] = dataclasses.asdict(value)
