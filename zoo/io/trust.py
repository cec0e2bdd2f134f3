"""What a stored config may name: a checkpoint's, a registered model's or a URL's settings, checked as strings
before anything in them is imported.

A checkpoint records the config that built it (``hyper_parameters``: the module's ``_class_path`` and init
arguments, nets as ``{class_path, init_args}``; ``datamodule_hyper_parameters`` likewise), and so does an MLflow
model's ``module.json``. Whoever wrote the file wrote those strings, and every consumer would act on them:
jsonargparse imports each ``class_path`` (and a string given to a class- or callable-typed argument) before it
checks the class is of the right type, Lightning imports a checkpoint's ``_instantiator``, ``GymDataModule``
imports and calls its ``wrappers``, and gymnasium imports the module of an ``env_id`` written ``module:Env``.
A weights-only unpickler stops none of this: the file holds only strings.

So a stored config is walked first, as plain JSON, against an explicit allowlist:
  - the module and DataModule classes: exact class paths of the zoo's own (the families' LightningModules; the
    DataModules the application passes in), never a prefix;
  - every nested class path (nets, attention, towers; any ``{class_path}`` dict anywhere; a string given to an
    argument whose type is a class, ``type[...]`` or a callable): a class the zoo's family packages define;
  - one class from outside the zoo, by each of its paths (``EXTERNAL_PARTS``): diffusers' ``AutoencoderKL``, a
    latent diffusion model's autoencoder, which ``zoo.diffusion.latent`` builds (no other class of diffusers);
  - ``wrappers``: a reviewed set of ``gymnasium.wrappers`` classes that take plain values (none that take a
    callable, write files or open windows);
  - ``env_id``: an id gymnasium has registered, never ``module:Env``;
  - ``_instantiator``: the one LightningCLI records.
Anything else is refused in one line naming the file, the key and the value. What the user types, or writes in
their own YAML, is theirs and is not checked: ``trusted`` carries the class paths they named, so a checkpoint of
their own custom net still loads when their config names it too.

Settings that name where outputs go, or whether to download (``OUTPUT_ARGS``), are dropped from a stored config:
the current run decides.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import importlib
import inspect
import pkgutil
import re
import types
import typing
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import PurePath
from typing import Any

import yaml

from zoo.io.weights import CheckpointError
from zoo.io.yaml_text import safe_load

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
# Classes outside the zoo that a stored config may name, by every path of each, never imported here: diffusers'
# AutoencoderKL, whose init arguments are plain values (tests/shared/test_stored_config.py keeps this list equal to
# zoo.diffusion.latent.AUTOENCODERS, what the diffusion module builds).
EXTERNAL_PARTS = frozenset(
    {
        "diffusers.AutoencoderKL",
        "diffusers.models.AutoencoderKL",
        "diffusers.models.autoencoders.autoencoder_kl.AutoencoderKL",
    }
)
IMPORT_LIST_ARGS = ("wrappers",)  # init arguments whose entries are import paths called by their owner
ENV_ID_ARGS = ("env_id",)  # init arguments that gymnasium.make resolves (``module:Env`` imports ``module``)
# Chosen by the current run (its defaults, or the user's flags), never by a file, so dropped from stored configs:
# where outputs go (GymDataModule's video_dir, DiffusionDataModule's output_dir: names inside the run's folder, see
# zoo.tracking.in_run_dir), and whether a DataModule downloads into its root (TorchvisionDataModule's download).
OUTPUT_ARGS = ("video_dir", "output_dir", "download")


class UntrustedConfigError(CheckpointError):
    """A stored config names something outside the allowlist; nothing it names was imported."""


@dataclasses.dataclass(frozen=True)
class Allowlist:
    """Exact class paths a stored config may name, each with its class (ours, so already safe to hold)."""

    modules: Mapping[str, type]  # LightningModules
    data: Mapping[str, type]  # LightningDataModules
    parts: Mapping[str, type | None]  # nested: nets, attention, towers, ...; None: an external class (not imported)
    env_modules: frozenset[str] = frozenset()  # modules of the application's own envs (``env_id: module:Env``)
    trusted: frozenset[str] = frozenset()  # named by the user's own config or flags: theirs to vouch for

    def with_trusted(self, paths: Iterable[str]) -> Allowlist:
        return dataclasses.replace(self, trusted=self.trusted | frozenset(paths))


@functools.cache
def zoo_classes() -> dict[str, type]:
    """Every class the family packages define, by each path it can be named with (``zoo.gpt.GPT`` and
    ``zoo.gpt.gpt.GPT``): the package's own exports and each defining module's names."""
    found: dict[str, type] = {}
    for package_name in FAMILY_PACKAGES:
        package = importlib.import_module(package_name)
        names = [m.name for m in pkgutil.iter_modules(package.__path__, f"{package_name}.")]
        for module in [package, *map(importlib.import_module, names)]:
            for attr, value in vars(module).items():
                if not inspect.isclass(value) or not (value.__module__ == module.__name__ or module is package):
                    continue  # a name a module imported is allowed by the path of the module that defines it
                if value.__module__.startswith(FAMILY_PACKAGES):
                    found[f"{module.__name__}.{attr}"] = value
    return found


def zoo_allowlist(data: Mapping[str, type] | Iterable[type] = (), env_modules: Iterable[str] = ()) -> Allowlist:
    """The zoo's classes as an allowlist; ``data``: the application's DataModules (zoo/ never imports them), and
    ``env_modules``: the modules of its own gymnasium envs."""
    import torch
    from lightning.pytorch import LightningModule

    classes = zoo_classes()
    # found, not imported here: the samplers and training objectives a diffusion module holds
    bases = ("zoo.diffusion.samplers.Sampler", "zoo.diffusion.flow.Objective")
    samplers = [c for p, c in classes.items() if p in bases]
    if not isinstance(data, Mapping):
        data = {path: cls for cls in data for path in paths_of(cls)}
    return Allowlist(
        modules={p: c for p, c in classes.items() if issubclass(c, LightningModule)},
        data=dict(data),
        # Settings dataclasses are stored as plain dicts, never by class path: only nets and their parts are named,
        # and the samplers and objectives (objects without parameters, so not nn.Modules) a diffusion module holds.
        parts={
            **{p: c for p, c in classes.items() if issubclass(c, (torch.nn.Module, *samplers))},
            **dict.fromkeys(EXTERNAL_PARTS),  # their arguments are checked as plain data, without their annotations
        },
        env_modules=frozenset(env_modules),
    )


def paths_of(cls: type) -> list[str]:
    """``pkg.Name`` (as exported) and ``pkg.module.Name`` (where it is defined)."""
    package = cls.__module__.rsplit(".", 1)[0]
    return [f"{cls.__module__}.{cls.__qualname__}", f"{package}.{cls.__qualname__}"]


def check_stored_model(hparams: Mapping[str, Any], source: str, allow: Allowlist, cls: type | None = None) -> dict:
    """The module part of a stored config (``_class_path`` or ``class_path`` plus init arguments), checked; returns
    the init arguments without the settings a file may not choose (``OUTPUT_ARGS``). ``cls``: the class a caller
    already holds (``Module.load_from_checkpoint``), for a checkpoint that names none."""
    hparams = dict(hparams)
    class_path = hparams.pop("_class_path", None)
    if (instantiator := hparams.pop("_instantiator", None)) not in (None, LIGHTNING_INSTANTIATOR):
        raise _refusal(source, "_instantiator", instantiator, "the instantiator LightningCLI records")
    if class_path is not None and not (cls is not None and class_path in paths_of(cls)):  # the caller's own class
        cls = _allowed(class_path, allow.modules, allow, source, "model class_path", "one of the zoo's modules")
    return _checked_args(cls, hparams, "model.init_args", source, allow)


def check_stored_data(class_path: str, init_args: Mapping[str, Any], source: str, allow: Allowlist) -> dict:
    """The DataModule part of a stored config, checked; returns its init arguments without ``OUTPUT_ARGS``."""
    cls = _allowed(class_path, allow.data, allow, source, "data class_path", "one of the zoo's DataModules")
    return _checked_args(cls, init_args, "data.init_args", source, allow)


def _allowed(path: Any, allowed: Mapping[str, type], allow: Allowlist, source: str, key: str, what: str):
    """The class ``path`` names if the allowlist (or the user) admits it: a string lookup, nothing imported."""
    if isinstance(path, str) and path in allowed:
        return allowed[path]
    if isinstance(path, str) and path in allow.trusted:
        return None  # the user's own class: its arguments are theirs too
    raise _refusal(source, key, path, what)


def _checked_args(cls: type | None, init_args: Mapping[str, Any], where: str, source: str, allow: Allowlist) -> dict:
    hints = _init_hints(cls) if cls is not None else {}
    out = {}
    for key, value in dict(init_args).items():
        if key in OUTPUT_ARGS:
            continue
        here = f"{where}.{key}"
        if key in IMPORT_LIST_ARGS and value is not None:
            _check_wrappers(value, here, source, allow)
        elif key in ENV_ID_ARGS:
            _check_env_id(value, here, source, allow)
        else:
            _check_value(value, hints.get(key), here, source, allow)
        out[key] = value
    return out


def _check_value(value: Any, hint: Any, where: str, source: str, allow: Allowlist) -> None:
    if isinstance(value, Mapping):
        if "class_path" in value:
            # a part of a net, or a DataModule inside another (DiffusionDataModule's images)
            cls = _allowed(
                value["class_path"],
                {**allow.parts, **allow.data},
                allow,
                source,
                f"{where}.class_path",
                "a class the zoo ships",
            )
            for sub in ("init_args", "dict_kwargs"):
                if isinstance(value.get(sub), Mapping):
                    _checked_args(cls, value[sub], f"{where}.{sub}", source, allow)
            return
        for key, item in value.items():  # a dict argument: any class path inside is refused the same way
            _check_value(item, _item_hint(hint, key=True), f"{where}.{key}", source, allow)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, _item_hint(hint), f"{where}[{i}]", source, allow)
    elif isinstance(value, str) and _admits_class(hint) and value not in _literals(hint):
        # jsonargparse reads a string given to a class-, type- or callable-typed argument as a class path (a union's
        # Literal names, such as GPT's older ``mlp: gelu``, match before any import)
        _allowed(value, allow.parts, allow, source, where, "a class the zoo ships")
    elif isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        # jsonargparse loads a string given to a non-string argument as YAML: a class path may hide inside
        try:
            loaded = safe_load(value, f"{source}: {where}")  # an alias bomb: refused, not walked
        except yaml.YAMLError:
            return
        if isinstance(loaded, (Mapping, list)):
            _check_value(loaded, hint, where, source, allow)


def _check_wrappers(value: Any, where: str, source: str, allow: Allowlist) -> None:
    if not isinstance(value, (list, tuple)):
        raise _refusal(source, where, value, "a list of gymnasium wrappers")
    for i, wrapper in enumerate(value):
        path = wrapper.get("class_path") if isinstance(wrapper, Mapping) else wrapper
        if not (isinstance(path, str) and (path in REVIEWED_WRAPPERS or path in allow.trusted)):
            raise _refusal(source, f"{where}[{i}]", path, "one of the reviewed gymnasium.wrappers classes")
        if isinstance(wrapper, Mapping):
            _check_value(wrapper.get("init_args") or {}, None, f"{where}[{i}].init_args", source, allow)


def _check_env_id(value: Any, where: str, source: str, allow: Allowlist) -> None:
    import gymnasium as gym

    # ``module:Env`` makes gymnasium import ``module``; a registered id resolves to an entry point that installed
    # code registered.
    if isinstance(value, str) and (value in allow.trusted or (":" not in value and value in gym.registry)):
        return
    if isinstance(value, str) and value.partition(":")[0] in allow.env_modules:  # the application's own envs
        return
    raise _refusal(source, where, value, "an environment id gymnasium has registered (module:Env is refused)")


def _refusal(source: str, key: str, value: Any, expected: str) -> UntrustedConfigError:
    return UntrustedConfigError(
        f"refused {source}: its {key} is {value!r}, which is not {expected}; nothing it names was imported. "
        "A stored config may not choose code to run: if you trust the file, give that setting yourself "
        "(--config <your YAML>, or the flag)"
    )


def _init_hints(cls: type) -> dict[str, Any]:
    """The annotations of ``cls.__init__`` and of the base classes its ``**kwargs`` reach, resolved."""
    hints: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        init = vars(base).get("__init__")
        if init is None or base.__module__.split(".")[0] in ("builtins", "torch", "lightning"):
            continue
        try:
            hints.update(typing.get_type_hints(init))
        except Exception:
            hints.update({name: type for name in inspect.signature(init).parameters})
    return hints


def _item_hint(hint: Any, key: bool = False) -> Any:
    """The annotation of a container's items (a dict's values with ``key``), else None."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        items = [_item_hint(a, key) for a in args]
        items = [a for a in items if a is not None]
        return typing.Union[tuple(items)] if items else None  # noqa: UP007 - built from a runtime tuple
    if origin in (dict, collections.abc.Mapping) and len(args) == 2:
        return args[1] if key else None
    if origin in (list, tuple, set, collections.abc.Sequence) and args:
        return args[0]
    return None


