"""Tool calls in a model's text: the one syntax the zoo's own tokenizers use, its parser, and the checks on the tools
and tool messages a conversation carries.

The syntax is Hermes' and Qwen2.5's: a call is a JSON object of exactly ``name`` (a string) and ``arguments`` (an
object) between ``<tool_call>`` and ``</tool_call>``; a reply may hold several, before or after its text. The zoo's
default chat format writes a call as ``format_tool_call`` does, with no space around the JSON
(``<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>``); Qwen2.5's template writes
it on its own lines, which the parser reads too (it strips whitespace inside the tags). A tool's result comes back
as a message ``{"role": "tool", "name": ..., "content": "..."}``, context to the model, never learned.

``parse_tool_calls`` reads a reply with bounds (at most ``MAX_TOOL_CALLS`` calls, each at most ``MAX_CALL_CHARS``
characters), and never raises on what a model wrote: a call it cannot read is an entry with an ``error`` (what is
wrong, to be told to the model), so a malformed call is feedback, not a crash. Text beyond ``MAX_TEXT_CHARS`` is not
read. These are plain functions: an environment and the chat server read a reply the same way.

Llama 3.1's and 3.2's templates write a call otherwise, as the whole reply: a bare JSON object of ``name`` and
``parameters`` (``{"name": "calculator", "parameters": {"expression": "2+3"}}``), which a model taught by them
writes back. ``zoo.io.chat_template.tool_call_syntax`` tells a tokenizer's by what its template renders ("hermes"
or "json"), and the parser reads a reply in that syntax: in "json", a reply that opens with ``{`` (after
``<|python_tag|>``, if any) is its calls, one JSON object after another (``;`` or whitespace between), with the same
bounds; text after them is not a call. Another reply is read for tags, as SFT on the zoo's text calls teaches them to
any template's model.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from zoo.errors import InputError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOL_CALLS = 8  # per reply: more is a loop, not a plan
MAX_CALL_CHARS = 4096  # the JSON between one pair of tags
MAX_TEXT_CHARS = 200_000  # what the parser reads of a reply
MAX_TOOLS = 64  # tools a conversation declares
MAX_TOOL_SPEC_CHARS = 16_384  # one tool's JSON schema
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")  # OpenAI's function names
Syntax = Literal["hermes", "json"]  # <tool_call> tags, or Llama 3's bare JSON objects
PYTHON_TAG = "<|python_tag|>"  # Llama 3's opener of a tool call (written before built-in tools' calls)
SPACE, BETWEEN = re.compile(r"\s*"), re.compile(r"[\s;]*")  # before the first call; between two


def format_tool_call(name: str, arguments: Any) -> str:
    """A call as the zoo's default format writes it (and as Jinja's ``tojson`` writes the same object)."""
    return OPEN + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + CLOSE


def parse_tool_calls(text: str, syntax: Syntax = "hermes") -> list[dict]:
    """The calls in ``text``, in order: ``{"name": str, "arguments": dict}`` each, or ``{"error": why}`` (with
    ``name`` where one was read) for a call that cannot be run: not JSON, not exactly name and arguments, a name
    that is not a function name, too long, not closed, or past the ``MAX_TOOL_CALLS`` of a reply. ``syntax``: the
    model's (``tool_call_syntax``): tagged blocks, or Llama 3's bare JSON (``parameters`` for ``arguments``)."""
    return [call for _, _, call in tool_call_blocks(text, syntax)]


def tool_call_blocks(text: str, syntax: Syntax = "hermes") -> list[tuple[int, int, dict]]:
    """``(start, end, call)`` of each tool-call block of ``text`` in order (``call`` as ``parse_tool_calls`` gives
    it; ``text[start:end]`` the block with its tags): the one scan the environments and the chat server read a reply
    with. A block left open, or one past ``MAX_TOOL_CALLS``, ends the scan with an error entry spanning the rest."""
    if syntax == "json" and (blocks := _json_blocks(text[:MAX_TEXT_CHARS])):
        return blocks  # a reply of bare JSON; else the tags, which such a model may have been taught too
    blocks = []
    text, at = text[:MAX_TEXT_CHARS], 0
    while (start := text.find(OPEN, at)) >= 0:
        if len(blocks) == MAX_TOOL_CALLS:
            blocks.append(_one_too_many(start, len(text)))
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            blocks.append((start, len(text), {"error": f"a {OPEN} without its {CLOSE}"}))
            break
        blocks.append((start, end + len(CLOSE), _call(text[start + len(OPEN) : end])))
        at = end + len(CLOSE)
    return blocks


def _one_too_many(start: int, end: int) -> tuple[int, int, dict]:
    return start, end, {"error": f"more than {MAX_TOOL_CALLS} tool calls in one reply; the rest were not run"}


def _call(body: str) -> dict:
    if len(body) > MAX_CALL_CHARS:
        return {"error": f"a tool call of {len(body)} characters, over the {MAX_CALL_CHARS} read"}
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):
        return {"error": 'a tool call that is not JSON: write {"name": ..., "arguments": {...}}'}
    if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
        return {"error": 'a tool call is a JSON object of exactly "name" and "arguments"'}
    return _named(call["name"], call["arguments"])


def _json_blocks(text: str) -> list[tuple[int, int, dict]]:
    """Llama 3's calls: JSON objects from the reply's start, each read within ``MAX_CALL_CHARS`` (so the scan is
    bounded whatever follows), at most ``MAX_TOOL_CALLS``; a reply that does not open with ``{`` has none."""
    decoder, blocks = json.JSONDecoder(), []
    at = SPACE.match(text).end()
    if text.startswith(PYTHON_TAG, at):
        at = SPACE.match(text, at + len(PYTHON_TAG)).end()
    while text.startswith("{", at):
        if len(blocks) == MAX_TOOL_CALLS:
            blocks.append(_one_too_many(at, len(text)))
            break
        try:
            call, end = decoder.raw_decode(text[at : at + MAX_CALL_CHARS])
        except (ValueError, RecursionError):
            within = f" within {MAX_CALL_CHARS} characters" if len(text) - at > MAX_CALL_CHARS else ""
            error = f'a tool call that is not JSON{within}: write {{"name": ..., "parameters": {{...}}}}'
            blocks.append((at, len(text), {"error": error}))
            break
        keys = set(call) if isinstance(call, dict) else set()
        if keys not in ({"name", "parameters"}, {"name", "arguments"}):
            entry = {"error": 'a tool call is a JSON object of exactly "name" and "parameters"'}
        else:
            entry = _named(call["name"], call.get("parameters", call.get("arguments")))
        end = BETWEEN.match(text, at + end).end()  # a block holds the separator after it
        blocks.append((at, end, entry))
        at = end
    return blocks


def _named(name: object, arguments: object) -> dict:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return {"error": f"a tool call whose name {str(name)[:64]!r} is not a function name"}
    if not isinstance(arguments, dict):
        return {"name": name, "error": f'the call to {name} has "arguments" that are not a JSON object'}
    return {"name": name, "arguments": arguments}


# -- what a conversation with tools may carry ----------------------------------------------------------------------


def checked_tools(tools: object) -> list[dict] | None:
    """``tools`` when it is None or a list of OpenAI function specs (``{"type": "function", "function": {"name",
    "description"?, "parameters"?}}``, as ``apply_chat_template(tools=...)`` takes them), each within
    ``MAX_TOOL_SPEC_CHARS``; else one InputError naming the tool and what is wrong."""
    if tools is None:
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise InputError(f"has 'tools' that is not a list of at most {MAX_TOOLS} function specs")
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function" or set(tool) != {"type", "function"}:
            raise InputError(f'tool {k} is not {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}')
        if not isinstance(function.get("name"), str) or not NAME.fullmatch(function["name"]):
            raise InputError(f"tool {k} has no function name (letters, digits, _ . -; at most 64)")
        if not isinstance(function.get("description", ""), str):
            raise InputError(f"tool {k} ({function['name']}) has a description that is not a string")
        parameters = function.get("parameters", {})
        if not isinstance(parameters, dict) or not isinstance(parameters.get("properties", {}), dict):
            raise InputError(f"tool {k} ({function['name']}) has parameters that are not a JSON schema object")
        try:
            size = len(json.dumps(tool, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError):
            raise InputError(
                f"tool {k} ({function['name']}) is not JSON (plain objects, lists, strings, numbers)"
            ) from None
        if size > MAX_TOOL_SPEC_CHARS:
            raise InputError(f"tool {k} ({function['name']}) is over {MAX_TOOL_SPEC_CHARS} characters of JSON")
    return tools


def check_tool_message_fields(m: dict, k: int) -> None:
    """A ``tool`` message may name its tool and call (``name``, ``tool_call_id``: strings); an assistant message may
    carry ``tool_calls`` in OpenAI's form (``[{"type": "function", "function": {"name", "arguments"}, "id"?}]``)."""
    allowed = {"tool": {"name", "tool_call_id"}, "assistant": {"tool_calls"}}.get(m["role"], set())
    if extra := sorted(set(m) - {"role", "content"} - allowed, key=str):
        raise InputError(f"message {k} has {extra[0]!r}, which a {m['role']} message does not carry")
    for key in ("name", "tool_call_id"):
        if key in m and not isinstance(m[key], str):
            raise InputError(f"message {k} has a {key} that is not a string")
    calls = m.get("tool_calls", [])
    if not isinstance(calls, list) or len(calls) > MAX_TOOL_CALLS:
        raise InputError(f"message {k} has tool_calls that are not a list of at most {MAX_TOOL_CALLS}")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or set(call) - {"type", "function", "id"}
            or set(function) != {"name", "arguments"}
            or not isinstance(function["name"], str)
            or not isinstance(function["arguments"], dict)
        ):
            raise InputError(
                f'message {k} has a tool call that is not {{"type": "function", "function": {{"name": ..., '
                f'"arguments": {{...}}}}}} (arguments an object, not a JSON string)'
            )
