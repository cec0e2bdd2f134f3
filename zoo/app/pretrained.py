"""The net a pretrained source states, set in the model config before the net is built.

With ``init_weights`` a model folder (a Hugging Face GPT or CLIP folder, an open_clip folder, a diffusers
``DiTTransformer2DModel`` or ``UNet2DModel`` folder) or a Stable-Baselines3 zip, the net's architecture is the
source's: the family's rule (the families table's ``net_from_folder``, a row of ``SOURCES``) reads it from the
source's config, and the config's net block needs no more than its ``class_path``. What the block does not state is
the source's; a value it states that the source's config contradicts, or another class, is refused in one line naming
each (the weights compute what their config says: a net built otherwise would load them into another function, or
fail on their shapes), except the settings the family's load adapts (a CLIP tower's ``embed_dim``: the projection is
replaced). What a config states is read from the config itself (its files and flags parsed without the parser's
defaults, ``zoo.app.parser``), so a value stated equal to the class's default is the config's all the same.

A Hugging Face GPT folder is read once (``zoo.gpt.formats.folder.Folder``): the rule's read gives the net, and the
same value is handed on (``hand_over``) to the module that loads it and to the DataModule that tokenizes with its
tokenizer, whose folder (``pretrained_dir``) is derived from ``init_weights`` here (``data_folder``): a config names
its folder once.

A zoo model is a source of every family: a registered model (``models:/<name>/<version>``, ``models:/<name>@<alias>``,
``runs:/<id>/model``: its ``module.json``) or a checkpoint written through ``cli.py`` (its hyperparameters) states its
net as it was built, which is read as data by the stored-config rules (``zoo.io.build``: only the classes
``zoo.io.trust``'s allowlist and the user's own config name) and set the same way, so each stage of a lineage (base,
SFT, DPO, RL) starts from the last one's registered model with no net block written by hand. What the weights do not
depend on (dropout, activation checkpointing) may be the config's own, and a size the data states (a classifier's
``num_classes``: its head is replaced for another number of classes) stays the config's, for the data to fill.

A source may also state settings of the module beside its net: the ``VecNormalize`` statistics beside a
Stable-Baselines3 zip set the agent's ``norm_obs`` and ``clip_obs`` (``zoo.rl.sb3_statistics``), by
the same rule (a value of the config's own that differs is refused in one line).

A source no rule reads (a weights file of the net alone) leaves the config as it is: the module's load checks the net
against the weights. ``--print_config`` shows the net completed by the same rules (``zoo.app.parser``).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from zoo.errors import InputError
from zoo.io.weights import is_remote

NET = "model.init_args.net"


@dataclasses.dataclass(frozen=True)
class Source:
    """A family's rule: ``read(source)`` gives the net's ``{class_path, init_args}`` as the source states it, or None
    where it is not a source of this kind; ``source`` is what ``open(path)`` made of the path (the path itself, or a
    value read once and handed on, as a ``zoo.gpt.formats.folder.Folder``); ``adapted``: init_args that the family's
    load adapts to the config's value (at any depth), which a config may therefore state otherwise."""

    read: Callable[[Any], dict[str, Any] | None]
    adapted: frozenset[str] = frozenset()
    kept: frozenset[str] = frozenset()  # init_args the config keeps as it has them, unset included (sizes for the data)
    # The module's own settings the source states beside its net, from the opened source, the module's parsed init_args
    # and those of them the user's config states.
    settings: Callable[[Any, Namespace, Namespace], dict[str, Any]] | None = None
    # Whether the config's own values of those settings win (defaults, as a folder's decoding) or are refused (what the
    # weights were trained under, as an SB3 agent's statistics).
    config_wins: bool = False
    open: Callable[[Path], Any] = Path  # the path as read once (None: not of this kind); the path itself by default


@dataclasses.dataclass(frozen=True)
class Opened:
    """What ``net_from_init_weights`` did: ``line`` says so, ``source`` is the source as its rule read it (a
    ``Folder``), handed to the parts that would otherwise read it again (``hand_over``)."""

    line: str
    source: Any


def gpt_open(path: Path) -> Any:
    """A Hugging Face model folder, read once (``zoo.gpt.formats.folder.Folder``); None for any other path."""
    if not (path / "config.json").is_file():
        return None
    from zoo.gpt.formats.folder import Folder

    return Folder.read(path)


