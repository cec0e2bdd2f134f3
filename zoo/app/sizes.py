"""The net's sizes that its data states, set in the model config once, before the net is built.

A size a net shares with its data (a GPT's ``vocab_size`` and the tokenizer's ids, a classifier's ``num_classes``
and the dataset's classes, an agent's observation and action sizes and the env's spaces) is left unset in a config
and derived here: the DataModule is built first, the family's row (``zoo.tracking.families``) reads what it states, the
family's own rule fills the unset sizes and refuses a given one that disagrees (one line naming both), and only
then is the model built, from the completed config. A config that states every size does not make the data
read here (no tokenizer file, no env made to instantiate it): the module checks them against the data when the run
sets up, by the same rule. The module's hyperparameters (what checkpoints and MLflow models
rebuild it from) hold the sizes because they were passed in; no module sizes or rewrites itself.

With ``--ckpt_path`` a size left unset is the checkpoint's (its stored config, written through ``cli.py``): the
checkpoint, not the data, says what it was trained with. An evaluation of a checkpoint (validate, test, predict)
does not ask a GPT's data for a vocabulary: the checkpoint's tokenizer encodes, whatever the data's would be.

LightningCLI's ``link_arguments(..., apply_on="instantiate")`` does not fit here: a link names one target key for
every model class, where the zoo's models are chosen by ``class_path`` and only some of them take each size, and a
linked target can no longer be given in a config, so a given size could not be checked against the data.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from zoo.errors import InputError

NET = "model.init_args.net.init_args"  # where the sizes go, as a config or flag names them


def vocabulary(data: Any, net: dict, evaluating_checkpoint: bool) -> dict[str, Any]:
    """GPT: ``vocab_size``, the ids of the data's tokenizer (``TextDataModule.vocab_size``); a fit's windows
    (the data's ``block_size``) refused when longer than the net's context."""
    if not evaluating_checkpoint:
        check_context(getattr(data, "block_size", None), net.get("block_size"))
    if net.get("vocab_size") is not None:
        return {}  # checked against the tokenizer at setup (zoo.gpt.module.vocab_size_for)
    if evaluating_checkpoint or not hasattr(type(data), "vocab_size"):
        raise InputError(
            f"{NET}.vocab_size is not set and neither the data's tokenizer nor a checkpoint gives it: pass "
            f"--{NET}.vocab_size=<the tokenizer's ids>, or data with a tokenizer (datamodules.TextDataModule)"
        )
    return {"vocab_size": data.vocab_size}


def check_context(windows: int | None, context: int | None) -> None:
    """The data's ``block_size`` (tokens a window or conversation is trained on) must fit the net's (its context):
    one line naming both settings, where the forward pass raised mid-fit naming only the net's."""
    if isinstance(windows, int) and isinstance(context, int) and windows > context:
        raise InputError(
            f"data.init_args.block_size={windows} is longer than the net's context, {NET}.block_size={context}: "
            f"pass --{NET}.block_size={windows} too (a pretrained net's context is its own: a smaller "
            f"--data.init_args.block_size then)"
        )


def windows_from_context(cfg: Namespace) -> None:
    """A GPT's data windows (the DataModule's ``block_size``) left unset are the net's context (its ``block_size``):
    the one number is stated once, in the model config, and set in ``cfg``'s data here, before the DataModule is
    built. A window given shorter stays (fine-tuning a long-context net on short windows); a longer one is refused by
    ``check_context``; with neither set, one line asks for it."""
    data = (cfg.get("data") or Namespace()).get("init_args")
    if not isinstance(data, Namespace) or "block_size" not in data or data.block_size is not None:
        return
    net = (cfg.get("model") or Namespace()).get("init_args", Namespace()).get("net")
    context = net.get("init_args", Namespace()).get("block_size") if isinstance(net, Namespace) else None
    if not isinstance(context, int):
        raise InputError(
            f"data.init_args.block_size is not set and the net states no block_size to take it from: pass "
            f"--data.init_args.block_size=<tokens per window>, or --{NET}.block_size"
        )
    data.block_size = context


def classes(data: Any, net: dict, evaluating_checkpoint: bool) -> dict[str, Any]:
    """Classifiers: ``num_classes``, the data's (an image DataModule's ``num_classes`` and ``class_names``)."""
    from zoo.cnn.module import num_classes_for

    if net.get("num_classes") is not None:
        return {}  # checked against the data at setup (zoo.cnn.module.num_classes_for)
    k, names = getattr(data, "num_classes", None), getattr(data, "class_names", None)
    return {"num_classes": num_classes_for(net.get("num_classes"), k, names)}


def spaces(data: Any, net: dict, evaluating_checkpoint: bool) -> dict[str, Any]:
    """RL agents: observation and action sizes (and a Box's bounds) from the env the data builds
    (``GymDataModule.spaces``)."""
    from zoo.rl.common import env_sizes

    unset = [k for k in ("continuous", "action_low", "action_high") if k in net and net[k] is None]
    unset += ["obs_shape"] if net.get("encoder", "flat") != "flat" and net.get("obs_shape") is None else []
    sized = (net.get("obs_dim") is not None or net.get("obs_shape") is not None) and net.get("action_dim") is not None
    if sized and not unset:
        return {}  # checked against the env at setup (zoo.rl.common.check_env)
    if not hasattr(data, "spaces"):
        if (net.get("obs_dim") is None and net.get("obs_shape") is None) or net.get("action_dim") is None:
            raise InputError(
                f"{NET}.obs_dim and action_dim are not set and the data builds no env to take them from: pass "
                f"them, or data that builds the envs (datamodules.GymDataModule)"
            )
        return {}
    obs_space, action_space = data.spaces
    return env_sizes(net, obs_space, action_space, data.env_id)


Sizes = Callable[[Any, dict, bool], dict[str, Any]]
RULES: dict[str, Sizes] = {
    "vocabulary": vocabulary,
    "classes": classes,
    "spaces": spaces,
}  # by the families table's name


def size_the_net(cfg: Namespace, data: Any, subcommand: str | None, sizes: Sizes | None) -> None:
    """Complete ``cfg``'s net (``model.init_args.net``) with the sizes the checkpoint and ``data`` state, by the
    family's ``sizes`` rule; a given size that disagrees raises ``InputError`` naming both."""
    net = (cfg.get("model") or Namespace()).get("init_args", Namespace()).get("net")
    if sizes is None or not isinstance(net, Namespace) or not isinstance(net.get("init_args"), Namespace):
        return
    args = net.init_args
    ckpt = cfg.get("ckpt_path")
    stored = {k: v for k, v in checkpoint_sizes(ckpt, cfg.model.as_dict()).items() if k in args and args[k] is None}
    for key, value in stored.items():
        args[key] = value
    if stored:  # the checkpoint's sizes are a file's: bounded as every stored net is
        from zoo.io import build, trust

        own = tuple(k for k in vars(args) if k not in stored)  # the config's own, not the checkpoint's
        build.check_net(net.as_dict(), str(ckpt), trust.trusted_class_paths(cfg.model.as_dict()), own)
    for key, value in sizes(data, args.as_dict(), bool(ckpt) and subcommand != "fit").items():
        if key in args:
            args[key] = value


def checkpoint_sizes(ckpt_path: str | None, model: dict) -> dict[str, Any]:
    """The net arguments a local checkpoint written through ``cli.py`` stores, when its net is of the class the
    config ``model`` names (``prepare_checkpoint`` has already refused a checkpoint of another module class)."""
    if not ckpt_path or not Path(str(ckpt_path)).is_file():
        return {}
    from zoo.io import trust
    from zoo.io.checkpoint import stored_model

    stored = stored_model(ckpt_path, trust.zoo_allowlist().with_trusted(trust.trusted_class_paths(model)))
    net = (stored or ("", {}))[1].get("net")
    if not isinstance(net, dict) or net.get("class_path") != model["init_args"]["net"]["class_path"]:
        return {}
    # Sizes only: numbers, booleans and lists of them. These go into the parsed config that jsonargparse builds, which
    # would build a {class_path} found in a stored dict or string (zoo.io.build).
    return {k: v for k, v in (net.get("init_args") or {}).items() if _is_size(v)}


def _is_size(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(type(v) in (int, float, bool) for v in value)
    return type(value) in (int, float, bool)


def model_class(cfg: Namespace) -> type | None:
    """The model class the parsed config names (already imported by the parser)."""
    path = getattr(cfg.get("model"), "class_path", None)
    if not path:
        return None
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name, None)


def instantiate_data_first(
    parser,
    config: Namespace,
    subcommand: str | None,
    family_of: Callable,
    redump,
    build_data: Callable | None = None,
    hand: Callable[[Any], None] = lambda part: None,
) -> Namespace:
    """``parser.instantiate(config)`` with the DataModule built first and the net sized from it in between (its
    architecture, from a source given as ``init_weights``, is already set: ``zoo.app.pretrained``):
    ``family_of(model_class)`` is the family's row (``zoo.tracking.families``), ``redump()`` makes LightningCLI
    dump the completed config again (it hands that dump to the model as its hyperparameters); ``build_data``: builds
    the DataModule instead of the parser (a checkpoint's stored one, ``zoo.app.stored_config``); ``hand(part)``: gives
    the data, then the model, what the application has read for them (``zoo.app.pretrained.hand_over``)."""
    prefix = f"{subcommand}." if subcommand else ""
    cfg = config[subcommand] if subcommand else config
    data = build_data() if build_data is not None and cfg.get("data") is None else None
    if data is None and cfg.get("data") is not None:
        windows_from_context(cfg)
        only_data = Namespace(data=cfg.data)
        if subcommand:
            only_data = Namespace(subcommand=subcommand, **{subcommand: only_data})
        data = parser.instantiate(only_data)[f"{prefix}data"]
    if data is not None:
        hand(data)
    row = family_of(model_class(cfg))
    size_the_net(cfg, data, subcommand, RULES.get(row.sizes))
    redump()
    rest = config.clone()
    rest[f"{prefix}data"] = None
    built = parser.instantiate(rest)
    built[f"{prefix}data"] = data
    if built.get(f"{prefix}model") is not None:
        hand(built[f"{prefix}model"])
    return built
