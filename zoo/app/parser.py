"""The command line's parser: the zoo's arguments and defaults, and its errors as one ``error:`` line."""

from __future__ import annotations

import argparse
import difflib
import functools
import inspect
import os
import re
import sys

from lightning.pytorch.cli import LightningArgumentParser

from zoo import compat
from zoo.errors import OPTIONAL_PACKAGES, MissingExtra, missing_extra
from zoo.io.yaml_text import check_alias_expansion
from zoo.train.parallel import num_nodes_from_env

VERBOSE_ENV = "ZOO_VERBOSE"  # set (or pass --verbose) to see the full traceback of a bad-input error
EXCEPTION_DIR = "runs/on_exception"  # moved into the run's own folder at fit start (evaluations write none)
DEFAULT_CALLBACKS = [
    {"class_path": "callbacks.MonitoredCheckpoint"},
    {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
    {"class_path": "callbacks.GradNormMonitor"},
    {"class_path": "callbacks.PrecisionMonitor"},
    {"class_path": "callbacks.CheckpointOnException", "init_args": {"dirpath": EXCEPTION_DIR}},
    {"class_path": "callbacks.WritePredictions"},
    {"class_path": "callbacks.ProgressBar"},
    {"class_path": "callbacks.ModelSummary"},
]
TRAINER_DEFAULTS = {
    "default_root_dir": "runs",
    "logger": {"class_path": "zoo.tracking.ZooMLFlowLogger"},
    # LogConfigToMLflow logs every hyperparameter once, under the config's dotted name; Lightning's own
    # logging would add the module's and data's hparams again under their bare names (and `_instantiator`).
    "enable_autolog_hparams": False,
}


def add_zoo_arguments(parser: LightningArgumentParser) -> None:
    """``--test_after_fit``, the default callbacks, and the node count under torchrun or srun."""
    parser.add_argument(
        "--test_after_fit",
        type=bool,
        default=False,
        help="After fit, test the best checkpoint on the test split, logging into the same run.",
    )
    # A parser default rather than LightningCLI's persistent trainer_defaults callbacks, so that a
    # config's trainer.callbacks replaces the list and --trainer.callbacks+=... appends to it.
    parser.set_defaults({"trainer.callbacks": DEFAULT_CALLBACKS})
    if nodes := num_nodes_from_env():  # torchrun or srun: the node count needs no flag (a config's or flag's wins)
        parser.set_defaults({"trainer.num_nodes": nodes})


_PARSER_KEY = re.compile(r'Parser key "([^"]+)":\s*(.*)')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)':\s*(.*)")
_UNKNOWN_OPTION = re.compile(r"Option '([^']+)' is not accepted|Group '([^']+)' does not accept option '([^']+)'")
_UNION_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value",
    "Expected a <class 'NoneType'>",
)


def _leaves(message: str):
    """(where, reason) for each reason in jsonargparse's nested message: where is the key's full path and the class
    that refused it (``model.init_args.net.init_args.widht (zoo.cnn.ConvNet)``)."""
    path: list[tuple[int, str]] = []  # (indent, key or "class:<path>") of the enclosing blocks
    for raw in message.splitlines():
        indent, line = len(raw) - len(raw.lstrip()), raw.strip().removeprefix("- ")
        while path and path[-1][0] >= indent:
            path.pop()
        if not line or line.startswith(_UNION_NOISE):
            continue
        if m := _PARSER_KEY.match(line) or _CLASS_PATH.match(line):
            path.append((indent, m[1] if m.re is _PARSER_KEY else "class:" + m[1]))
            line = m[2]
        if not line:
            continue
        keys, owner = [], None
        for _, part in path:
            owner = part.removeprefix("class:") if part.startswith("class:") else owner
            keys.append("init_args" if part.startswith("class:") else part)
        if unknown := _UNKNOWN_OPTION.search(line):
            keys += [unknown[2], unknown[3]] if unknown[2] else [unknown[1]]
            line += close_names(owner, unknown[1]) if unknown[1] else ""
        key = ".".join(keys).removesuffix(".init_args")  # the class itself was refused (not found)
        yield (f"{key} ({owner})" if owner and key else key or owner or ""), line


def parser_error_line(message: str) -> str:
    """jsonargparse's error for a bad config value, which nests one block per subclass level (a misspelt
    ``net.init_args.widht`` is 11 lines of union alternatives), as one line: the key's full path, the class that
    refused it, the reason (each alternative's, for a value no type of a union accepts), and the accepted names
    closest to a misspelt one."""
    leaves = list(_leaves(message))
    if not leaves:
        return " ".join(message.split())
    where = leaves[0][0]
    reasons = " or ".join(dict.fromkeys(reason for w, reason in leaves if w == where))
    return f"{where}: {reasons}" if where else reasons


def missing_extra_in(ex: BaseException | None, message: str) -> MissingExtra | None:
    """The one line for a config that names a class of an extra's package that is not installed (a latent diffusion
    model's ``diffusers.AutoencoderKL``, which the parser imports while it reads the config)."""
    while ex is not None:
        top = (getattr(ex, "name", None) or "").split(".")[0] if isinstance(ex, ModuleNotFoundError) else ""
        if top in OPTIONAL_PACKAGES:
            named = re.search(rf"'({top}(\.\w+)*)'", message)
            return missing_extra(top, f"the config's {named.group(1)}" if named else "the config")
        ex = ex.__cause__ or ex.__context__
    return None