def gpt_folder(folder: Any) -> dict[str, Any] | None:
    """A Hugging Face model folder's ``GPT`` (``zoo.gpt.pretrained``)."""
    from zoo.gpt.pretrained import net_config, net_kwargs

    return net_config(net_kwargs(folder.config, folder))


def gpt_generation(folder: Any, init: Namespace, stated: Namespace) -> dict[str, Any]:
    """The decoding a Hugging Face folder's ``generation_config.json`` states, as ``from_pretrained`` reads it, under
    each field of ``generation`` that the user's config states."""
    theirs = dataclasses.asdict(folder.generation)
    ours, own = _plain(init.get("generation")) or {}, _plain(stated.get("generation")) or {}
    return {"generation": {k: ours[k] if k in own else v for k, v in theirs.items()}}


def diffusers_folder(path: Path) -> dict[str, Any] | None:
    """A diffusers ``DiTTransformer2DModel`` or ``UNet2DModel`` folder's net (``zoo.diffusion.pretrained``)."""
    from zoo.diffusion.pretrained import net_config

    return net_config(path) if path.is_dir() else None


def clip_folder(path: Path) -> dict[str, Any] | None:
    """A Hugging Face CLIP or open_clip folder's ``CLIP`` (``zoo.clip.pretrained``)."""
    from zoo.clip.pretrained import net_config

    return net_config(path)


def clip_objective(path: Path, init: Namespace, stated: Namespace) -> dict[str, Any]:
    """A SigLIP folder's objective, the sigmoid loss (``zoo.clip.siglip``): its zero-shot probabilities are sigmoids
    of its biased logits, and a fine-tune keeps the objective its ``logit_bias`` was learned under."""
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return {}
    from zoo.io.files import read_config

    return {"loss": "siglip"} if read_config(config).get("model_type") == "siglip" else {}


def sb3_zip(path: Path) -> dict[str, Any] | None:
    """A Stable-Baselines3 agent's net (``zoo.rl.sb3``)."""
    if not path.is_file() or not zipfile.is_zipfile(path):
        return None
    from zoo.rl.sb3 import net_config

    return net_config(path)


def sb3_statistics(path: Path, init: Namespace, stated: Namespace) -> dict[str, Any]:
    """The observation (and return) normalisation that the ``VecNormalize`` statistics beside a Stable-Baselines3
    zip state (``zoo.rl.pretrained``): the agent acted on observations so normalised."""
    if not path.is_file() or not zipfile.is_zipfile(path):
        return {}
    from zoo.rl.sb3_statistics import statistics_settings

    return statistics_settings(path, init.get("gamma", 0.99))


def zoo_model(path: Path, trusted: Iterable[str] = ()) -> dict[str, Any] | None:
    """The net a zoo model at ``path`` stores: a registered model's ``weights.safetensors`` beside its ``module.json``,
    or a checkpoint written through ``cli.py`` (``.ckpt``, its ``hyper_parameters``); None for anything else. Read by
    ``zoo.io.build``'s rules against ``zoo.io.trust``'s allowlist and ``trusted`` (the classes the user's own config
    names): a class outside them is refused, and nothing the file names is imported."""
    from zoo.io import build, trust
    from zoo.io.weights import load_file
    from zoo.tracking.downloads import SPEC, WEIGHTS

    if path.name == WEIGHTS and (path.parent / SPEC).is_file():
        spec = json.loads((path.parent / SPEC).read_text())
        spec = spec if isinstance(spec, dict) else {}
        stored = {"_class_path": spec.get("class_path"), **(spec.get("init_args") or {})}
    elif path.suffix in CHECKPOINTS and path.is_file():
        stored = dict(load_file(path, mmap=True).get("hyper_parameters") or {})
    else:
        return None
    if "_class_path" not in stored or not isinstance(stored.get("net"), (dict, str)):
        return None  # saved from Python (no config), or a module without a net
    allow = trust.zoo_allowlist().with_trusted(trusted)
    net = build.resolve_model(stored, str(path), allow, complete=False).args.get("net")
    return as_config(net) if isinstance(net, build.Part) else None


CHECKPOINTS = (".ckpt", ".pt", ".pth")  # what a checkpoint written through cli.py is named


def as_config(value: Any) -> Any:
    """A resolved part as the parser's config holds it: every class as ``{class_path, init_args}`` (a class given by
    its path alone too), settings as dicts of their fields."""
    from zoo.io.build import Part

    if isinstance(value, Part):
        args = {k: as_config(v) for k, v in value.args.items()}
        if value.kind == "type":
            return value.path
        return args if value.kind == "settings" else {"class_path": value.path, "init_args": args}
    if isinstance(value, (list, tuple)):
        return [as_config(v) for v in value]
    if isinstance(value, dict):
        return {k: as_config(v) for k, v in value.items()}
    return value


