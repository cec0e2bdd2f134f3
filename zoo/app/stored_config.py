"""The model and data a ``--ckpt_path`` carries, for ``cli.py validate|test|predict --ckpt_path <checkpoint or
models:/...>`` without a YAML: built by the zoo's own rules (``zoo.io.build``), never handed to jsonargparse.

LightningCLI gets a function that returns the built module (and DataModule) in place of a class to parse: the stored
config never reaches its parser. The user's own flags on them (``--model.init_args.generation.temperature=0``,
``--data.init_args.batch_size=8``) are taken off the command line and laid over the stored config, theirs to give;
a ``--config`` or ``--model``/``--data`` of their own replaces the stored part whole (the checkpoint then gives only
weights, ``zoo.io.checkpoint.reconcile``). Where the stored data would read or write (its ``root``, ``path``, ...),
the run's defaults or the user's flags decide (``zoo.io.build.drops_location``), and a line says what was left out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.utilities import rank_zero_info

from zoo.app.pretrained import as_config
from zoo.io import build
from zoo.io.checkpoint import reconcile
from zoo.io.trust import Allowlist, trusted_class_paths, zoo_allowlist
from zoo.io.weights import is_remote, load_file
from zoo.io.yaml_text import safe_load
from zoo.tracking.families import family_of
from zoo.tracking.models import is_mlflow_uri, module_spec, resolve_checkpoint

SUBCOMMANDS_WITH_A_MODEL = ("validate", "test", "predict")
CKPT_SOURCES = "a .ckpt file or URL, models:/<name>@<alias>, models:/<name>/<version> or runs:/<run id>/model"


def stored_config_allowlist() -> Allowlist:
    """What a checkpoint's or registered model's stored config may name: the zoo's modules and parts, and the
    DataModules of ``datamodules`` (the application's, so named here), and the ids of the zoo's text environments
    (registered with gymnasium by importing ``zoo.gpt.tune.envs``)."""
    import datamodules
    import zoo.gpt.tune.envs  # noqa: F401

    classes = (getattr(datamodules, name) for name in datamodules.__all__)
    data = [c for c in classes if isinstance(c, type) and issubclass(c, LightningDataModule)]
    return zoo_allowlist(data, env_modules=["datamodules.gym_envs"])


@dataclasses.dataclass
class FromCheckpoint:
    """What ``cli.py`` runs: ``argv`` for LightningCLI, and functions building the stored module (``stored_model``,
    in place of a class for LightningCLI to parse) and DataModule (built by ``cli.py`` before the model, in place of
    the data LightningCLI would build); None: the user's own config gives that part."""

    argv: list[str]
    model: Callable[[], Any] | None = None
    data: Callable[[], Any] | None = None


def from_checkpoint(argv: list[str], allow: Allowlist | None = None) -> FromCheckpoint:
    """``argv`` of ``cli.py`` split into what LightningCLI parses and the parts ``--ckpt_path`` carries, resolved by
    ``zoo.io.build`` now (a refusal is raised before anything is built); exits naming what to pass when neither the
    checkpoint nor the user gives a model or data."""
    at = next((i for i, a in enumerate(argv) if a in SUBCOMMANDS_WITH_A_MODEL), None)
    if at is None or any(a in ("-h", "--help") for a in argv) or _before_subcommand(argv, at):
        return FromCheckpoint(argv)
    sub, rest = argv[at], argv[at + 1 :]
    user_configs = _user_configs(rest)
    own = {key for key in ("model", "data") if _flag(rest, f"--{key}") is not None or _in_configs(user_configs, key)}
    ckpt = _flag(rest, "--ckpt_path")
    if ckpt is None:
        if "model" not in own and not any(a.startswith("--model.") for a in rest):
            sys.exit(
                f"error: `cli.py {sub}` needs a model: pass --ckpt_path <{CKPT_SOURCES}> (the model's config "
                f"comes with it), or --config <the training YAML> with --ckpt_path"
            )
        return FromCheckpoint(argv)
    allow = (allow or stored_config_allowlist()).with_trusted(_named_by_user(rest)).with_trusted_at(_bare_values(rest))
    spec, local = stored_spec(ckpt)
    out = FromCheckpoint(argv[: at + 1])
    dropped: list[str] = []
    if "model" not in own:
        if spec is None:
            sys.exit(
                f"error: {ckpt} names no model class (it was not written through cli.py): pass --config <the "
                f"training YAML> as well"
            )
        stored = {"_class_path": spec["class_path"], **spec["init_args"]}
        part = build.resolve_model(stored, ckpt, allow, complete=False)
        dropped += part.all_dropped()
        rest, flags = _take_flags(rest, "model")
        part = _overlaid(part, flags, ckpt, allow, "model")
        if flags and local is not None:  # the user's values win, but never over the weights' shapes
            for line in reconcile(local, as_config(part), allow):  # a net given by its path alone as a block
                rank_zero_info(line)
        _BUILDERS["model"] = lambda: build.build(part, record=True)
        out.model = stored_model
    if "data" not in own:
        stored_class = allow.modules.get(spec["class_path"]) if spec is not None else None
        predict_data = family_of(stored_class).predict_data if stored_class is not None else None
        if sub == "predict" and predict_data:  # the family's reader of new inputs: the zoo's own class, no settings
            out.argv.append(f"--data={json.dumps({'class_path': predict_data})}")
        elif spec is not None and "data" in spec:
            data = spec["data"]
            init_args = data.get("init_args") or {}
            data_part = build.resolve_data(data.get("class_path"), init_args, ckpt, allow, complete=False)
            dropped += data_part.all_dropped()
            rest, flags = _take_flags(rest, "data")
            data_part = _overlaid(data_part, flags, ckpt, allow, "data")
            _refuse_dropped_code(ckpt, init_args, data_part)
            out.data = functools.partial(build.build, data_part, record=True)
        elif not any(a.startswith("--data") for a in rest):
            sys.exit(
                f"error: `cli.py {sub}` needs data and {ckpt} records none: pass --data <a DataModule class path> "
                f"with its --data.init_args.*, or --config <a YAML with a data: section>"
            )
    if dropped and os.environ.get("LOCAL_RANK", "0") == "0":
        print(
            f"{ckpt}: a stored config does not choose where data is read or written, so the run's own settings "
            f"replace its {', '.join(dropped)} (give them with --config or flags)",
            file=sys.stderr,
        )
    out.argv += rest
    return out


def _refuse_dropped_code(source: str, stored: dict, part: build.Part) -> None:
    """Exits in one line where the stored data names code of the user's (a text environment's ``tools``) that was
    dropped and their flags do not give again: run without it, the episodes would not be the ones it was made for."""
    for key in sorted(build.USER_CODE_NAMES):
        if stored.get(key) and key not in part.args:  # given again, even as [] (run without), it is the user's
            named = json.dumps(stored[key], default=str)
            sys.exit(
                f"error: {source}'s data ran your code ({key}: {named[:300]}), which a stored config never names: "
                f"state it again with --data.init_args.{key}='{named[:300]}' or --config <your YAML>"
            )


def stored_spec(uri: str) -> tuple[dict | None, str | None]:
    """The class path, init arguments and training data a checkpoint (or MLflow model) records, None for a sharded
    folder or a checkpoint saved from Python (no class path); and the local file (None for a URL)."""
    local = Path(resolve_checkpoint(uri) if is_mlflow_uri(uri) else uri)
    if not is_remote(uri) and not local.exists():
        raise FileNotFoundError(f"checkpoint {uri!r} does not exist: pass --ckpt_path <{CKPT_SOURCES}>")
    if not is_remote(uri) and not local.is_file():  # a sharded folder: Lightning reads it, with the user's config
        return None, None
    try:  # a local file's tensors mapped, not read: only its hyperparameters are needed here
        spec = module_spec(load_file(uri, mmap=True) if is_remote(uri) else load_file(local, mmap=True))
    except ValueError:  # no class path: a checkpoint saved from Python, not through cli.py
        spec = None
    return spec, None if is_remote(uri) else str(local)


# What stored_model() builds, set by from_checkpoint. LightningCLI takes a function in place of a
# class (jsonargparse's class_from_function), keyed by the function itself: one function each, for every run.
_BUILDERS: dict[str, Callable[[], Any]] = {}


def stored_model() -> LightningModule:
    """The module ``--ckpt_path`` stores, built by ``zoo.io.build``."""
    return _BUILDERS["model"]()


def _overlaid(part: build.Part, flags: list[tuple[list[str], Any]], source: str, allow: Allowlist, key: str):
    """``part`` with the user's own flags on it, resolved again (the stored values already passed the rules once;
    the user's are theirs, so locations they give are kept), and complete."""
    config = part.plain()
    for keys, value in flags:
        keys = _init_keys(keys)
        at = config
        for k in keys[:-1]:
            if not isinstance(at.get(k), dict):
                at[k] = {}
            at = at[k]
        at[keys[-1]] = value
    if key == "model":
        part = build.resolve_model(
            {"_class_path": config["class_path"], **config["init_args"]}, source, allow, keep_locations=True
        )
    else:
        part = build.resolve_data(config["class_path"], config["init_args"], source, allow, keep_locations=True)
    own = tuple(".".join(k for k in keys if k not in ("init_args", "class_path")) for keys, _ in flags)
    return dataclasses.replace(part, own=own)  # the user's counts are theirs (zoo.io.budget)


def _init_keys(keys: list[str]) -> list[str]:
    """``--model.net.x`` as ``--model.init_args.net.x`` (what LightningCLI accepts for the first level)."""
    return keys if keys[0] in ("init_args", "class_path") else ["init_args", *keys]


def _bare_values(args: list[str]) -> set[tuple[str, str]]:
    """(where, value) of each ``--model.*``/``--data.*`` flag whose value is a bare string: a class path only at a
    key the resolver finds taking a class (``--model.init_args.net=pkg.Net``), where ``zoo.io.build`` names that key
    ``model.init_args.net.class_path``; at any other key (``--data.init_args.path=a.txt``) it is a plain value."""
    found = set()
    for key in ("model", "data"):
        try:
            taken = _take_flags(args, key)[1]
        except (ValueError, yaml.YAMLError):  # the parser reports a bad flag itself
            continue
        found |= {(".".join([key, *_init_keys(k), "class_path"]), v) for k, v in taken if isinstance(v, str)}
    return found


def _take_flags(args: list[str], key: str) -> tuple[list[str], list[tuple[list[str], Any]]]:
    """``args`` without ``--<key>.a.b=value`` flags, and those flags as ([a, b], value) with the value read as
    YAML (the user's own, as LightningCLI reads it)."""
    kept, taken, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(f"--{key}."):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            taken.append((name.split(".")[1:], safe_load(value, name)))
        else:
            kept.append(arg)
        i += 1
    return kept, taken


def _flag(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _before_subcommand(argv: list[str], at: int) -> bool:
    """Whether the subcommand word is a flag's value (``--config predict``), not the subcommand."""
    return at > 0 and argv[at - 1].startswith("--") and "=" not in argv[at - 1]


def _user_configs(args: list[str]) -> list[Any]:
    configs = []
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--config=") else args[i + 1] if arg == "--config" else None
        if value is not None:
            try:
                configs.append(safe_load(Path(value).read_text(), value))
            except (OSError, yaml.YAMLError):  # the parser reports a bad config file itself
                continue
    return configs


def _in_configs(configs: list[Any], key: str) -> bool:
    return any(isinstance(c, dict) and key in c for c in configs)


def _named_by_user(args: list[str]) -> set[str]:
    """The class paths, wrappers and env ids in the user's own flags and ``--config`` files: theirs to vouch for. Only
    values in those positions (``--model.init_args.net.class_path=pkg.Net``, a config's ``class_path:``) count: a
    flag's other values (``--ckpt_path this.ckpt``) never do, whatever dots they have (a bare one counts where the
    class it sets takes a class: ``_overlaid``)."""
    named: set[str] = set()
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if not eq:  # ``--flag value``: the value is the next argument
            flag, value = (arg, args[i + 1]) if arg.startswith("--") and i + 1 < len(args) else ("", "")
        if not flag.startswith("--"):
            continue
        key = flag.lstrip("-").rsplit(".", 1)[-1]
        try:
            text = Path(value).read_text() if flag == "--config" else value
            named |= trusted_class_paths({key: safe_load(text, flag)})
        except (OSError, ValueError, yaml.YAMLError):  # the parser reports a bad config or flag itself
            named |= trusted_class_paths({key: value})
    return named
