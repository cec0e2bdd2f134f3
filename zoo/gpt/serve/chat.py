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
from zoo.io.tool_calls import OPEN, Syntax, tool_call_blocks


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


def _call(call: dict) -> dict:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)},
    }


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
        calls.append(_call(call))
        at = end
    if not calls:
        return text, []
    content = ("".join(kept) + text[at:]).strip()
    return content or None, calls


class ToolCallStream:
    """A streamed chat choice's text, tools offered, as OpenAI's stream deltas: the text as it comes until a tool
    call opens (holding back only what may be the start of ``<tool_call>``, and trailing whitespace, which the whole
    answer strips before a call), then each call as a ``tool_calls`` delta once its block closes; ``end`` sends what
    is left. The deltas add up to the whole answer's ``content`` and ``tool_calls`` (``tool_calls`` above). A model
    whose template writes Llama 3's bare JSON (``syntax="json"``) may open its reply with a call that no tag
    announces: its text is held and sent at the end."""

    def __init__(self, syntax: Syntax = "hermes") -> None:
        self.syntax = syntax
        self.text = ""  # every piece so far
        self.sent = ""  # the content sent: a beginning of text
        self.opened = False  # a call tag has opened: the rest is held until it is read
        self.calls = 0  # calls sent

    def push(self, piece: str) -> list[dict]:
        self.text += piece
        if self.syntax != "hermes":
            return []
        if not self.opened:
            at = self.text.find(OPEN)
            self.opened = at >= 0
            return self._content(self.text[:at].rstrip() if self.opened else self.text[: len(self.text) - self._held()])
        deltas = []
        valid = [call for _, _, call in tool_call_blocks(self.text) if "error" not in call]
        for k in range(self.calls, len(valid)):  # a block is a call once it closes (an open one is an error entry)
            deltas.append({"tool_calls": [{"index": k} | _call(valid[k])]})
        self.calls += len(deltas)
        return deltas

    def end(self) -> tuple[list[dict], bool]:
        """The last deltas, and whether the choice made calls (its finish reason is then "tool_calls")."""
        deltas = self.push("")
        content, calls = tool_calls(self.text, self.syntax)
        if not calls:
            return deltas + self._content(self.text), False
        deltas += self._content(content) if content and content.startswith(self.sent) else []
        return deltas, True

    def _content(self, upto: str) -> list[dict]:
        if len(upto) <= len(self.sent):
            return []
        piece, self.sent = upto[len(self.sent) :], upto
        return [{"content": piece}]

    def _held(self) -> int:
        """The end of the text held back: a beginning of the call tag, and the whitespace before it."""
        text = self.text
        k = max((k for k in range(min(len(OPEN) - 1, len(text)), 0, -1) if text.endswith(OPEN[:k])), default=0)
        base = text[: len(text) - k]
        return k + len(base) - len(base.rstrip())