# A zoo model's net: what its weights do not depend on may be the config's own; a classifier's head is replaced for
# another number of classes (zoo.cnn.module), so num_classes is the data's (zoo.app.sizes), not the model's.
ZOO_MODEL = Source(zoo_model, frozenset({"dropout", "activation_checkpointing"}), frozenset({"num_classes"}))

SOURCES: dict[str, Source] = {
    "gpt": Source(gpt_folder, settings=gpt_generation, config_wins=True, open=gpt_open),
    "diffusers": Source(diffusers_folder),
    # zoo.clip.hf.load_source_into replaces the projection; a SigLIP folder states its loss
    "clip": Source(clip_folder, frozenset({"embed_dim"}), settings=clip_objective, config_wins=True),
    "sb3": Source(sb3_zip, settings=sb3_statistics),
}  # by the families table's name


def net_from_init_weights(
    cfg: Namespace, subcommand: str | None, family_of: Callable[[type], Any], stated: Namespace | None = None
) -> Opened | None:
    """``opened_source`` with the rule of the family of ``cfg``'s model (``family_of``: its row in
    ``zoo.tracking.families``), before anything is built: a fit's, or a run without a checkpoint (an evaluated
    checkpoint's net is its own). ``stated``: what the user's config states of ``cfg`` (``zoo.app.parser``)."""
    path = getattr(cfg.get("model"), "class_path", None)
    if not path or (subcommand not in (None, "fit") and cfg.get("ckpt_path")):
        return None
    return opened_source(cfg, SOURCES.get(family_of(_class(path)).net_from_folder), stated)


def net_from_source(cfg: Namespace, source: Source | None, stated: Namespace | None = None) -> str | None:
    """``opened_source``'s line."""
    opened = opened_source(cfg, source, stated)
    return opened and opened.line


def opened_source(cfg: Namespace, source: Source | None, stated: Namespace | None = None) -> Opened | None:
    """``cfg``'s net (``model.init_args.net``) made the one its ``init_weights`` states: a zoo model's stored net
    (``zoo_model``; an MLflow URI is downloaded first), else the family's ``source`` rule's; None where no rule reads
    that path. What the user's config states (``stated``, the config's own values: those of its files and flags,
    without the defaults the parser fills in) stays its own, and one the source contradicts raises ``InputError``
    naming each; everything else is the source's. A value stated as null states nothing (the zoo's unset)."""
    init = (cfg.get("model") or Namespace()).get("init_args", Namespace())
    path, net = init.get("init_weights"), init.get("net")
    if not isinstance(path, str) or is_remote(path) or not isinstance(net, Namespace):
        return None
    own = _init_args((stated or Namespace()).get("model"))
    from zoo.io.trust import trusted_class_paths
    from zoo.tracking.models import is_mlflow_uri, local_weights

    local = Path(local_weights(path) if is_mlflow_uri(path) else path)
    rule, opened, theirs = ZOO_MODEL, local, zoo_model(local, trusted_class_paths(cfg.model.as_dict()))
    if theirs is None and source is not None and (opened := source.open(local)) is not None:
        rule, theirs = source, source.read(opened)
    if theirs is None:
        return None
    from zoo.io import build

    build.check_net(theirs, path)
    conflicts: list[str] = []
    _merge(net, theirs, NET, own.get("net"), rule, conflicts)
    if conflicts:
        raise InputError(
            f"init_weights {path!r} states the net, and the config's net block contradicts it: {'; '.join(conflicts)}. "
            f"Leave these out of {NET} (its class_path is enough), or start from other weights"
        )
    how = "as it stores it" if rule is ZOO_MODEL else "as its config states it"
    line = f"the net from init_weights {path!r}: {theirs['class_path']} {how}"
    if rule.settings is not None and (settings := rule.settings(opened, init, own)):
        if rule.config_wins:  # the source's defaults under the config's own values (merged by the rule)
            for k, v in settings.items():
                init[k] = _namespace(v)
            line += f"; {', '.join(f'{k}={v!r}' for k, v in settings.items())} as it states them, under the config's"
        else:
            _set_settings(init, settings, own, path)
            line += f"; {', '.join(f'{k}={v!r}' for k, v in settings.items())} as its statistics state them"
    return Opened(line, opened)


