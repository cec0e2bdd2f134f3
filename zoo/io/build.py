"""Stored configs built by the zoo's own rules: what a checkpoint, a registered model or a URL says is turned into
objects here, and is never handed to a richer interpreter (jsonargparse, Lightning's instantiator) afterwards.

A check followed by jsonargparse failed open wherever the two read the same data differently (issue 37: jsonargparse
instantiates a ``{class_path}`` found at any depth of an ``Any`` argument, and YAML-parses strings there). So nothing
here is a check: the value built is the value used. The rules are total, and each is one branch of ``convert``:

- a class is one the allowlist (``zoo.io.trust``) names exactly, or one the user's own config names as a class (a
  refusal then names what importing it ran);
- every key at every depth is a parameter of the class being built: an unknown key is refused, not skipped;
- every value is converted by its parameter's annotation: numbers, strings, Literals, enums, lists, tuples, dicts of
  those; a settings dataclass from a dict of its fields; a nested class (``{class_path, init_args}``) only where the
  annotation is a class, a ``Callable`` returning one (built as ``functools.partial``, as jsonargparse injects it) or
  ``type[...]`` naming it;
- an ``Any``, ``dict`` or unannotated position holds plain JSON data (None, bools, numbers, strings, lists, dicts
  with string keys; at most ``MAX_DEPTH`` deep), copied, never instantiated, never parsed; a mapping there with a
  ``class_path`` is refused unless it names a class its owner builds itself (``zoo.io.trust.EXTERNAL_PARTS``);
- settings that say where data is read from or written to, or whether to download, and the code a run calls on its
  data (reward functions) (``drops_location``), are dropped at every depth: the current run decides them;
- ``wrappers`` and ``env_id`` (which ``GymDataModule`` and gymnasium import) pass ``zoo.io.trust``'s reviewed lists.

Building happens in two steps: ``resolve`` (everything above; no code of any class runs) gives a tree of ``Part``s,
and ``instantiate`` calls the constructors under ``zoo.io.tripwire``'s guard, so that a bug in these rules becomes a
refusal, not a process, an import, a connection or a write.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from torch import nn

import zoo
from zoo.errors import InputError, import_extra
from zoo.io import budget, tripwire, trust
from zoo.io.trust import Allowlist, UntrustedConfigError

MAX_DEPTH = 32  # nesting of a stored config: the zoo's deepest is 5; deeper is a recursion bomb, not a config
# Where data is read from or written to, or whether to download: dropped from a stored config (the run decides).
LOCATION_NAMES = frozenset({"root", "path", "paths", "download", "draft", "init_weights", "autoencoder_weights"})
LOCATION_SUFFIXES = ("_path", "_paths", "_dir", "_file", "_weights")
LOCATION_PREFIXES = ("pretrained_",)
# Code a run calls on its own data (GRPO's reward functions, zoo.gpt.tune.rewards; a text environment's tools,
# zoo.gpt.tune.envs.tools): the user's YAML names it, never a stored config, so a checkpoint or a registered model
# builds none (dropped as locations are).
USER_CODE_NAMES = frozenset({"rewards", "tools"})
NONE = type(None)


def drops_location(name: str) -> bool:
    """Whether a stored setting ``name`` names a place to read or write, a download, or code to call on the data
    (``USER_CODE_NAMES``): the run decides it."""
    if name in USER_CODE_NAMES:
        return True
    return name in LOCATION_NAMES or name.endswith(LOCATION_SUFFIXES) or name.startswith(LOCATION_PREFIXES)


@dataclasses.dataclass
class Part:
    """A class and its converted arguments, not yet built: ``kind`` "class" builds ``cls(**args)``, "callable" a
    ``functools.partial`` (jsonargparse's injected callables), "settings" a dataclass, "type" the class itself."""

    cls: type
    path: str
    args: dict[str, Any]
    kind: str = "class"
    dropped: tuple[str, ...] = ()  # dotted keys of the location settings left out, for the run to say so
    missing: tuple[str, ...] = ()  # dotted keys of required parameters the config does not give
    bare: bool = False  # given as its class path alone (as jsonargparse dumps a class with no arguments)
    source: str = ""  # the file or URI the config came from, for refusals to name
    own: tuple[str, ...] = ()  # settings the user gave on top (dotted, init_args left out): theirs, not bounded

    def plain(self) -> Any:
        """As a config stores it: ``{class_path, init_args}`` (a dict of fields for settings, the path for a type)."""
        if self.kind == "type" or (self.bare and not self.args):
            return self.path
        args = {k: plain(v) for k, v in self.args.items()}
        return args if self.kind == "settings" else {"class_path": self.path, "init_args": args}

    def all_dropped(self) -> list[str]:
        return [*self.dropped, *(d for v in _parts(self.args) for d in v.all_dropped())]

    def all_missing(self) -> list[str]:
        return [*self.missing, *(d for v in _parts(self.args) for d in v.all_missing())]


def plain(value: Any) -> Any:
    if isinstance(value, Part):
        return value.plain()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _parts(value: Any):
    if isinstance(value, Part):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _parts(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _parts(v)


def instantiate(value: Any) -> Any:
    """The objects ``value`` (from ``resolve``) describes, inner parts first."""
    if isinstance(value, Part):
        args = {k: instantiate(v) for k, v in value.args.items()}
        if value.kind == "type":
            return value.cls
        return functools.partial(value.cls, **args) if value.kind == "callable" else value.cls(**args)
    if isinstance(value, list):
        return [instantiate(v) for v in value]
    if isinstance(value, tuple):
        return tuple(instantiate(v) for v in value)
    if isinstance(value, dict):
        return {k: instantiate(v) for k, v in value.items()}
    return value


# The zoo version a checkpoint's hyperparameters were written by, beside LightningCLI's ``_class_path``.
VERSION_KEY = "_zoo_version"


class Refused(Exception):
    """One rule refused a value: where, what it is and what was expected (``Resolver.refuse`` words it)."""

    def __init__(self, where: str, value: Any, expected: str) -> None:
        super().__init__(where, value, expected)
        self.where, self.value, self.expected = where, value, expected


class Resolver:
    """The rules above for one stored config from ``source``, against ``allow``."""

    def __init__(self, allow: Allowlist, source: str, keep_locations: bool = False) -> None:
        self.allow, self.source, self.keep_locations = allow, source, keep_locations
        self.imported: list[str] = []  # modules whose code ran: those of the user's own class paths

    def error(self, err: Refused) -> UntrustedConfigError:
        return trust.refusal(self.source, err.where, err.value, err.expected, self.imported)

    def complete(self, part: Part) -> Part:
        """``part``, if it gives every required parameter at every depth."""
        if missing := part.all_missing():
            where = missing[0]
            raise InputError(
                f"{where} is required and {self.source} does not give it (a stored config does not choose where data "
                f"is read from): pass --{where}=<...> (or --config <your YAML>, or {where.rsplit('.', 1)[-1]}= in "
                "Python)"
            )
        return part

    # -- classes -------------------------------------------------------------------------------------------------

    def allowed(self, path: Any, among: Mapping[str, type], where: str, what: str) -> type:
        """The class ``path`` names if the allowlist (or the user) admits it."""
        if isinstance(path, str) and isinstance(among.get(path), type):
            return among[path]
        if isinstance(path, str) and (path in self.allow.trusted or (where, path) in self.allow.trusted_at):
            return _import_trusted(path, where, what, self.imported)
        raise Refused(where, path, what)

    def part(
        self,
        cls: type,
        path: str,
        init_args: Any,
        where: str,
        kind: str = "class",
        given: tuple[str, ...] = (),
        depth: int = 0,
    ) -> Part:
        """``cls`` with ``init_args`` converted by its parameters' annotations; ``given``: arguments the caller
        passes itself (not required of the config)."""
        if init_args is None:
            init_args = {}
        if not isinstance(init_args, Mapping):
            raise Refused(f"{where}.init_args", init_args, f"a mapping of {path}'s parameters")
        params = parameters(cls)
        args, dropped = {}, []
        for key, value in init_args.items():
            here = f"{where}.init_args.{key}"
            if not isinstance(key, str) or key not in params:
                raise Refused(here, value, f"a parameter of {path}")
            if drops_location(key) and not self.keep_locations:
                dropped += [here] if value not in (None, False) else []  # a setting, not its default, is news
                continue
            if key in trust.IMPORT_LIST_ARGS:
                args[key] = self.wrappers(value, here)
            elif key in trust.ENV_ID_ARGS:
                args[key] = self.env_id(value, here)
            else:
                value = _completed(value, params[key].default)
                args[key] = self.convert(value, params[key].annotation, here, depth + 1)
        missing = [n for n, p in params.items() if p.default is p.empty and n not in args and n not in given]
        missing = [f"{where}.init_args.{n}" for n in missing] if kind == "class" else []
        return Part(cls, path, args, kind, tuple(dropped), tuple(missing), source=self.source)

    def nested(self, value: Any, bases: tuple[type, ...], where: str, kind: str, depth: int) -> Part:
        """``{class_path, init_args}`` (or the bare class path) of an allowed class, a subclass of one of ``bases``."""
        if isinstance(value, str):
            return dataclasses.replace(self.nested({"class_path": value}, bases, where, kind, depth), bare=True)
        if not isinstance(value, Mapping) or "class_path" not in value or set(value) - {"class_path", "init_args"}:
            raise Refused(where, value, "{class_path: <a class the zoo ships>, init_args: {...}}")
        among = collections.ChainMap(self.allow.parts, self.allow.data)  # looked up, not listed
        cls = self.allowed(value["class_path"], among, f"{where}.class_path", "a class the zoo ships")
        if not issubclass(cls, bases):
            raise Refused(f"{where}.class_path", value["class_path"], f"a {' or '.join(b.__name__ for b in bases)}")
        return self.part(cls, value["class_path"], value.get("init_args"), where, kind, depth=depth + 1)

    # -- values --------------------------------------------------------------------------------------------------

    def convert(self, value: Any, hint: Any, where: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise Refused(where, "<nested too deep>", f"at most {MAX_DEPTH} levels")
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if hint in (Any, object, inspect.Parameter.empty, None, dict, list) or isinstance(hint, typing.TypeVar):
            return plain_json(value, where, depth)
        if origin is typing.Annotated:
            return self.convert(value, args[0], where, depth)
        if origin in (typing.Union, types.UnionType):
            return self.union(value, args, where, depth)
        if origin is typing.Literal:
            if any(value == a and type(value) is type(a) for a in args):
                return value
            raise Refused(where, value, f"one of {list(args)}")
        if hint in SCALARS:
            return SCALARS[hint](value, where)
        if origin in (list, set, tuple, dict, collections.abc.Sequence, collections.abc.Iterable, Mapping):
            return self.container(value, origin, args, where, depth)
        if hint in (tuple, Mapping):
            return self.container(value, hint, (), where, depth)
        if origin is type:
            return self.type_of(value, args, where)
        if origin is collections.abc.Callable or hint is collections.abc.Callable:
            returns = _classes(args[-1]) if args else ()
            if not returns:
                raise Refused(where, value, "nothing: a callable of this kind is not built from a stored config")
            return self.nested(value, returns, where, "callable", depth)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            try:
                return hint(value)
            except ValueError:
                raise Refused(where, value, f"one of {[m.value for m in hint]}") from None
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return self.settings(value, hint, where, depth)
        if isinstance(hint, type):
            return self.nested(value, (hint,), where, "class", depth)
        raise Refused(where, value, f"a value of a kind the zoo builds (not {hint!r})")

    def union(self, value: Any, args: tuple, where: str, depth: int) -> Any:
        """The first alternative that takes ``value``; a refusal inside it (deeper than ``where``) is final."""
        if value is None and NONE in args:
            return None
        expected = []
        alts = [a for a in args if a is not NONE]
        # A dict of one settings dataclass's fields is that one's (``Llama3RoPE | YaRNRoPE``): the others would refuse
        # its first field of theirs as final, being inside the value.
        for alt in [a for a in alts if _holds_fields(a, value)] or alts:
            try:
                return self.convert(value, alt, where, depth)
            except Refused as err:
                if err.where != where:  # inside the value: that alternative was the one meant
                    raise
                expected.append(err.expected)
        raise Refused(where, value, " or ".join(expected))

    def container(self, value: Any, origin: Any, args: tuple, where: str, depth: int) -> Any:
        """Lists, tuples (fixed or ``...``) and mappings with string keys, item by item."""
        if origin in (dict, Mapping):
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise Refused(where, value, "a mapping with string keys")
            _no_decoy(value, where)
            item = args[1] if len(args) == 2 else Any
            return {k: self.convert(v, item, f"{where}.{k}", depth + 1) for k, v in value.items()}
        items = self.sequence(value, where)
        if origin is not tuple:
            return [self.convert(v, args[0] if args else Any, f"{where}[{i}]", depth + 1) for i, v in enumerate(items)]
        if not args:
            return tuple(plain_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(items))
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(items)
        if len(args) != len(items):
            raise Refused(where, value, f"{len(args)} items")
        return tuple(self.convert(v, a, f"{where}[{i}]", depth + 1) for i, (v, a) in enumerate(zip(items, args)))

    def sequence(self, value: Any, where: str) -> list:
        if not isinstance(value, (list, tuple)):
            raise Refused(where, value, "a list")
        return list(value)

    def settings(self, value: Any, cls: type, where: str, depth: int) -> Part:
        """A settings dataclass (``AdamWCosine``, ``Generation``) from a dict of its fields."""
        if not isinstance(value, Mapping):
            raise Refused(where, value, f"a mapping of {cls.__name__}'s fields")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        hints = typing.get_type_hints(cls)
        args, dropped = {}, []
        for key, item in value.items():
            here = f"{where}.{key}"
            if key not in fields:
                raise Refused(here, item, f"a field of {cls.__name__}")
            if drops_location(key) and not self.keep_locations:
                dropped += [here] if item not in (None, False) else []
                continue
            args[key] = self.convert(item, hints.get(key, Any), here, depth + 1)
        return Part(cls, f"{cls.__module__}.{cls.__qualname__}", args, "settings", tuple(dropped))

    def type_of(self, value: Any, args: tuple, where: str) -> Part:
        """``type[A | B]``: a class path naming A or B themselves (the annotation names the classes it admits)."""
        admitted = {p: c for c in _classes(args[0] if args else Any) for p in trust.paths_of(c)}
        if isinstance(value, str) and value in admitted:
            return Part(admitted[value], value, {}, "type")
        raise Refused(where, value, f"one of {sorted(admitted)}")

    def wrappers(self, value: Any, where: str) -> list | None:
        """gymnasium wrappers, which ``GymDataModule`` imports and calls: reviewed classes, plain arguments."""
        if value is None:
            return None
        out = []
        for i, wrapper in enumerate(self.sequence(value, where)):
            here = f"{where}[{i}]"
            path = wrapper.get("class_path") if isinstance(wrapper, Mapping) else wrapper
            if not (isinstance(path, str) and (path in trust.REVIEWED_WRAPPERS or path in self.allow.trusted)):
                raise Refused(here, path, "one of the reviewed gymnasium.wrappers classes")
            if isinstance(wrapper, Mapping):
                if set(wrapper) - {"class_path", "init_args"}:
                    raise Refused(here, wrapper, "{class_path, init_args} of a reviewed wrapper")
                args = wrapper.get("init_args") or {}
                if not isinstance(args, Mapping) or any(isinstance(v, (Mapping, list)) for v in args.values()):
                    raise Refused(f"{here}.init_args", args, "plain values (numbers, strings, booleans)")
                wrapper = {"class_path": path, "init_args": plain_json(args, f"{here}.init_args", 1)}
            out.append(wrapper)
        return out

    def env_id(self, value: Any, where: str) -> str:
        try:
            trust.check_env_id(value, where, self.source, self.allow)
        except UntrustedConfigError:
            raise Refused(where, value, trust.ENV_ID_EXPECTED) from None
        return value


def _completed(value: Any, default: Any) -> Any:
    """A settings dict over the fields of its parameter's default settings object (A2C's RMSprop, CLIP's betas), as
    jsonargparse completes one: a field the dict leaves out keeps the module's default, not the class's."""
    if isinstance(value, Mapping) and dataclasses.is_dataclass(default) and not isinstance(default, type):
        return {**dataclasses.asdict(default), **value}
    return value


def _exact(value: Any, kind: type, where: str, what: str) -> Any:
    if type(value) is kind:  # bool is not an int here, nor an int a bool
        return value
    raise Refused(where, value, what)


def _number(value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise Refused(where, value, "a number")


# The scalar annotations and how each converts (an int is not a bool here, nor a bool an int).
SCALARS = {
    NONE: lambda v, where: _exact(v, NONE, where, "null"),
    bool: lambda v, where: _exact(v, bool, where, "true or false"),
    int: lambda v, where: _exact(v, int, where, "an integer"),
    float: _number,
    str: lambda v, where: _exact(v, str, where, "a string"),
    Path: lambda v, where: Path(_exact(v, str, where, "a path")),
    PurePath: lambda v, where: Path(_exact(v, str, where, "a path")),
}


def plain_json(value: Any, where: str, depth: int = 0) -> Any:
    """``value`` if it is plain JSON data, copied (lists for tuples); refused otherwise. Never parsed nor built."""
    if depth > MAX_DEPTH:
        raise Refused(where, "<nested too deep>", f"at most {MAX_DEPTH} levels")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (list, tuple)):
        return [plain_json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        _no_decoy(value, where)
        return {k: plain_json(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    raise Refused(where, value, "plain data (null, booleans, numbers, strings, lists, mappings)")


def _no_decoy(value: Mapping, where: str) -> None:
    """Data is built by nobody here, but a class path in it is a decoy for whatever reads it next: refused, unless
    its owner builds that class from data itself (``zoo.io.trust.EXTERNAL_PARTS``)."""
    if "class_path" in value and value["class_path"] not in trust.EXTERNAL_PARTS:
        raise Refused(f"{where}.class_path", value["class_path"], "a class its owner builds from data")


def _holds_fields(hint: Any, value: Any) -> bool:
    """Whether ``hint`` is a settings dataclass with a field for each key of the mapping ``value``."""
    if not (isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, Mapping)):
        return False
    return set(value) <= {f.name for f in dataclasses.fields(hint) if f.init}


def _classes(hint: Any) -> tuple[type, ...]:
    """The classes a return or ``type[...]`` annotation names (each member of a union)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(c for a in typing.get_args(hint) for c in _classes(a))
    return (hint,) if isinstance(hint, type) and hint is not NONE else ()


def _import_trusted(path: str, where: str, what: str, imported: list[str]) -> type:
    """A class the user's own config named: theirs to vouch for, so imported by its path; ``imported`` gains the
    module and the parent packages whose code that ran (a module that failed half-way ran too, though it is gone from
    ``sys.modules``; what they import in turn is theirs)."""
    module, _, name = path.rpartition(".")
    before = set(sys.modules)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        missing = isinstance(err, ModuleNotFoundError) and (module == err.name or module.startswith(f"{err.name}."))
        _record(module, before, imported, ran=not missing)
        raise Refused(where, path, f"{what} (it names no importable class)") from None
    _record(module, before, imported, ran=True)
    if not isinstance(cls, type):
        raise Refused(where, path, what)
    return cls


def _record(module: str, before: set[str], imported: list[str], ran: bool) -> None:
    parts = module.split(".") if module else []
    for name in (".".join(parts[: i + 1]) for i in range(len(parts))):
        new = name not in before and (name in sys.modules or (ran and name == module))
        if new and name not in imported:
            imported.append(name)


@functools.cache
def parameters(cls: type) -> dict[str, inspect.Parameter]:
    """``cls.__init__``'s named parameters, annotations resolved, and those of the base its ``**kwargs`` reach."""
    out: dict[str, inspect.Parameter] = {}
    for base in cls.__mro__:
        init = vars(base).get("__init__")
        if init is None:
            continue
        if base.__module__.split(".")[0] in ("builtins", "torch", "lightning"):
            break  # nn.Module's and Lightning's own __init__ take nothing a config gives
        try:
            hints = typing.get_type_hints(init)
        except Exception:
            hints = {}
        params = list(inspect.signature(init).parameters.values())[1:]  # not self
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in out:
                out[p.name] = p.replace(annotation=hints.get(p.name, Any))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return out


# -- the ways in ------------------------------------------------------------------------------------------------


def resolve_model(
    hparams: Mapping[str, Any],
    source: str,
    allow: Allowlist,
    cls: type | None = None,
    given: tuple[str, ...] = (),
    keep_locations: bool = False,
    complete: bool = True,
) -> Part:
    """The module part of a stored config (``_class_path`` plus init arguments, as a checkpoint's
    ``hyper_parameters``); ``cls``: the class a caller already holds (``Module.load_from_checkpoint``), for a
    checkpoint that names none; ``given``: the arguments the caller passes itself; ``keep_locations``: for a config
    the user completed (what they give is theirs); ``complete``: refuse a config that leaves a required parameter
    out (not yet: the user's flags come next). A config of another zoo version's shape is refused, naming the version
    that wrote it (``VERSION_KEY``): no migration until a release promises one."""
    hparams = dict(hparams)
    class_path = hparams.pop("_class_path", None)
    written_by = hparams.pop(VERSION_KEY, None)
    if (instantiator := hparams.pop("_instantiator", None)) not in (None, trust.LIGHTNING_INSTANTIATOR):
        raise trust.refusal(source, "_instantiator", instantiator, "the instantiator LightningCLI records")
    resolver = Resolver(allow, source, keep_locations)
    try:
        if class_path is not None and not (cls is not None and class_path in trust.paths_of(cls)):
            cls = resolver.allowed(class_path, allow.modules, "model class_path", trust.MODULE_EXPECTED)
        if cls is None:
            raise Refused("model class_path", class_path, trust.MODULE_EXPECTED)
        part = resolver.part(cls, class_path or trust.paths_of(cls)[0], hparams, "model", given=given)
    except Refused as err:
        error = resolver.error(err)
        if written_by != zoo.__version__ and not err.where.endswith("class_path"):  # a shape of another version
            by = f"zoo {written_by}" if isinstance(written_by, str) else "a zoo from before checkpoints named theirs"
            error = type(error)(
                f"{error}; {source} was written by {by} and this is zoo {zoo.__version__}, which reads its own "
                "shapes only (no migration before a release): retrain, or use the zoo that wrote it"
            )
        raise error from None
    return resolver.complete(part) if complete else part


def resolve_data(
    class_path: Any,
    init_args: Mapping[str, Any],
    source: str,
    allow: Allowlist,
    keep_locations: bool = False,
    complete: bool = True,
) -> Part:
    """The DataModule part of a stored config."""
    resolver = Resolver(allow, source, keep_locations)
    try:
        cls = resolver.allowed(class_path, allow.data, "data class_path", trust.DATA_EXPECTED)
        part = resolver.part(cls, class_path, init_args, "data")
    except Refused as err:
        raise resolver.error(err) from None
    return resolver.complete(part) if complete else part


def build(part: Part, record: bool = False, budget: bool = True, **given: Any) -> Any:
    """``part`` built under the tripwire; ``given``: the caller's own arguments (objects from Python, or the user's
    overrides), which replace the stored ones; ``record``: a module's ``save_hyperparameters`` records the config
    (nets as ``{class_path, init_args}``, as LightningCLI hands it the parsed one), so its checkpoints rebuild it;
    ``budget``: its sizes and counts checked first (``zoo.io.budget``; off only for the meta build that check makes)."""
    from zoo.compat import given_hyperparameters_context

    if budget:  # what the caller gives is not the file's
        stored = dataclasses.replace(part, args={k: v for k, v in part.args.items() if k not in given})
        check(stored, part.source or part.path)
        part.args.update(stored.args)  # a count lowered to the CPUs

    for p in [part, *_all_parts(part)]:  # a package a zoo class states it needs (not one the config names)
        for name in getattr(p.cls, "preloads", ()):
            import_extra(name, p.path)  # or one line naming the extra that brings it
    with tripwire.guard(imports=_trusted_tops(part)):
        args = {k: instantiate(v) for k, v in part.args.items() if k not in given}
        args.update(given)
        if not record:
            return part.cls(**args)
        defaults = {n: p.default for n, p in parameters(part.cls).items() if p.default is not p.empty}
        hparams = {"_class_path": part.path, **_plain_only(defaults), **part.plain()["init_args"], **_plain_only(given)}
        with given_hyperparameters_context(hparams, trust.LIGHTNING_INSTANTIATOR):
            return part.cls(**args)


def _plain_only(given: dict[str, Any]) -> dict[str, Any]:
    """The arguments a config can record, as LightningCLI dumps them (an nn.Module passed in is not: it is passed
    again to load)."""
    out = {}
    for key, value in given.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        try:
            out[key] = plain_json(value, key)
        except Refused:
            continue
    return out


def check(part: Part, source: str) -> None:
    """``zoo.io.budget.check`` on ``part``: its counts, and the memory of its outermost nets built on the meta device
    (``nets``)."""
    budget.check(part, source, nets(part), part.own)


def check_net(config: Mapping[str, Any], source: str, trusted: Any = (), own: tuple[str, ...] = ()) -> None:
    """``check`` on a net a folder or a stored config states as ``{class_path, init_args}`` (a ``config.json`` read
    by a family's rule, a checkpoint's stored sizes), read by the rules above: the zoo's classes, and ``trusted``
    (those the user's own config names); ``own``: the settings the user gave (``budget.check``)."""
    resolver = Resolver(trust.zoo_allowlist().with_trusted(trusted), str(source), keep_locations=True)
    try:
        part = resolver.nested(dict(config), (nn.Module,), "net", "class", 0)
    except Refused as err:
        raise resolver.error(err) from None
    check(dataclasses.replace(part, own=own), str(source))


def nets(part: Part) -> list[tuple[str, Any]]:
    """The outermost nets of ``part`` (``nn.Module``s that are not LightningModules, which build theirs), each as a
    function building it under the tripwire."""
    from lightning.pytorch import LightningModule

    # isinstance first: only the allowlist keeps functions out, and with it off a part may name one
    if (
        isinstance(part.cls, type)
        and issubclass(part.cls, nn.Module)
        and not issubclass(part.cls, LightningModule)
        and part.kind == "class"
    ):
        return [(part.path, lambda: build(part, budget=False))]
    return [net for child in _parts(part.args) for net in nets(child)]


def _trusted_tops(part: Part) -> set[str]:
    """The top-level packages of the user's own classes in ``part``: their imports are theirs."""
    return {p.cls.__module__.split(".")[0] for p in [part, *_all_parts(part)]}


def _all_parts(part: Part):
    for p in _parts(part.args):
        yield p
        yield from _all_parts(p)
