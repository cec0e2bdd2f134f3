"""Tools named in the user's YAML: plain Python functions, found by a dotted path (``mypkg.tools.lookup``, as
LightningCLI names a callable), their OpenAI function spec read off the signature and the Google-style docstring as
transformers' ``get_json_schema`` reads them, run by a text environment beside its own tools (``TextEnv``'s time
limit, result bound and ``error:`` messages for a call the model got wrong).

A function's spec: its ``__name__``; its docstring's text before ``Args:`` as the description; a property per
parameter, typed by its annotation (``int`` integer, ``float`` number, ``str``, ``bool``, ``list[...]`` array,
``dict[str, ...]`` object, ``tuple[...]``, ``Literal[...]`` and ``Enum`` an enum, ``X | None`` nullable) and described
by its ``Args:`` line (``(choices: [...])`` at its end an enum); required when it has no default; ``return`` from
the return annotation and ``Returns:``. A parameter without an annotation or a description, ``*args``, ``**kwargs``
or a type JSON cannot carry is refused in one line, as transformers refuses it. The model's arguments come as JSON
values (a tuple as a list, an Enum as its value), checked against the spec before the call; a ``str`` result is the
tool message, a number, boolean, None, list or dict its JSON; a function raises ``ToolError`` for a message to the
model (``error: no such city``), anything else ends the episode (``TextEnv``).

A path may also name a ``Tool`` subclass of the zoo's (``zoo.gpt.tune.envs.calculator.Calculator``), built with no
arguments. Naming is code: only the user's own config names tools (``data.init_args.tools``); a stored config's are
dropped, as GRPO's rewards are (``zoo.io.build.USER_CODE_NAMES``), and ``cli.py test --ckpt_path`` refuses in one line
to run without them stated again.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from zoo.errors import InputError
from zoo.gpt.tune.envs.base import JSON_TYPES, TextEnv, Tool
from zoo.io.tool_calls import checked_tools

MAX_USER_TOOLS = 16
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
SECTION = re.compile(r"^(Args|Returns|Raises):\s*$")
ARG = re.compile(r"^(\w+)(?:[ \t]*\([^()\n]*\))?:\s*(.*)$")  # "name (type): what it is"
CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)
SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
BARE = {**{k: {"type": v} for k, v in SCALARS.items()}, list: {"type": "array"}, tuple: {"type": "array"}}
BARE |= {dict: {"type": "object"}, Any: {}}


class ToolSpecError(InputError):
    """What makes a function no tool (a parameter without a type JSON carries, or without a description)."""


# -- the spec, as transformers' get_json_schema writes it --------------------------------------------------------------


def schema_of(hint: Any) -> dict:
    """The JSON schema of one annotation; ToolSpecError for one JSON cannot carry."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None and isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum([m.value for m in hint])
    if origin is None:
        if hint in BARE:
            return dict(BARE[hint])
        raise ToolSpecError(f"{getattr(hint, '__name__', hint)!s} is no JSON type (str, int, float, bool, list, dict)")
    if origin in (typing.Union, types.UnionType):
        subtypes = [schema_of(t) for t in args if t is not type(None)]
        if len(subtypes) == 1:
            out = subtypes[0]
        elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in subtypes):
            names = sorted({s["type"] for s in subtypes})
            out = {"type": names[0] if len(names) == 1 else names}
        else:
            out = {"anyOf": subtypes}
        return out | ({"nullable": True} if type(None) in args else {})
    if origin is typing.Literal and args:
        return _enum(list(args))
    if origin is list:
        return {"type": "array", "items": schema_of(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) == 1 or ... in args:
            raise ToolSpecError(f"{hint} is a tuple of one item or of any length: use list[...]")
        return {"type": "array", "prefixItems": [schema_of(t) for t in args]} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"} | ({"additionalProperties": schema_of(args[1])} if len(args) == 2 else {})
    raise ToolSpecError(f"{hint} is no JSON type")


def _enum(values: list) -> dict:
    if not values or any(type(v) not in SCALARS for v in values):
        raise ToolSpecError(f"the choices {values!r} are not JSON scalars")
    kinds = list(dict.fromkeys(SCALARS[type(v)] for v in values))
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def docstring_parts(doc: str) -> tuple[str, dict[str, str], str | None]:
    """A Google-style docstring's description (before its first section), ``Args:`` descriptions (continuation
    lines joined by a space) and ``Returns:`` text."""
    lines, section, described, args, returns = doc.strip().split("\n"), None, [], {}, []
    indent, name = None, None
    for line in lines:
        if header := SECTION.match(line.strip()):
            section, indent = header[1], None
            continue
        if section is None:
            described.append(line)
        elif section == "Args" and line.strip():
            depth = len(line) - len(line.lstrip())
            entry = ARG.match(line.strip())
            if entry and (indent is None or depth <= indent):
                indent, name = depth, entry[1]
                args[name] = entry[2].strip()
            elif name is not None:
                args[name] = f"{args[name]} {line.strip()}".strip()
        elif section == "Returns":
            returns.append(line)
    return "\n".join(described).strip(), args, "\n".join(returns).strip() or None


def function_spec(fn: Callable) -> dict:
    """``fn``'s OpenAI function spec (module docstring); ToolSpecError naming what it lacks."""
    name, doc = fn.__name__, inspect.getdoc(fn)
    if not doc:
        raise ToolSpecError(f"{name} has no docstring: say what it does, and each argument under Args:")
    description, described, returns = docstring_parts(doc)
    hints, properties, required = typing.get_type_hints(fn), {}, []
    for param in inspect.signature(fn).parameters.values():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ToolSpecError(f"{name} takes *args, **kwargs or positional-only {param.name!r}: name every argument")
        if param.name not in hints:
            raise ToolSpecError(f"{name}'s argument {param.name!r} has no type annotation")
        if param.name not in described:
            raise ToolSpecError(f"{name}'s docstring does not describe the argument {param.name!r} under Args:")
        try:
            schema = schema_of(hints[param.name])
        except ToolSpecError as err:
            raise ToolSpecError(f"{name}'s argument {param.name!r}: {err}") from None
        text = described[param.name]
        if choices := CHOICES.search(text):
            schema["enum"] = [c.strip() if isinstance(c, str) else c for c in json.loads(choices[1])]
            text = text[: choices.start()].strip()
        properties[param.name] = schema | {"description": text}
        required += [param.name] if param.default is param.empty else []
    parameters = {"type": "object", "properties": properties} | ({"required": required} if required else {})
    function = {"name": name, "description": description, "parameters": parameters}
    if "return" in hints:
        try:  # the model never writes the result: a return type JSON cannot carry is left out, not refused
            function["return"] = schema_of(hints["return"]) | ({"description": returns} if returns else {})
        except ToolSpecError:
            pass
    return {"type": "function", "function": function}


# -- the tool ----------------------------------------------------------------------------------------------------------


class FunctionTool(Tool):
    """A plain function as a ``Tool``: its spec derived (``function_spec``), its arguments checked against it, its
    result as text."""

    def __init__(self, fn: Callable, path: str = "") -> None:
        self.fn, self.path = fn, path or f"{fn.__module__}.{fn.__qualname__}"
        self.function = function_spec(fn)["function"]
        self.name, self.description = self.function["name"], self.function["description"]
        self.parameters = self.function["parameters"]

    @property
    def spec(self) -> dict:
        return {"type": "function", "function": self.function}

    def __call__(self, **arguments: Any) -> str:
        result = self.fn(**arguments)
        if isinstance(result, str) or not isinstance(result, (bool, int, float, list, dict, type(None))):
            return result  # a string is the message; anything else is TextEnv's to refuse, naming its type
        return json.dumps(result, ensure_ascii=False)

    def argument_error(self, arguments: dict) -> str | None:
        properties, required = self.parameters["properties"], self.parameters.get("required", [])
        if missing := [k for k in required if k not in arguments]:
            return f"{self.name} needs the argument {missing[0]!r}"
        if unknown := [k for k in arguments if k not in properties]:
            return f"{self.name} takes no argument {unknown[0][:64]!r} (it takes {', '.join(properties) or 'none'})"
        for key, value in arguments.items():
            if not fits(value, properties[key]):
                return f"{self.name}'s argument {key!r} is not {_shown(properties[key])}"
        return None


def fits(value: Any, schema: dict) -> bool:
    """Whether a JSON value fits the schema ``schema_of`` wrote (its types, enum, items, nullable, anyOf)."""
    if value is None and schema.get("nullable"):
        return True
    if "anyOf" in schema:
        return any(fits(value, s) for s in schema["anyOf"])
    if "enum" in schema and not any(value == v and type(value) is type(v) for v in schema["enum"]):
        return False
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if kinds is not None and not any(_is(value, k) for k in kinds):
        return False
    if isinstance(value, list) and "items" in schema:
        return all(fits(v, schema["items"]) for v in value)
    if isinstance(value, list) and "prefixItems" in schema:
        items = schema["prefixItems"]
        return len(value) == len(items) and all(fits(v, s) for v, s in zip(value, items))
    if isinstance(value, dict) and "additionalProperties" in schema:
        return all(fits(v, schema["additionalProperties"]) for v in value.values())
    return True


def _is(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if isinstance(value, bool):
        return kind == "boolean"
    return isinstance(value, JSON_TYPES.get(kind, ()))


def _shown(schema: dict) -> str:
    if "enum" in schema:
        return f"one of {json.dumps(schema['enum'])}"
    kinds = schema.get("type", "any value")
    return " or ".join(kinds) if isinstance(kinds, list) else f"{'an' if kinds[0] in 'aeiou' else 'a'} {kinds}"


# -- named in a config -------------------------------------------------------------------------------------------------


def resolve_tool(path: object) -> Tool:
    """The tool ``path`` names: a function (``FunctionTool``), a ``Tool`` subclass (built with no arguments) or a
    ``Tool``; one InputError naming the path otherwise. Importing its module runs it: the user's own config only."""
    if not isinstance(path, str) or not DOTTED.fullmatch(path):
        raise InputError(f"tools: {str(path)[:100]!r} is not a dotted path to a function (mypkg.tools.lookup)")
    value = _imported(path)
    try:
        if inspect.isclass(value) and issubclass(value, Tool):
            value = value()
        if isinstance(value, Tool):
            return value
        if inspect.isfunction(value):
            return FunctionTool(value, path)
    except ToolSpecError as err:
        raise InputError(f"tools: {path} is no tool: {err}") from None
    raise InputError(f"tools: {path} is a {type(value).__name__}, not a function or a Tool")


def _imported(path: str) -> Any:
    """What ``path`` names: its longest importable module prefix, then attributes (as jsonargparse finds one)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            value = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and module_name.startswith(err.name):
                continue  # that prefix is no module: a shorter one may be
            raise InputError(f"tools: importing {module_name} for {path} failed ({err})") from None
        except Exception as err:  # the user's module is theirs: what it raises is one line, not a traceback
            raise InputError(f"tools: importing {module_name} for {path} raised {type(err).__name__}: {err}") from None
        for attr in parts[cut:]:
            if not hasattr(value, attr):
                raise InputError(f"tools: {module_name} has no {'.'.join(parts[cut:])} (from {path})")
            value = getattr(value, attr)
        return value
    raise InputError(f"tools: no module of {path} can be imported (is its package installed or on PYTHONPATH?)")


def resolve_tools(paths: Sequence[str] | None) -> list[Tool]:
    """The tools ``paths`` name, at most ``MAX_USER_TOOLS``, with distinct names and specs a chat template takes."""
    if paths is None:
        return []
    if isinstance(paths, str) or not isinstance(paths, Sequence) or len(paths) > MAX_USER_TOOLS:
        raise InputError(f"tools: give a list of at most {MAX_USER_TOOLS} dotted paths (got {str(paths)[:100]!r})")
    tools = [resolve_tool(p) for p in paths]
    try:
        checked_tools([t.spec for t in tools])
    except InputError as err:
        raise InputError(f"tools: {err}") from None
    return tools


def with_tools(env, paths: Sequence[str] | None):
    """``env`` whose text environment also runs the tools ``paths`` name, after its own; refused in one line where
    ``env`` is no ``TextEnv`` or two tools share a name."""
    tools = resolve_tools(paths)
    if not tools:
        return env
    base = env.unwrapped
    if not isinstance(base, TextEnv):
        raise InputError(f"tools: {type(base).__name__} is no text environment (TextEnv), which is what runs tools")
    names = [t.name for t in (*base.toolbox, *tools)]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        own = ", ".join(t.name for t in base.toolbox) or "none"
        raise InputError(f"tools: two tools are named {twice[0]!r} (the environment's own: {own})")
    base.toolbox = (*base.toolbox, *tools)
    return env