def _literals(hint: Any) -> set:
    """The values a ``Literal`` in ``hint`` (alone or in a union) names."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return set(typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_literals(a) for a in typing.get_args(hint)))
    return set()


def _admits_class(hint: Any) -> bool:
    """Whether jsonargparse may resolve a string given to an argument annotated ``hint`` by importing it."""
    if hint is None or hint is Any:
        return False
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return False
    if origin in (typing.Union, types.UnionType):
        return any(_admits_class(a) for a in typing.get_args(hint))
    if origin is type or hint is type or origin is collections.abc.Callable or hint is collections.abc.Callable:
        return True
    if origin is not None:
        return False  # containers: their items are checked one by one
    plain = (str, int, float, bool, bytes, type(None), PurePath, Enum, dict, list, tuple, set)
    return isinstance(hint, type) and not issubclass(hint, plain)


DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def trusted_class_paths(config: Any) -> set[str]:
    """What a user's own config names as code, at any depth: class paths, wrappers, env ids and dotted names."""
    found: set[str] = set()
    if isinstance(config, Mapping):
        for key, value in config.items():
            if key in ("class_path", *ENV_ID_ARGS) and isinstance(value, str):
                found.add(value)
            found |= trusted_class_paths(value)
    elif isinstance(config, (list, tuple)):
        for value in config:
            found |= trusted_class_paths(value)
    elif isinstance(config, str) and DOTTED.match(config):
        found.add(config)
    return found
