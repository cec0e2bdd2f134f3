"""The model and data configs a checkpoint carries, put on ``cli.py``'s command line: ``cli.py predict --ckpt_path
<checkpoint or models:/...>`` needs no YAML. What the file says passes ``zoo.io.trust``'s allowlist first."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zoo.app.families import family_of
from zoo.io.trust import Allowlist, check_stored_data, check_stored_model, trusted_class_paths, zoo_allowlist
from zoo.io.weights import is_remote, load_file
from zoo.tracking.models import is_mlflow_uri, module_spec, resolve_checkpoint

SUBCOMMANDS_WITH_A_MODEL = ("validate", "test", "predict")


def stored_config_allowlist() -> Allowlist:
    """What a checkpoint's or registered model's stored config may name: the zoo's modules and parts, and the
    DataModules of ``datamodules`` (the application's, so named here)."""
    from lightning.pytorch import LightningDataModule

    import datamodules

    classes = (getattr(datamodules, name) for name in datamodules.__all__)
    data = [c for c in classes if isinstance(c, type) and issubclass(c, LightningDataModule)]
    return zoo_allowlist(data, env_modules=["datamodules.gym_envs"])


def checkpoint_config(
    uri: str, subcommand: str, allow: Allowlist | None = None, tracking_uri_: str | None = None
) -> dict[str, dict]:
    """``model`` and ``data`` configs (class path + init args) for ``cli.py <subcommand> --ckpt_path <uri>``.

    The model is the checkpoint's own. The data is, for predict, the family's ``predict_data`` (its DataModule
    for new inputs, ``zoo.app.families``) when it has one, else the
    training data the checkpoint recorded; either may be missing (a sharded folder, a checkpoint from Python).
    Both come from a file, so both pass ``allow`` (``zoo.io.trust``) before anything they name is imported,
    and lose the settings a file may not choose (where outputs go).
    """
    allow = allow or stored_config_allowlist()  # with the DataModules: zoo_allowlist() alone has none
    local = Path(resolve_checkpoint(uri, tracking_uri_) if is_mlflow_uri(uri) else uri)
    if not is_remote(uri) and not local.exists():
        raise FileNotFoundError(f"checkpoint {uri!r} does not exist: pass --ckpt_path <{CKPT_SOURCES}>")
    if not is_remote(uri) and not local.is_file():  # a sharded folder: Lightning reads it, with the user's config
        return {}
    try:  # a local file's tensors mapped, not read: only its hyperparameters are needed here
        spec = module_spec(load_file(uri, mmap=True) if is_remote(uri) else load_file(local, mmap=True))
    except ValueError:  # no class path: a checkpoint saved from Python, not through cli.py
        return {}
    init_args = check_stored_model({"_class_path": spec["class_path"], **spec["init_args"]}, uri, allow)
    module = allow.modules.get(spec["class_path"])  # None: a class the user's own config vouched for
    if hasattr(module, "stored_hparams"):
        init_args = module.stored_hparams(init_args)  # less what a file may not choose (zoo.io.checkpoint)
    out = {"model": {"class_path": spec["class_path"], "init_args": init_args}}
    predict_data = family_of(module).predict_data if module is not None else None
    if subcommand == "predict" and predict_data:
        out["data"] = {"class_path": predict_data}
    elif "data" in spec:
        data = spec["data"]
        out["data"] = {
            "class_path": data.get("class_path"),
            "init_args": check_stored_data(data.get("class_path"), data.get("init_args") or {}, uri, allow),
        }
    return out


CKPT_SOURCES = "a .ckpt file or URL, models:/<name>@<alias>, models:/<name>/<version> or runs:/<run id>/model"


def _flag(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def with_checkpoint_config(argv: list[str], allow: Allowlist | None = None) -> list[str]:
    """``cli.py`` validate/test/predict arguments with the model and data configs ``--ckpt_path`` carries
    (``checkpoint_config``, checked against ``allow`` plus what the user's own flags and ``--config`` files name)
    put first after the subcommand, so that a ``--config`` or flag the user gives overrides them; exits naming
    what to pass when neither the checkpoint nor the user gives a model or data."""
    at = next((i for i, a in enumerate(argv) if a in SUBCOMMANDS_WITH_A_MODEL), None)
    if at is None or any(a in ("-h", "--help") for a in argv):
        return argv
    sub, rest = argv[at], argv[at + 1 :]
    given = lambda flag: any(a == flag or a.startswith((f"{flag}=", f"{flag}.")) for a in rest)  # noqa: E731
    ckpt = _flag(rest, "--ckpt_path")
    if ckpt is None:
        if not given("--config") and not given("--model"):
            sys.exit(
                f"error: `cli.py {sub}` needs a model: pass --ckpt_path <{CKPT_SOURCES}> (the model's config "
                f"comes with it), or --config <the training YAML> with --ckpt_path"
            )
        return argv
    config = checkpoint_config(ckpt, sub, (allow or stored_config_allowlist()).with_trusted(_named_by_user(rest)))
    if "model" not in config and not given("--config") and not given("--model"):
        sys.exit(
            f"error: {ckpt} names no model class (it was not written through cli.py): pass --config <the "
            f"training YAML> as well"
        )
    if "data" not in config and not given("--config") and not given("--data"):
        sys.exit(
            f"error: `cli.py {sub}` needs data and {ckpt} records none: pass --data <a DataModule class path> "
            f"with its --data.init_args.*, or --config <a YAML with a data: section>"
        )
    return argv[: at + 1] + [f"--{key}={json.dumps(value)}" for key, value in config.items()] + rest


def _named_by_user(args: list[str]) -> set[str]:
    """The class paths, wrappers and env ids in the user's own flags and ``--config`` files: theirs to vouch for."""
    import yaml

    from zoo.io.yaml_text import safe_load

    named: set[str] = set()
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if not eq:  # ``--flag value``: the value is the next argument
            flag, value = (arg, args[i + 1]) if arg.startswith("--") and i + 1 < len(args) else ("", "")
        if not flag.startswith("--"):
            continue
        try:
            text = Path(value).read_text() if flag == "--config" else value
            named |= trusted_class_paths({flag.lstrip("-").rsplit(".", 1)[-1]: safe_load(text, flag)})
        except (OSError, ValueError, yaml.YAMLError):  # the parser reports a bad config or flag itself
            named |= trusted_class_paths(value)
    return named
