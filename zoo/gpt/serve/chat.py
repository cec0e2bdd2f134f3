"""A chat request as the model's prompt ids, and a reply's tool calls as OpenAI's ``tool_calls``.

The prompt is the tokenizer's chat template with its generation prompt (``zoo.io.chat_template``: an imported
folder's, else the zoo's default format): the ids transformers' ``apply_chat_template(..., add_generation_prompt=True)``
gives, for templates that rewrite earlier turns too (Qwen3, DeepSeek-V3). ``tools`` and tool turns are the template's
to render (Qwen2.5's and Hermes' ``<tool_call>`` blocks); a model whose format has no tools is refused by name. A
reply's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks are its calls.
"""

from __future__ import annotations

import json
import uuid

from zoo.errors import InputError
from zoo.gpt.serve.api import APIError
from zoo.io.chat_template import chat_renderer, checked_messages, render

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS, MAX_CALL_CHARS = 8, 4096  # per reply; the JSON between one pair of tags


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The ids a reply to ``messages`` continues (``tools`` offered), or an APIError naming what the model's chat
    format cannot show."""
    plain = tools is None and all(set(m) == {"role", "content"} and m["role"] != "tool" for m in messages)
    try:
        if plain:
            return chat_renderer(tokenizer)(checked_messages(messages), True).ids
        if getattr(tokenizer, "chat_template", None) is None:
            raise APIError(
                "this model's chat format has no tools or tool turns (it has no chat template that renders "
                "them): leave tools out",
                "tools",
                "unsupported",
            )
        special = {f"{name}_token": tok for name, tok in tokenizer.special.items() if tok}
        text = render(tokenizer.chat_template, messages, True, tools=tools, **special)
        return tokenizer.hf.encode(text, add_special_tokens=False).ids
    except InputError as err:
        raise APIError(f"the conversation does not render with the model's chat template: {err}", "messages",
                       "invalid_value") from None  # fmt: skip


def tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """A reply's text without its tool-call blocks (None when nothing else is left) and the calls in OpenAI's shape,
    read in one pass (at most ``MAX_CALLS`` calls of ``MAX_CALL_CHARS`` each); a block that is not a JSON object with
    a string ``name`` stays text."""
    calls, kept, at = [], [], 0
    while len(calls) < MAX_CALLS and (start := text.find(OPEN, at)) >= 0:
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            break
        call = _call(text[start + len(OPEN) : end])
        kept.append(text[at:start] if call else text[at : end + len(CLOSE)])
        calls += [call] if call else []
        at = end + len(CLOSE)
    if not calls:
        return text, []
    content = ("".join(kept) + text[at:]).strip()
    return content or None, calls


def _call(body: str) -> dict | None:
    if len(body) > MAX_CALL_CHARS:
        return None
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }
