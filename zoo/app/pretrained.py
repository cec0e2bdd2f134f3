"""The net a pretrained source states, set in the model config before the net is built.

With ``init_weights`` a model folder (a Hugging Face GPT or CLIP folder, an open_clip folder, a diffusers
``DiTTransformer2DModel`` or ``UNet2DModel`` folder) or a Stable-Baselines3 zip, the net's architecture is the
source's: the family's rule (the families table's ``net_from_folder``, a row of ``SOURCES``) reads it from the
source's config, and the config's net block needs no more than its ``class_path``. What the block leaves at the class's
defaults is the source's; a value it states that the source's config contradicts, or another class, is refused in one
line naming each (the weights compute what their config says: a net built otherwise would load them into another
function, or fail on their shapes), except the settings the family's load adapts (a CLIP tower's ``embed_dim``: the
projection is replaced). A value equal to the class's default cannot be told from one left out, and is the source's.

A source the rule does not read (a weights file, a zoo checkpoint, an MLflow model) leaves the config as it is: the
module's load checks the net against the weights.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from zoo.errors import InputError
from zoo.io.weights import is_remote

NET = "model.init_args.net"


@dataclasses.dataclass(frozen=True)
class Source:
    """A family's rule: ``read(path)`` gives the net's ``{class_path, init_args}`` as the source at ``path`` states
    it, or None where ``path`` is not a source of this kind; ``adapted``: init_args that the family's load adapts
    to the config's value (at any depth), which a config may therefore state otherwise."""

    read: Callable[[Path], dict[str, Any] | None]
    adapted: frozenset[str] = frozenset()


def gpt_folder(path: Path) -> dict[str, Any] | None:
    """A Hugging Face model folder's ``GPT`` (``zoo.gpt.pretrained``)."""
    if not (path / "config.json").is_file():
        return None
    from zoo.gpt.pretrained import net_config, net_kwargs, read_folder

    folder, config = read_folder(path)
    return net_config(net_kwargs(config, folder))


def diffusers_folder(path: Path) -> dict[str, Any] | None:
    """A diffusers ``DiTTransformer2DModel`` or ``UNet2DModel`` folder's net (``zoo.diffusion.pretrained``)."""
    from zoo.diffusion.pretrained import net_config

    return net_config(path) if path.is_dir() else None


def clip_folder(path: Path) -> dict[str, Any] | None:
    """A Hugging Face CLIP or open_clip folder's ``CLIP`` (``zoo.clip.pretrained``)."""
    from zoo.clip.pretrained import net_config

    return net_config(path)


def sb3_zip(path: Path) -> dict[str, Any] | None:
    """A Stable-Baselines3 agent's net (``zoo.rl.sb3``)."""
    if not path.is_file() or not zipfile.is_zipfile(path):
        return None
    from zoo.rl.sb3 import net_config

    return net_config(path)


SOURCES: dict[str, Source] = {
    "gpt": Source(gpt_folder),
    "diffusers": Source(diffusers_folder),
    "clip": Source(clip_folder, frozenset({"embed_dim"})),  # zoo.clip.hf.load_source_into replaces the projection
    "sb3": Source(sb3_zip),
}  # by the families table's name


def net_from_source(cfg: Namespace, source: Source | None) -> str | None:
    """``cfg``'s net (``model.init_args.net``) made the one its ``init_weights`` states, by the family's ``source``
    rule: a line saying so, or None where there is no rule or it does not read that path. A value of the config's
    net block that the source contradicts raises ``InputError`` naming each."""
    init = (cfg.get("model") or Namespace()).get("init_args", Namespace())
    path, net = init.get("init_weights"), init.get("net")
    if source is None or not isinstance(path, str) or is_remote(path) or not isinstance(net, Namespace):
        return None
    theirs = source.read(Path(path))
    if theirs is None:
        return None
    conflicts: list[str] = []
    _merge(net, theirs, NET, _defaults(_class(theirs["class_path"])), source.adapted, conflicts)
    if conflicts:
        raise InputError(
            f"init_weights {path!r} states the net, and the config's net block contradicts it: {'; '.join(conflicts)}. "
            f"Leave these out of {NET} (its class_path is enough), or start from other weights"
        )
    return f"the net from init_weights {path!r}: {theirs['class_path']} as its config states it"


def _merge(net: Namespace, theirs: dict, where: str, defaults: dict, adapted: frozenset, conflicts: list) -> None:
    """``net`` (``{class_path, init_args}`` as parsed) given ``theirs``' values where it holds the defaults, its own
    kept where ``adapted``, a line in ``conflicts`` for each other value (or class) of its own that differs."""
    cls = _class(theirs["class_path"])
    if not issubclass(_class(net.class_path), cls):
        conflicts.append(f"{where}.class_path={net.class_path} (the source's: {theirs['class_path']})")
        return
    if not isinstance(net.get("init_args"), Namespace):
        net.init_args = Namespace()
    args = net.init_args
    for key, value in (theirs.get("init_args") or {}).items():
        old, default, at = args.get(key), defaults.get(key), f"{where}.init_args.{key}"
        if isinstance(value, dict) and "class_path" in value and isinstance(old, Namespace) and "class_path" in old:
            if issubclass(_class(old.class_path), _class(value["class_path"])):
                _merge(old, value, at, _nested_defaults(value["class_path"], default), adapted, conflicts)
                continue
            if _class(old.class_path) is not _class_of(default):
                conflicts.append(f"{at}={old.class_path} (the source's: {value['class_path']})")
                continue
        elif _given(old, default) and not _same(old, value):
            if key not in adapted:
                conflicts.append(f"{at}={_plain(old)!r} (the source's: {value!r})")
            continue
        args[key] = _namespace(value)


def _given(value: Any, default: Any) -> bool:
    """Whether a parsed value is the config's own: set, and not the class's default (which it holds when left out).
    A nested class is compared by its class and arguments (``_merge``), not here."""
    if value is None or (isinstance(value, Namespace) and "class_path" in value):
        return False
    return not _same(value, default)


def _same(a: Any, b: Any) -> bool:
    return _plain(a) == _plain(b)


def _plain(value: Any) -> Any:
    """A parsed value as plain data: namespaces as dicts, tuples as lists."""
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _namespace(value: Any) -> Any:
    """The zoo's own nested ``{class_path, init_args}`` dicts as the parser's namespaces, which it instantiates."""
    return Namespace(**{k: _namespace(v) for k, v in value.items()}) if isinstance(value, dict) else value


def _class(path: str) -> type:
    """The class a class path names: one the parser has imported for the config, or one a family's rule names."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _defaults(cls: Any) -> dict[str, Any]:
    params = inspect.signature(cls).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _class_of(default: Any) -> type | None:
    """The class of a parameter's default: a class, an injected ``functools.partial`` of one, or an instance."""
    if default is None or isinstance(default, type):
        return default
    return getattr(default, "func", type(default))


def _nested_defaults(class_path: str, default: Any) -> dict[str, Any]:
    """The defaults of a nested class's arguments, with those a partial default of the parameter sets."""
    return {**_defaults(_class(class_path)), **(getattr(default, "keywords", None) or {})}
