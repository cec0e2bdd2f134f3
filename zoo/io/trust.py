"""What a stored config may name: the allowlist that ``zoo.io.build`` builds a checkpoint's, a registered model's or
a URL's settings against.

A checkpoint records the config that built it (``hyper_parameters``: the module's ``_class_path`` and init
arguments, nets as ``{class_path, init_args}``; ``datamodule_hyper_parameters`` likewise), and so does an MLflow
model's ``module.json``. Whoever wrote the file wrote those strings. They are built by the zoo's own rules
(``zoo.io.build``), never interpreted by jsonargparse or Lightning, and may name:
  - the module and DataModule classes: exact class paths of the zoo's own (the families' LightningModules; the
    DataModules the application passes in), never a prefix;
  - nested classes (nets, attention, towers, samplers): a class the zoo's family packages define, where the
    parameter's annotation is a class it is a subclass of;
  - ``wrappers``: a reviewed set of ``gymnasium.wrappers`` classes that take plain values (none that take a
    callable, write files or open windows);
  - ``env_id``: an id gymnasium has registered, never ``module:Env``;
  - ``_instantiator``: the one LightningCLI records (never imported: the zoo builds the module itself).
Anything else is refused in one line naming the file, the key and the value, and what was imported (nothing, or a
class path of the user's own). What the user types, or writes in their own YAML, is theirs and is not checked:
``trusted`` carries the class paths they named, so a checkpoint of their own custom net still loads when their config
names it too. Only a word in a position that takes a class is one (a ``class_path``, a wrapper, an env id; a flag's
bare value where the class it sets takes a class, ``trusted_at``): a file name, a folder or any other string never is,
whatever dots it has (``--ckpt_path this.ckpt`` does not vouch for the module ``this``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from zoo.errors import MissingExtra
from zoo.io.weights import CheckpointError

# The packages whose classes a stored config may name (imported here only by these fixed names: they are ours).
FAMILY_PACKAGES = ("zoo.gpt", "zoo.diffusion", "zoo.clip", "zoo.cnn", "zoo.rl", "zoo.nn", "zoo.train", "zoo.io")
# What LightningCLI records as a module's ``_instantiator``; Lightning imports and calls it on load_from_checkpoint.
LIGHTNING_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"
# gymnasium's wrappers that take only plain values. Left out on review: Transform{Observation,Action,Reward} take a
# callable, RecordVideo writes where it is told, HumanRendering opens a window, the array conversions pick devices
# and array libraries.
REVIEWED_WRAPPERS = frozenset(
    f"gymnasium.wrappers.{name}"
    for name in (
        "AddRenderObservation",
        "AddWhiteNoise",
        "AtariPreprocessing",
        "Autoreset",
        "ClipAction",
        "ClipReward",
        "DelayObservation",
        "DiscretizeAction",
        "DiscretizeObservation",
        "DtypeObservation",
        "FilterObservation",
        "FlattenObservation",
        "FrameStackObservation",
        "GrayscaleObservation",
        "MaxAndSkipObservation",
        "NormalizeObservation",
        "NormalizeReward",
        "ObstructView",
        "OrderEnforcing",
        "PassiveEnvChecker",
        "RecordEpisodeStatistics",
        "RenderCollection",
        "RepeatAction",
        "RescaleAction",
        "RescaleObservation",
        "ReshapeObservation",
        "ResizeObservation",
        "StickyAction",
        "TimeAwareObservation",
        "TimeLimit",
    )
)
# Classes outside the zoo that a stored config's plain data may name, because their owner builds them from its own list
# (DiffusionModule's autoencoder: zoo.diffusion.latent.AUTOENCODERS, kept equal by tests/diffusion/test_latent.py).
EXTERNAL_PARTS = frozenset(
    {
        "diffusers.AutoencoderKL",
        "diffusers.models.AutoencoderKL",
        "diffusers.models.autoencoders.autoencoder_kl.AutoencoderKL",
    }
)
# Parts without parameters, by their bases' paths (so that checking a class imports none of them).
PART_BASES = frozenset(
    {"zoo.diffusion.samplers.Sampler", "zoo.diffusion.objective.Objective", "zoo.gpt.tune.rewards.Reward"}
)
IMPORT_LIST_ARGS = ("wrappers",)  # init arguments whose entries are import paths called by their owner
ENV_ID_ARGS = ("env_id",)  # init arguments that gymnasium.make resolves (``module:Env`` imports ``module``)


class UntrustedConfigError(CheckpointError):
    """A stored config names something outside the allowlist; the message says what was imported (nothing, or only
    the user's own classes)."""


@dataclasses.dataclass(frozen=True)
class Allowlist:
    """Exact class paths a stored config may name, each with its class (ours, so already safe to hold)."""

    modules: Mapping[str, type]  # LightningModules
    data: Mapping[str, type]  # LightningDataModules
    parts: Mapping[str, type]  # nested: nets, attention, towers, samplers
    env_modules: frozenset[str] = frozenset()  # modules of the application's own envs (``env_id: module:Env``)
    trusted: frozenset[str] = frozenset()  # named by the user's own config or flags: theirs to vouch for
    # (where, path): a flag's bare value (``--model.init_args.net=pkg.Net``), trusted only where the resolver finds it
    # taking a class (``where`` as ``zoo.io.build`` names it: ``model.init_args.net.class_path``)
    trusted_at: frozenset[tuple[str, str]] = frozenset()

    def with_trusted(self, paths: Iterable[str]) -> Allowlist:
        return dataclasses.replace(self, trusted=self.trusted | frozenset(paths))

    def with_trusted_at(self, positions: Iterable[tuple[str, str]]) -> Allowlist:
        return dataclasses.replace(self, trusted_at=self.trusted_at | frozenset(positions))


def zoo_class(path: Any) -> type | None:
    """The class ``path`` names if a family package defines it, else None: ``<package>.<Name>`` (the package's own
    exports) or ``<package>.<module>.<Name>`` (where it is defined), ``<module>`` a file of that package as found on
    disk. Only that one module of ours is imported, so a lookup never imports a module a file merely names, nor the
    family modules no config names (or their optional packages: a module that needs a missing one says so)."""
    if not isinstance(path, str) or not DOTTED.fullmatch(path):
        return None
    package_name = next((p for p in FAMILY_PACKAGES if path.startswith(f"{p}.")), None)
    if package_name is None:
        return None
    *inner, attr = path[len(package_name) + 1 :].split(".")
    where = package_name
    for part in inner:  # each level a file or folder of the one above, as found on disk (zoo.gpt.tune.rewards)
        if part not in _module_names(where):
            return None
        where = f"{where}.{part}"
    module = importlib.import_module(where)  # ours: a package or one of its files
    value = vars(module).get(attr)
    if not inspect.isclass(value) or not (value.__module__ == module.__name__ or hasattr(module, "__path__")):
        return None  # a name a module imported is allowed by the path of the module that defines it (or a package's)
    return value if value.__module__.startswith(FAMILY_PACKAGES) else None


@functools.cache
def _module_names(package_name: str) -> frozenset[str]:
    """The modules of one of the family packages: its files and folders, listed (nothing in them runs)."""
    package = importlib.import_module(package_name)  # one of FAMILY_PACKAGES or a folder in one: ours
    return frozenset(m.name for m in pkgutil.iter_modules(getattr(package, "__path__", [])))


@functools.cache
def zoo_classes() -> dict[str, type]:
    """Every class the family packages define, by each path it can be named with (``zoo.gpt.GPT`` and
    ``zoo.gpt.gpt.GPT``): for a listing (the allowlist itself looks a path up, ``zoo_class``). Every module is
    imported, save those whose optional package is not installed (no config can use their classes then)."""
    found: dict[str, type] = {}
    waiting = list(FAMILY_PACKAGES)
    while waiting:
        module_name = waiting.pop(0)
        try:
            module = importlib.import_module(module_name)
        except MissingExtra:
            continue
        for attr in vars(module):
            if (cls := zoo_class(f"{module_name}.{attr}")) is not None:
                found[f"{module_name}.{attr}"] = cls
        waiting += [f"{module_name}.{name}" for name in sorted(_module_names(module_name))]  # a folder's files too
    return found


class ZooClasses(Mapping[str, type]):
    """The zoo's classes of one kind (``is_kind``), looked up one path at a time (``zoo_class``); iterating lists
    them all (``zoo_classes``), which imports every family module."""

    def __init__(self, is_kind: Callable[[type], bool]) -> None:
        self.is_kind = is_kind

    def __getitem__(self, path: str) -> type:
        cls = zoo_class(path)
        if cls is None or not self.is_kind(cls):
            raise KeyError(path)
        return cls

    def __iter__(self) -> Iterator[str]:
        return (p for p, c in zoo_classes().items() if self.is_kind(c))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def is_module(cls: type) -> bool:
    from lightning.pytorch import LightningModule

    return issubclass(cls, LightningModule)


def is_part(cls: type) -> bool:
    """Settings dataclasses are stored as plain dicts, never by class path: only nets and their parts are named, and
    the samplers and objectives (objects without parameters, so not nn.Modules) a diffusion module holds, and GRPO's
    rewards (named only where the user's own config is resolved: a stored config's are dropped, zoo.io.build)."""
    import torch

    return issubclass(cls, torch.nn.Module) or any(
        f"{k.__module__}.{k.__qualname__}" in PART_BASES for k in cls.__mro__
    )


def zoo_allowlist(data: Mapping[str, type] | Iterable[type] = (), env_modules: Iterable[str] = ()) -> Allowlist:
    """The zoo's classes as an allowlist; ``data``: the application's DataModules (zoo/ never imports them), and
    ``env_modules``: the modules of its own gymnasium envs."""
    if not isinstance(data, Mapping):
        data = {path: cls for cls in data for path in paths_of(cls)}
    return Allowlist(
        modules=ZooClasses(is_module), data=dict(data), parts=ZooClasses(is_part), env_modules=frozenset(env_modules)
    )


def paths_of(cls: type) -> list[str]:
    """``pkg.Name`` (as exported) and ``pkg.module.Name`` (where it is defined)."""
    package = cls.__module__.rsplit(".", 1)[0]
    return [f"{cls.__module__}.{cls.__qualname__}", f"{package}.{cls.__qualname__}"]


MODULE_EXPECTED = "one of the zoo's modules"
DATA_EXPECTED = "one of the zoo's DataModules"
ENV_ID_EXPECTED = "an environment id gymnasium has registered (module:Env is refused)"


def check_env_id(value: Any, where: str, source: str, allow: Allowlist) -> None:
    import gymnasium as gym

    # ``module:Env`` makes gymnasium import ``module``; a registered id resolves to an entry point that installed
    # code registered.
    if isinstance(value, str) and (value in allow.trusted or (":" not in value and value in gym.registry)):
        return
    if isinstance(value, str) and value.partition(":")[0] in allow.env_modules:  # the application's own envs
        return
    raise refusal(source, where, value, ENV_ID_EXPECTED)


def refusal(source: str, key: str, value: Any, expected: str, imported: Iterable[str] = ()) -> UntrustedConfigError:
    """``imported``: the modules whose code ran while the config was read (only class paths the user gave import)."""
    shown = repr(value)
    shown = shown if len(shown) <= 200 else f"{shown[:200]}..."
    imported = sorted(set(imported))
    what_ran = (
        f"only {', '.join(imported)} (named by your own config or flags) was imported"
        if imported
        else "nothing it names was imported"
    )
    return UntrustedConfigError(
        f"refused {source}: its {key} is {shown}, which is not {expected}; {what_ran}. "
        "A stored config may not choose code to run: if you trust the file, give that setting yourself "
        "(--config <your YAML>, or the flag)"
    )


DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def trusted_class_paths(config: Any) -> set[str]:
    """What a user's own config names as code, at any depth: the values of ``class_path`` keys, wrappers and env ids.
    A string anywhere else is a value, whatever dots it has (a file name, a folder, a regex): never a class path."""
    found: set[str] = set()
    if isinstance(config, Mapping):
        for key, value in config.items():
            if key in ("class_path", *ENV_ID_ARGS) and isinstance(value, str):
                found.add(value)
            elif key in IMPORT_LIST_ARGS and isinstance(value, (list, tuple)):
                found |= {v for v in value if isinstance(v, str)}
            found |= trusted_class_paths(value)
    elif isinstance(config, (list, tuple)):
        for value in config:
            found |= trusted_class_paths(value)
    return found