def data_folder(cfg: Namespace, opened: Opened) -> None:
    """The data's tokenizer folder (``pretrained_dir``, with ``tokenizer: pretrained``) derived from an
    ``init_weights`` model folder, as its ``vocab_size`` is derived from the data (``zoo.app.sizes``): a config names
    its folder once. One stated for another folder is refused in one line; beside an ``init_weights`` that is no
    folder (a checkpoint, a weights file, a registered model) it is the data's own."""
    from zoo.gpt.formats.folder import Folder

    data = (cfg.get("data") or Namespace()).get("init_args")
    folder = opened.source
    if not (isinstance(folder, Folder) and isinstance(data, Namespace) and "pretrained_dir" in data):
        return
    if data.get("tokenizer") != "pretrained":
        return
    given = data.get("pretrained_dir")
    if given is not None and not folder.is_at(given):
        raise InputError(
            f"data.init_args.pretrained_dir={given!r} is another folder than model.init_args.init_weights="
            f"{str(folder.path)!r}, whose tokenizer the model was trained with: leave pretrained_dir out (it is "
            f"init_weights'), or tokenize with another tokenizer than 'pretrained'"
        )
    data.pretrained_dir = str(folder.path)


def hand_over(opened: Opened | None, part: Any) -> None:
    """The ``init_weights`` source as the application read it, given to a built ``part`` that takes it
    (``use_folder``: the module that loads it, a DataModule that tokenizes with its tokenizer), so no part reads
    it again."""
    use = getattr(part, "use_folder", None)
    if opened is not None and callable(use):
        from zoo.gpt.formats.folder import Folder

        if isinstance(opened.source, Folder):
            use(opened.source)


def _set_settings(init: Namespace, settings: dict[str, Any], own: Namespace, path: str) -> None:
    """The module's ``init`` given the ``settings`` the source states beside its net (an SB3 zip's VecNormalize
    statistics), refusing in one line a value the config states (``own``) that differs: the weights were trained
    under the source's."""
    conflicts = [
        f"model.init_args.{k}={_plain(init.get(k))!r} (the source's: {v!r})"
        for k, v in settings.items()
        if _stated(own, k) and not _same(init.get(k), v)
    ]
    if conflicts:
        raise InputError(
            f"init_weights {path!r} was trained under the VecNormalize statistics beside it, and the config "
            f"contradicts them: {'; '.join(conflicts)}. Leave these out of model.init_args (the statistics set "
            "them), or move the statistics file away to start without them"
        )
    for k, v in settings.items():
        init[k] = v


def _merge(net: Namespace, theirs: dict, where: str, stated: Any, rule: Source, conflicts: list) -> None:
    """``net`` (``{class_path, init_args}`` as parsed) given ``theirs``' values where the user's config (``stated``,
    this block as it states it) states none, its own kept where the ``rule`` adapts or keeps them, a line in
    ``conflicts`` for each other value (or class) it states that differs."""
    cls = _class(theirs["class_path"])
    if not issubclass(_class(net.class_path), cls):
        conflicts.append(f"{where}.class_path={net.class_path} (the source's: {theirs['class_path']})")
        return
    if not isinstance(net.get("init_args"), Namespace):
        net.init_args = Namespace()
    args, own = net.init_args, _init_args(stated)
    for key, value in (theirs.get("init_args") or {}).items():
        old, at = args.get(key), f"{where}.init_args.{key}"
        if key in rule.kept:
            continue
        if not _stated(own, key):
            args[key] = _namespace(value)
        elif isinstance(value, dict) and "class_path" in value and isinstance(old, Namespace) and "class_path" in old:
            if issubclass(_class(old.class_path), _class(value["class_path"])):
                _merge(old, value, at, own[key], rule, conflicts)
            else:
                conflicts.append(f"{at}={old.class_path} (the source's: {value['class_path']})")
        elif not _same(old, value) and key not in rule.adapted:
            conflicts.append(f"{at}={_plain(old)!r} (the source's: {value!r})")


def _stated(own: Namespace, key: str) -> bool:
    """Whether the user's config states ``key`` in ``own`` (its block as stated): null states nothing, as the zoo's
    unset."""
    return key in own and own[key] is not None


def _init_args(stated: Any) -> Namespace:
    """The init_args a class block states (none for a block given as its class path alone, or not at all)."""
    args = stated.get("init_args") if isinstance(stated, Namespace) else None
    return args if isinstance(args, Namespace) else Namespace()


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
