"""A chat request as the model's prompt ids, and a reply's tool calls as OpenAI's ``tool_calls``.

The prompt is the tokenizer's chat template with its generation prompt (``zoo.io.chat_template``: an imported
folder's, else the zoo's default format): the ids transformers' ``apply_chat_template(..., add_generation_prompt=True)``
gives, for templates that rewrite earlier turns too (Qwen3, DeepSeek-V3). ``tools`` and tool turns are the template's
to render (Qwen2.5's and Hermes' ``<tool_call>`` blocks); a model whose format has no tools is refused by name. A
reply's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks are its calls, or, where its template
writes calls as Llama 3's do, the bare JSON objects ``{"name": ..., "parameters": {...}}`` it opens with.
"""

from __future__ import annotations

import json
import uuid

from zoo.errors import InputError
from zoo.gpt.serve.api import APIError
from zoo.io.chat_template import chat_renderer, checked_messages, render
from zoo.io.tool_calls import Syntax, tool_call_blocks


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


def tool_calls(text: str, syntax: Syntax = "hermes") -> tuple[str | None, list[dict]]:
    """A reply's text without its tool-call blocks (None when nothing else is left) and the calls in OpenAI's shape,
    read as an environment reads them (``zoo.io.tool_calls.tool_call_blocks``: at most ``MAX_TOOL_CALLS`` calls of
    ``MAX_CALL_CHARS`` each, in the model's ``syntax``: ``zoo.io.chat_template.tool_call_syntax``); a block that cannot
    be run stays text, for the client to see."""
    calls, kept, at = [], [], 0
    for start, end, call in tool_call_blocks(text, syntax):
        if "error" in call:
            continue
        kept.append(text[at:start])
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)},
            }
        )
        at = end
    if not calls:
        return text, []
    content = ("".join(kept) + text[at:]).strip()
    return content or None, calls
