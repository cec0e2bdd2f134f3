"""Errors that mean "the input you gave cannot work", which the CLI prints as one line instead of a traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

# The zoo's extras (pyproject.toml's optional-dependencies) by the package each brings, as a feature that needs one
# names it: (what the user knows it as, the extra that installs it).
EXTRAS = {
    "lm_eval": ("lm-eval", "eval"),
    "peft": ("PEFT", "adapt"),
    "diffusers": ("diffusers", "latent"),
    "timm": ("timm", "timm"),
    "torch_fidelity": ("torch-fidelity", "fid"),
    "stable_baselines3": ("Stable-Baselines3", "rl"),
}
# Every package the zoo imports only where a feature uses it: the extras', and ftfy (open_clip's tokenizer cleaning,
# which open_clip_torch brings).
OPTIONAL_PACKAGES = frozenset({*EXTRAS, "ftfy"})


class InputError(ValueError):
    """Data, a file or a setting the user gave that cannot work (too little text for a split, say); the message
    names it and the fix."""


class CheckpointError(RuntimeError):
    """A file that is not a loadable checkpoint (truncated, another format); the message names it and says why."""


class MissingBaseError(CheckpointError):
    """A LoRA checkpoint that left its frozen base out, loaded without the ``init_weights`` it was trained on."""


class TruncatedCheckpointError(CheckpointError):
    """A checkpoint whose end is missing (an interrupted copy, download or save)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint asked to unpickle something other than tensors and plain containers."""


def one_line(err: BaseException) -> str:
    """``err``'s message; for one raised in a DataLoader worker, which torch re-raises with the worker's traceback as
    its message, the original message only."""
    text = str(err)
    if "Original Traceback" in text:
        text = text.rstrip().splitlines()[-1].split(": ", 1)[-1]  # "zoo.errors.InputError: <message>"
    return " ".join(text.split()) if "\n" in text else text


class MissingExtra(InputError):
    """A feature's optional package is not installed; the message names the feature and the extra's install line."""


def install_line(extra: str) -> str:
    """The locked install of one of the zoo's extras, as the README installs the zoo."""
    return f'pip install -c constraints.txt -e ".[{extra}]"'


def missing_extra(package: str, feature: str) -> MissingExtra:
    """``feature`` (what the user asked for: a setting, a class, a command) cannot run without ``package``."""
    top = package.split(".")[0]
    if top not in EXTRAS:  # a package no extra of the zoo's brings
        return MissingExtra(f"{feature} needs {top}, which is not installed: pip install {top}")
    shown, extra = EXTRAS[top]
    return MissingExtra(f"{feature} needs {shown}, which is not installed: {install_line(extra)}")


def import_extra(name: str, feature: str) -> ModuleType:
    """``import name`` (a module of an extra's package), where ``feature`` runs; if the package (or one it needs) is
    missing, the one line that names the feature and the extra."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise missing_extra(name, feature) from err
