"""OpenAI's request bodies (``/v1/chat/completions``, ``/v1/completions``) read by hand into one checked ``Call``: each
field's type and range, the caps a server sets (``Limits``), the model's generation defaults where a request says
nothing. A bad body is an ``APIError``: a 4xx in OpenAI's error shape naming the field, never a 500.

Fields OpenAI defines that change the answer and that the zoo does not implement (``logprobs``, ``response_format``,
penalties, ...) are refused by name unless at their neutral value; ``top_k`` and ``repetition_penalty`` are the
extensions vLLM's server takes too (the ``openai`` client's ``extra_body``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from zoo.errors import InputError

CHAT_FIELDS = {"messages", "tools", "tool_choice", "parallel_tool_calls", "max_completion_tokens"}
COMPLETION_FIELDS = {"prompt", "echo", "best_of", "suffix"}
COMMON_FIELDS = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "n",
    "seed", "stop", "user", "metadata", "store", "logprobs", "top_logprobs", "logit_bias", "frequency_penalty",
    "presence_penalty", "response_format", "service_tier",
}  # fmt: skip
# What a request may send only at the value that leaves decoding as the zoo does it.
NEUTRAL = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}), "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0), "response_format": (None, {"type": "text"}), "echo": (None, False),
    "best_of": (None, 1), "suffix": (None, ""), "service_tier": (None, "auto", "default"),
}  # fmt: skip
IGNORED = {"user", "metadata", "store", "parallel_tool_calls"}  # bookkeeping that changes no token
MAX_STOPS, MAX_STOP_CHARS = 4, 256  # OpenAI's 4 sequences; each held back while it may be starting
MAX_TOOLS, MAX_PROMPTS = 64, 16


class APIError(Exception):
    """A request the server refuses: ``status`` and OpenAI's ``{"error": {message, type, param, code}}``."""

    def __init__(
        self, message: str, param: str | None = None, code: str | None = None, status: int = 400, kind: str = ""
    ) -> None:
        super().__init__(message)
        self.param, self.code, self.status = param, code, status
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What the server allows one request: ``max_tokens`` generated tokens and ``max_prompt`` prompt tokens per
    choice (defaults: the model's context), ``max_n`` choices, ``timeout`` seconds from arrival to the last token,
    ``max_body`` bytes of JSON."""

    max_tokens: int
    max_prompt: int
    context: int
    max_n: int = 8
    timeout: float = 600.0
    max_body: int = 4 << 20


@dataclass(frozen=True)
class Defaults:
    """The model's own decoding (its folder's generation_config.json or its registered ``generation``), used where a
    request says nothing."""

    max_tokens: int = 200
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0


@dataclass
class Call:
    """One checked request: its prompts' inputs (chat ``messages`` or completion ``prompts``) and its decoding."""

    model: str
    stream: bool
    n: int
    max_tokens: int | None  # None: what the model's context leaves, within the defaults and the cap
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None
    stops: list[str]
    include_usage: bool
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    prompts: list[str | list[int]] = field(default_factory=list)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, else one APIError."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise APIError(f"the body is not JSON ({type(err).__name__}: {str(err)[:120]})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(f"the body is a JSON {type(body).__name__}, not an object of the request's fields")
    return body


def parse(body: dict, chat: bool, limits: Limits, defaults: Defaults) -> Call:
    """``body`` of ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` as a ``Call``, or the first thing wrong
    with it as an APIError naming the field."""
    allowed = COMMON_FIELDS | (CHAT_FIELDS if chat else COMPLETION_FIELDS)
    if unknown := sorted(set(body) - allowed):
        raise APIError(
            f"{unknown[0]!r} is not a field this server reads (it reads {', '.join(sorted(allowed))})",
            unknown[0],
            "unknown_field",
        )
    for name, neutral in NEUTRAL.items():
        if body.get(name) not in neutral:
            raise APIError(f"{name}={body[name]!r} is not implemented here: leave it out", name, "unsupported")
    model = _string(body, "model", required=True)
    stream = _bool(body, "stream", False)
    options = _object(body, "stream_options")
    if options is not None and (
        set(options) - {"include_usage"} or not isinstance(options.get("include_usage", False), bool)
    ):
        raise APIError("stream_options takes only include_usage, a boolean", "stream_options")
    if options is not None and not stream:
        raise APIError("stream_options is for stream=true only", "stream_options")
    tokens = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, tokens, 1, limits.max_tokens, None, f"at most {limits.max_tokens}, this server's cap")
    call = Call(
        model=model,
        stream=stream,
        n=_integer(body, "n", 1, limits.max_n, 1, f"at most {limits.max_n} choices per request"),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0, defaults.temperature),
        top_p=_number(body, "top_p", 0.0, 1.0, defaults.top_p, low_open=True),
        top_k=_integer(body, "top_k", 0, 1 << 31, defaults.top_k, "0 (every token) or more"),
        repetition_penalty=_number(body, "repetition_penalty", 0.0, 10.0, defaults.repetition_penalty, low_open=True),
        seed=_integer(body, "seed", -(1 << 63), (1 << 63) - 1, None, "a 64-bit integer"),
        stops=_stops(body),
        include_usage=bool(options and options.get("include_usage")),
    )
    if chat:
        call.messages = _messages(body)
        call.tools = _tools(body)
    else:
        call.prompts = _prompts(body)
    return call


