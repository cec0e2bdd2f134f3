"""Hyperparameters that rebuild a module from its checkpoint alone, and stay weights-only loadable.

Through ``cli.py``, LightningCLI hands ``save_hyperparameters`` the parsed config, where an injected
net is a ``{class_path, init_args}`` dict: kept, it lets ``load_from_checkpoint(path)`` rebuild the
same net. A module built in Python gets the net object itself, which would be pickled into the
checkpoint (and refused by a weights-only load), so it is left out: pass ``net=`` when loading. Settings
objects (dataclasses such as ``AdamWCosine``) are kept as plain dicts of their fields, for the same reason, and an
object that states its own config (``config()``: its ``{class_path, init_args}``, as a diffusion objective does) as
that config.
"""

from __future__ import annotations

import dataclasses
import inspect

from lightning.pytorch import LightningDataModule, LightningModule

from zoo.compat import given_hyperparameters


def save_hparams(module: LightningModule | LightningDataModule, *object_args: str) -> None:
    """``save_hyperparameters`` from the caller's ``__init__``, dropping ``object_args`` given as objects (an
    nn.Module, a DataModule) rather than as their ``{class_path, init_args}`` config."""
    frame = inspect.currentframe().f_back
    given = given_hyperparameters()
    values = given if given is not None else frame.f_locals
    ignore = [a for a in object_args if _is_object(values.get(a)) and not _states_its_config(values.get(a))]
    module.save_hyperparameters(ignore=ignore, frame=frame)
    for key, value in module.hparams.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            module.hparams[key] = dataclasses.asdict(value)
        elif _is_object(value) and _states_its_config(value):
            module.hparams[key] = value.config()


def _states_its_config(value) -> bool:
    return not isinstance(value, type) and callable(getattr(value, "config", None))


def _is_object(value) -> bool:
    # A config is plain data (a dict from the CLI, a dataclass of settings); anything else would be pickled.
    plain = (dict, list, tuple, str, int, float, bool, type(None))
    return not isinstance(value, plain) and not (dataclasses.is_dataclass(value) and not isinstance(value, type))