def close_names(class_path: str | None, name: str) -> str:
    """ "; did you mean 'width'?" from the init arguments of ``class_path``, which the parser has already imported
    (nothing is imported here)."""
    module, _, attr = (class_path or "").rpartition(".")
    cls = getattr(sys.modules.get(module), attr, None)
    if cls is None:
        return ""
    try:
        names = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except (TypeError, ValueError):
        return ""
    near = difflib.get_close_matches(name, names, n=3)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


@functools.cache  # once a process: jsonargparse's loaders are global
def yaml_aliases_bounded() -> None:
    """jsonargparse's YAML loader (``--config`` files and every flag's value), behind the bound on what aliases
    expand to (``zoo.io.yaml_text``): an alias bomb is one line, not a MemoryError out of jsonargparse's copy."""
    import yaml
    from jsonargparse import get_loader, set_loader

    load = get_loader("yaml")

    def bounded(stream: str):
        check_alias_expansion(stream, "a --config file or a flag's value")
        return load(stream)

    set_loader("yaml", bounded, exceptions=(yaml.YAMLError,))


class HelpWithTheConfigsClasses(argparse.Action):
    """``--help``: the parser's help, then, after a ``--config`` naming them (the user's own file), the options of
    the model and data classes it names, as ``--model.help <class>`` and ``--data.help <class>`` would print them."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.print_help()
        for key in ("model", "data"):
            part = namespace.get(key) if hasattr(namespace, "get") else None
            class_path = part.get("class_path") if hasattr(part, "get") else None
            module, _, name = (class_path or "").rpartition(".")
            cls = getattr(sys.modules.get(module), name, None)  # imported by the parser while it read the config
            if isinstance(cls, type):
                sub = type(parser)(
                    description=f"This config's {key}: {class_path}", usage=argparse.SUPPRESS, add_help=False
                )
                sub.add_class_arguments(cls, f"{key}.init_args", fail_untyped=False, sub_configs=True)
                sub.print_help()
        parser.exit()


class ZooArgumentParser(LightningArgumentParser):
    """Lightning's parser whose errors are one ``error:`` line and a hint, instead of the full usage (60 lines of
    options) before jsonargparse's nested message; ``--verbose`` keeps jsonargparse's own output. YAML aliases
    are bounded (``yaml_aliases_bounded``); a flag's value into a class's arguments is read by that argument's own
    type (``compat.nested_flags_read_by_their_own_type``)."""

    def __init__(self, *args, **kwargs) -> None:
        yaml_aliases_bounded()
        compat.nested_flags_read_by_their_own_type()  # --data.init_args.answer_pattern='Answer: (.+)' is a string
        super().__init__(*args, **kwargs)

    def register(self, registry_name, value, object) -> None:
        # argparse registers its -h action by name before it adds -h: ours prints the config's classes' options too
        super().register(
            registry_name, value, HelpWithTheConfigsClasses if (registry_name, value) == ("action", "help") else object
        )

    def parse_args(self, args=None, namespace=None, env=None, defaults=True, **kwargs):
        cfg = super().parse_args(args, namespace, env, defaults, **kwargs)
        if defaults:
            self.stated = self.stated_config()
        return cfg

    def stated_config(self):
        """What the user's config files and flags (the last ``parse_args``'s) state, without the defaults the parser
        fills in: the values that are the config's own, which a pretrained source does not replace
        (``zoo.app.pretrained``). Parsed again without defaults, as jsonargparse offers, not guessed by comparing
        values with the classes' defaults (a value stated equal to its default is stated all the same)."""
        with compat.print_config_skipped():
            return super().parse_args(self.args, defaults=False, _skip_validation=True)

    def _parse_common(self, cfg, **kwargs):
        # --print_config: jsonargparse prints the parsed config here, before the CLI's hooks; the printed net is
        # completed first from init_weights, as the run's prepare_config does (zoo.app.pretrained).
        request = compat.pending_print_config(self)
        if request is None:
            return super()._parse_common(cfg, **kwargs)
        cfg = super()._parse_common(cfg, **{**kwargs, "skip_validation": True})
        from zoo.app.pretrained import data_folder, net_from_init_weights
        from zoo.tracking.families import family_of

        stated = self.stated_config()
        sub = cfg.get("subcommand")
        if opened := net_from_init_weights(cfg[sub] if sub else cfg, sub, family_of, stated[sub] if sub else stated):
            data_folder(cfg[sub] if sub else cfg, opened)  # the data's tokenizer folder, init_weights', as the run's
        compat.print_config(self, request, cfg)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or compat.jsonargparse_debug() or os.environ.get(VERBOSE_ENV):
            super().error(message, ex)  # a subcommand's parser raises to its parent, which prints
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        line = parser_error_line(message)
        if missing := missing_extra_in(ex, message):  # jsonargparse imports a class path a config names
            line = str(missing)
        if message.startswith("unrecognized arguments:"):  # a misspelt flag: the closest the parser knows
            flags = [f for f in message.split(":", 1)[1].split() if f.startswith("--")]
            near = [difflib.get_close_matches(f.split("=")[0], compat.option_flags(parser), n=1) for f in flags]
            line += "".join(f"; did you mean {n[0]}?" for n in near if n)
        sys.stderr.write(f"error: {line}\n(the options: {prog} --help; the whole message: rerun with --verbose)\n")
        sys.exit(2)