def token_budget(call: Call, prompt_len: int, limits: Limits, defaults: Defaults, param: str) -> int:
    """How many tokens a choice of ``call`` may generate after a prompt of ``prompt_len`` tokens, or one APIError: a
    prompt past the cap or the context, or an asked max_tokens that does not fit beside the prompt."""
    if prompt_len > limits.max_prompt or prompt_len >= limits.context:
        most = min(limits.max_prompt, limits.context - 1)
        raise APIError(
            f"the prompt is {prompt_len} tokens, more than the {most} this server takes: shorten {param}",
            param,
            "context_length_exceeded",
        )
    room = limits.context - prompt_len
    if call.max_tokens is None:
        return max(1, min(defaults.max_tokens, limits.max_tokens, room))
    if call.max_tokens > room:
        raise APIError(
            f"max_tokens={call.max_tokens} and the prompt's {prompt_len} tokens exceed the model's context "
            f"of {limits.context}: ask for at most {room}",
            "max_tokens",
            "context_length_exceeded",
        )
    return call.max_tokens


# -- fields ---------------------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    return (
        "null"
        if value is None
        else {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
            type(value), type(value).__name__
        )
    )


def _string(body: dict, name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise APIError(f"{name} must be a string, not {_kind(value)}", name, "invalid_type")
    return value


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(f"{name} must be a boolean, not {_kind(value)}", name, "invalid_type")
    return value


def _object(body: dict, name: str) -> dict | None:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise APIError(f"{name} must be an object, not {_kind(value)}", name, "invalid_type")
    return value


def _integer(body: dict, name: str, low: int, high: int, default: int | None, rule: str) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{name} must be an integer, not {_kind(value)}", name, "invalid_type")
    if not low <= value <= high:
        raise APIError(
            f"{name}={value} is out of range: {'at least ' + str(low) if value < low else rule}", name, "invalid_value"
        )
    return value


def _number(body: dict, name: str, low: float, high: float, default: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(f"{name} must be a number, not {_kind(value)}", name, "invalid_type")
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise APIError(f"{name}={value} is out of range: it must be in {interval}", name, "invalid_value")
    return float(value)


def _stops(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise APIError("stop must be a string or an array of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise APIError(
            f"stop takes at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters",
            "stop",
            "invalid_value",
        )
    return stops


def _prompts(body: dict) -> list[str | list[int]]:
    value = body.get("prompt")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return [value]  # one prompt of token ids
    if isinstance(value, list) and 0 < len(value) <= MAX_PROMPTS and all(isinstance(p, str) for p in value):
        return value
    raise APIError(
        f"prompt must be a string, an array of at most {MAX_PROMPTS} strings or an array of token ids, "
        f"not {_kind(value)}",
        "prompt",
        "invalid_type",
    )


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's array of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        if all(isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise APIError(f"{where}.content must be a string or an array of text parts", f"{where}.content", "invalid_type")


def _messages(body: dict) -> list[dict]:
    """The conversation as the chat template reads it: role and content (text parts joined); an assistant's
    ``tool_calls`` with their arguments as objects (what templates render with ``tojson``); a tool's reply."""
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise APIError(
            f"messages must be a non-empty array of messages, not {_kind(value)}", "messages", "invalid_type"
        )
    out = []
    for k, m in enumerate(value):
        where = f"messages[{k}]"
        if not isinstance(m, dict):
            raise APIError(f"{where} must be an object with role and content", where, "invalid_type")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(
                f"{where}.role must be system, developer, user, assistant or tool, not {role!r}",
                f"{where}.role",
                "invalid_value",
            )
        calls = m.get("tool_calls") if role == "assistant" else None
        if m.get("content") is None and not calls:
            raise APIError(f"{where} has no content", f"{where}.content", "invalid_value")
        message = {"role": "system" if role == "developer" else role, "content": _text(m.get("content") or "", where)}
        if calls:
            message["tool_calls"] = _tool_calls(calls, where)
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            message["tool_call_id"] = m["tool_call_id"]
        out.append(message)
    return out


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise APIError(f"{where}.tool_calls must be an array", f"{where}.tool_calls", "invalid_type")
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(
                f"{where}.tool_calls[{i}] must be {{'type': 'function', 'function': {{name, arguments}}}}",
                f"{where}.tool_calls",
                "invalid_type",
            )
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise APIError(f"{where}.tool_calls[{i}].function.arguments is not JSON", f"{where}.tool_calls",
                               "invalid_value") from None  # fmt: skip
        out.append({"type": "function", "id": call.get("id"), "function": {"name": fn["name"], "arguments": arguments}})
    return out


def _tools(body: dict) -> list[dict] | None:
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise APIError("tool_choice takes 'auto' or 'none' here (no forced calls)", "tool_choice", "unsupported")
    tools = body.get("tools")
    if tools is None or choice == "none":
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise APIError(f"tools must be an array of at most {MAX_TOOLS} tools", "tools", "invalid_type")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{name, ...}}}}", "tools", "invalid_type"
            )
        if not isinstance(fn.get("name"), str):
            raise APIError(f"tools[{i}].function.name must be a string", "tools", "invalid_type")
    return tools or None


def input_error(err: InputError, param: str) -> APIError:
    """What the zoo's own checks refused (a template's render, a conversation) as the request's 400."""
    return APIError(str(err), param, "invalid_value")
