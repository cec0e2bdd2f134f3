"""Conversations as token ids with a mask of the assistant's tokens: an imported tokenizer's Jinja ``chat_template``
rendered as transformers renders it, or the zoo's default format for its own tokenizers.

A template from a folder is data. It is compiled from a string (no loader: ``{% include %}`` and ``{% import %}``
find nothing) in jinja2's ``ImmutableSandboxedEnvironment`` (no attribute starting with ``_``, no unsafe callables,
no mutation of what it is given), with transformers' environment (``utils/chat_template_utils.py``, plus a bound on
``*`` and ``**``): ``trim_blocks``, ``lstrip_blocks``, the loop controls, a ``{% generation %}`` tag,
``raise_exception``, ``strftime_now``, a JSON ``tojson``, a ``dict`` constructor and a ``namespace`` that refuses
``_`` names. The special
tokens it reads (``bos_token``, ``eos_token``, ``pad_token``) are the tokenizer's; the text is encoded whole without
the tokenizer's own BOS (``add_special_tokens=False``), so the ids are ``apply_chat_template``'s. As there, a
message's text that spells a control token (``<|eot_id|>``) encodes as that token: clean such data beforehand.

A prompt (``add_generation_prompt``) is the whole conversation rendered once and encoded, as
``apply_chat_template(messages, add_generation_prompt=True)`` renders it, whatever the template does to earlier
turns: nothing in a prompt is learned, so no reply need be located in it.

For training, the assistant's tokens are found by rendering prefixes, not by ``{% generation %}`` blocks, which few
templates have: turn i's text is ``render(messages[:i+1])`` after ``render(messages[:i], add_generation_prompt=True)``,
so it is exactly what a model is asked to generate after the template's own prompt (its reply and end-of-turn
token). A token overlapping a reply counts as the reply's, as transformers' ``return_assistant_tokens_mask`` counts
it. Where the template renders each turn as it renders the whole, one sequence holds every reply. One that rewrites
earlier turns as later ones arrive (Qwen3 keeps the reasoning of the replies after the last user turn only) is
trained one reply at a time (``chat_examples``): example i is ``render(messages[:i+1])`` with reply i learned, after
the very prompt it answers at inference. TRL instead swaps in a training template of its own that does not rewrite
(``trl.chat_template_utils.get_training_chat_template``: Qwen3's keeps every reply's reasoning block) and masks
its ``{% generation %}`` blocks; with that template in the folder the zoo gives TRL's ids and mask. A template whose
generation prompt does not begin its rendering of the reply (DeepSeek-R1's ``<think>\\n``, dropped from the reply) is
refused for training, naming TRL's training template as the alternative.

The zoo's own tokenizers (bytes, gpt2, bpe) have no template; a default format is used: each message is
``<|role|>\\n`` + content (+ ``\\n`` after system and user turns) as text, and an assistant turn ends with the EOS
id, which is no text: no token is added, so a model trained on text keeps its vocabulary, and generation stops at
the end of a reply. A character tokenizer is refused: it encodes only the characters of its corpus. An exported folder
states that format as a Jinja template (``DEFAULT_TEMPLATE``, ``template_source``), whose text writes the EOS as
``eos_token``, which the exported tokenizer encodes as the EOS id.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from zoo.errors import InputError
from zoo.io.tokenizers import EOS_TOKEN, CharTokenizer, PretrainedTokenizer
from zoo.io.tool_calls import OPEN, Syntax, check_tool_message_fields, checked_tools, format_tool_call

MAX_TEMPLATE_CHARS = 200_000  # the largest published templates (tool-calling ones) are ~20k characters
# A template is code with a budget: each render may take this many steps (a loop's item, a call, an attribute or
# item read; a conversation of 100 turns through a tool-calling template takes a few thousand) and this many
# seconds, and write this many characters beyond twice the messages' own; past any, one line.
TEMPLATE_STEPS = 1_000_000
TEMPLATE_SECONDS = 5.0
TEMPLATE_EXTRA_CHARS = 2_000_000
ROLES = ("system", "user", "assistant")
TOOL_ROLES = (*ROLES, "tool")  # a conversation with tools: results come back as ``tool`` messages


@dataclass
class Rendered:
    """A conversation's ids, whether each is an assistant token, the ends of its assistant turns (token counts
    at which the ids may be cut without cutting a turn or a token), and its text (the default format writes the
    EOS that ends a reply as ``<|endoftext|>``, which a byte tokenizer has no text for)."""

    ids: list[int]
    mask: list[bool]
    turn_ends: list[int]
    text: str = ""


# -- the budget a render runs on ----------------------------------------------------------------------------------


class PastBudget(Exception):
    """A render spent more than its ``Budget``."""


class Budget:
    """What one render may spend: ``TEMPLATE_STEPS`` steps, ``TEMPLATE_SECONDS`` seconds, and strings of at most
    ``chars`` characters each, ``MADE_PER_CHAR`` times that in all (what ``~``, ``+``, ``*`` and the widening filters
    make, and the output). Counted in the sandbox itself, so it holds on any thread (a serving thread has no
    SIGALRM), and a pure-Python loop is stopped between two steps."""

    def __init__(self, chars: int) -> None:
        self.steps, self.chars, self.made = TEMPLATE_STEPS, chars, MADE_PER_CHAR * chars
        self.deadline = time.monotonic() + TEMPLATE_SECONDS

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise PastBudget(f"more than {TEMPLATE_STEPS} steps (loop items, calls, reads)")
        if time.monotonic() > self.deadline:
            raise PastBudget(f"more than {TEMPLATE_SECONDS} s")

    def room(self, n: int) -> None:
        """Refuses a string (or list) of ``n`` before it is made."""
        self.step()
        self.made -= n
        if n > self.chars or self.made < 0:
            raise PastBudget(f"a string or list of {n} items, past the {self.chars} characters a render may write")


_local = threading.local()
MADE_PER_CHAR = 64  # a template that rebuilds its text as it grows (``ns.text = ns.text ~ ...``) makes it ~turns times


def _budget() -> Budget:
    """This thread's render's budget; outside a render (jinja2 folding constants at compile time) a fresh one."""
    return getattr(_local, "budget", None) or Budget(TEMPLATE_EXTRA_CHARS)


def _wide(fmt: object) -> None:
    """Refuses a format string with a width or precision of 7 digits or more (``'%0999999999d'``)."""
    if isinstance(fmt, str) and re.search(r"\d{7}", fmt):
        raise PastBudget("a format string with a width of 7 digits or more")


def _bounded_filter(fn: Callable) -> Callable:
    """``fn`` (a filter that can widen a string: a width, a count, a join) with its result's size checked first."""

    @functools.wraps(fn)  # keeps jinja2's pass_eval_context mark
    def bounded(*args, **kwargs):
        budget, values = _budget(), [*args, *kwargs.values()]
        for value in values:
            if isinstance(value, int) and not isinstance(value, bool):
                budget.room(abs(value))  # a width, a length
        strings = [v for v in values if isinstance(v, str)]
        if fn.__name__ == "do_format" and strings:
            _wide(strings[0])
        if fn.__name__ == "do_replace" and len(strings) >= 3:
            text, old, new = strings[:3]
            budget.room(len(text) + (text.count(old) if old else len(text) + 1) * len(new))
        if fn.__name__ == "do_join" and isinstance(values[1], (list, tuple)):
            budget.room(sum(len(v) if isinstance(v, str) else 1 for v in values[1]))
        if fn.__name__ == "do_indent" and strings:
            width = next((v for v in values[1:] if isinstance(v, (int, str)) and not isinstance(v, bool)), 4)
            budget.room(
                len(strings[0]) + (strings[0].count("\n") + 1) * (width if isinstance(width, int) else len(width))
            )
        out = fn(*args, **kwargs)
        if isinstance(out, str):
            budget.room(len(out))
        return out

    return bounded


WIDENING_FILTERS = ("center", "format", "indent", "join", "replace", "truncate", "wordwrap")


# -- the Jinja environment, as transformers builds it -------------------------------------------------------------


def _environment():
    import jinja2
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers tracks it; the zoo finds the
        replies by prefixes, so a template with these blocks renders as there)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """transformers' ``TemplateNamespace``: no ``_``-prefixed names stored (a way to reach CPython internals)."""

        def __init__(*args, **kwargs):
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not store {name!r} on a namespace")

    class Dict:
        """transformers' ``TemplateDict``: ``dict(...)`` and ``dict.fromkeys`` without the type itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame):  # ``a ~ b``: joined within the render's characters
            self.write("environment.joined((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Sandbox(ImmutableSandboxedEnvironment):
        """Beyond transformers: each render runs on a budget (``Budget``: steps, seconds, characters), so a loop
        bomb, a recursion that branches or a string that doubles is one line; ``*``, ``+``, ``~``, ``**`` and the
        filters that widen a string are bounded before they allocate."""

        code_generator_class = Generator
        intercepted_binops = frozenset(["*", "**", "+"])

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(jinja2.nodes.For):  # each item a loop takes is a step
                counted = jinja2.nodes.EnvironmentAttribute("counted")  # no template can name or replace it
                loop.iter = jinja2.nodes.Call(counted, [loop.iter], [], None, None, lineno=loop.lineno)
            return tree

        def counted(self, iterable):
            for item in iterable:
                _budget().step()
                yield item

        def joined(self, parts):
            parts = [str(p) for p in parts]
            _budget().room(sum(map(len, parts)))
            return "".join(parts)

        def call(__self, __context, __obj, *args, **kwargs):  # jinja2's own signature
            _budget().step()
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj, attribute):
            _budget().step()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _budget().step()
            return super().getitem(obj, argument)

        def wrap_str_format(self, value):  # ``'{:0999999999}'.format(1)``: refused as the method is read
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:
                _wide(value.__self__)
            return wrapped

        def call_binop(self, context, operator, left, right):
            budget = _budget()
            budget.step()
            sized = [v for v in (left, right) if isinstance(v, (str, list, tuple))]
            counts = [v for v in (left, right) if isinstance(v, int) and not isinstance(v, bool)]
            if operator == "*" and sized and counts:
                budget.room(len(sized[0]) * counts[0])
            if operator == "+" and len(sized) == 2:
                budget.room(len(left) + len(right))
            if operator == "**" and isinstance(right, int) and abs(right) > 64:
                raise jinja2.exceptions.SecurityError("a power past the bound of 64")
            return super().call_binop(context, operator, left, right)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.filters |= {name: _bounded_filter(env.filters[name]) for name in WIDENING_FILTERS}
    env.globals |= {
        "raise_exception": raise_exception,
        "strftime_now": lambda fmt: datetime.now().strftime(fmt),
        "dict": Dict(),
        "namespace": Namespace,
    }
    return env


@lru_cache(maxsize=8)
def compile_template(source: str):
    """The compiled template (cached: a datamodule renders every conversation with one); refused in one line when
    it is not a string, too large or not Jinja."""
    import jinja2

    if not isinstance(source, str):
        raise InputError(f"the chat_template is a {type(source).__name__}, not a string (a named list is not read)")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise InputError(f"the chat_template has {len(source)} characters, over the {MAX_TEMPLATE_CHARS} read")
    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as err:
        raise InputError(f"the chat_template is not a Jinja template jinja2 compiles ({err})") from None


def render(
    source: str,
    messages: list[dict],
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
    **special: str,
) -> str:
    """``source`` rendered for ``messages`` (and ``tools``: JSON function specs, as ``apply_chat_template(tools=)``
    hands them to the template) on a ``Budget``; a template error, a sandbox refusal or a budget spent is one line."""
    import jinja2

    content = sum(len(c) for m in messages if isinstance(m, dict) and isinstance(c := m.get("content"), str))
    calls = [m["tool_calls"] for m in messages if isinstance(m, dict) and m.get("tool_calls")]
    if tools or calls:  # rendered too, through tojson
        content += len(json.dumps([tools, calls], default=str))
    _local.budget = budget = Budget(2 * content + TEMPLATE_EXTRA_CHARS)
    try:
        pieces = compile_template(source).generate(
            messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **special
        )
        out = []
        for piece in pieces:
            budget.room(len(piece))
            out.append(piece)
        return "".join(out)
    except PastBudget as err:
        raise InputError(
            f"the chat_template ran past its budget: {err} (a loop or a string without bound); the zoo renders a "
            f"template within {TEMPLATE_STEPS} steps and {TEMPLATE_SECONDS} s"
        ) from None
    except jinja2.exceptions.SecurityError as err:
        raise InputError(f"the chat_template tried what the sandbox refuses ({err})") from None
    except Exception as err:  # a template is data: whatever it raises is a refusal, not a crash
        raise InputError(f"the chat_template failed to render ({type(err).__name__}: {err})") from None
    finally:
        _local.budget = None


# -- a tokenizer's conversations ----------------------------------------------------------------------------------


def checked_messages(messages: object, tools: bool = False) -> list[dict]:
    """``messages`` when it is a conversation in OpenAI's format: a non-empty list of objects of exactly ``role``
    (one of ROLES) and ``content`` (a string); with ``tools``, also ``tool`` messages (``name``, ``tool_call_id``)
    and assistant ``tool_calls`` (``zoo.io.tool_calls.check_tool_message_fields``); else one InputError saying what
    is wrong."""
    roles = TOOL_ROLES if tools else ROLES
    if not isinstance(messages, list) or not messages:
        raise InputError("has 'messages' that is not a non-empty list")
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InputError(f"message {k} is not an object of exactly 'role' and 'content'")
        if missing := [f for f in ("role", "content") if m.get(f) is None]:
            raise InputError(f'message {k} has no {missing[0]!r}: send {{"role": ..., "content": "..."}}')
        if not tools and (extra := sorted(set(m) - {"role", "content"}, key=str)):
            raise InputError(f"message {k} has {extra[0]!r}: a message is an object of exactly 'role' and 'content'")
        if m["role"] not in roles:
            raise InputError(f"message {k} has the role {m['role']!r}, not one of {', '.join(roles)}")
        if tools:
            check_tool_message_fields(m, k)
        if not isinstance(m["content"], str):
            raise InputError(f"message {k} has a {type(m['content']).__name__} content, not a string")
    return messages


def chat_renderer(tokenizer: Any) -> Callable[..., Rendered]:
    """``render(messages, add_generation_prompt, tools=None)`` for ``tokenizer``: its chat template if it has one (an
    imported folder's), else the default format; a character tokenizer is refused. ``tools`` (OpenAI function
    specs) are checked (``zoo.io.tool_calls.checked_tools``) and rendered as the template renders them."""
    if getattr(tokenizer, "chat_template", None) is not None:
        return lambda messages, prompt=False, tools=None: _templated(tokenizer, messages, prompt, checked_tools(tools))
    if isinstance(tokenizer, CharTokenizer):
        raise InputError(
            "a character tokenizer encodes only the characters of the corpus it was fitted on: chat data needs "
            "tokenizer bytes, gpt2 or pretrained (an imported folder's, with its chat template)"
        )
    if isinstance(tokenizer, PretrainedTokenizer):
        raise InputError("the imported tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)")
    return lambda messages, prompt=False, tools=None: _default(tokenizer, messages, prompt, checked_tools(tools))


def _special(tokenizer) -> dict[str, str]:
    return {f"{name}_token": tok for name, tok in tokenizer.special.items() if tok}


class RewritesEarlierTurns(InputError):
    """The template renders an assistant turn otherwise once later turns follow (Qwen3 drops the reasoning of replies
    before the last user turn), so one sequence cannot hold every reply as it was generated."""


def _templated(tokenizer, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None) -> Rendered:
    source, special = tokenizer.chat_template, _special(tokenizer)
    text = render(source, messages, add_generation_prompt, tools, **special)
    if add_generation_prompt:  # a prompt: context only, so no reply need be located in it, whatever the template
        ids = tokenizer.hf.encode(text, add_special_tokens=False).ids
        return Rendered(ids, [False] * len(ids), [], text)
    spans = []
    for i in _replies(messages):
        through, start = _reply(source, special, messages, i, tools)
        if not text.startswith(through):
            raise RewritesEarlierTurns(
                "the chat_template renders a conversation's first turns differently once more follow (it rewrites "
                "earlier turns), so its replies are not all in one sequence; ChatDataModule trains such a "
                "conversation one reply at a time"
            )
        spans.append((start, len(through)))
    return _encoded(tokenizer, text, spans)


def _replies(messages: list[dict]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def _reply(
    source: str, special: dict[str, str], messages: list[dict], i: int, tools: list[dict] | None = None
) -> tuple[str, int]:
    """``render(messages[:i+1])`` and where reply i begins in it: after ``render(messages[:i])``'s generation prompt,
    so its text is what a model is asked to generate there. Refused where that prompt is not where the rendering of
    the reply begins (a prompt that opens the reply, as DeepSeek-R1's ``<think>\\n``, which its reply drops)."""
    before = render(source, messages[:i], True, tools, **special)
    through = render(source, messages[: i + 1], False, tools, **special)
    if not through.startswith(before):
        raise InputError(
            f"the chat_template's rendering of a reply does not begin with its generation prompt (the prompt ends "
            f"{before[-40:]!r}, the reply reads {through[max(0, len(before) - 40) : len(before) + 20]!r}; "
            f"DeepSeek-R1's prompt opens the reply with '<think>\\n' and its reply drops it), so what the model "
            f"generates after the prompt is unknown; train with a template whose replies continue its prompt (TRL's "
            f"training template for it, e.g. trl/chat_templates/deepseek_r1_distill_training.jinja, as the folder's "
            f"chat_template)"
        )
    return through, len(before)


def _encoded(tokenizer, text: str, spans: list[tuple[int, int]]) -> Rendered:
    """``text`` encoded, each token overlapping a span learned, the spans' ends as token counts."""
    enc = tokenizer.hf.encode(text, add_special_tokens=False)
    return Rendered(enc.ids, _overlapping(enc.offsets, spans), _token_ends(enc.offsets, [e for _, e in spans]), text)


def chat_examples(tokenizer: Any) -> Callable[..., list[Rendered]]:
    """``examples(messages, tools=None)``: the conversation as supervised examples, each a ``Rendered`` whose mask
    is the replies it teaches. One sequence with every reply where the template renders each turn as it renders the
    whole (every template but those that rewrite earlier turns); else one example per assistant turn i, the
    template's rendering of ``messages[:i+1]`` with reply i learned and the replies before it context, as the
    template shows them to the model at that point (so each reply is learned after the very prompt it answers at
    inference)."""
    whole = chat_renderer(tokenizer)
    if getattr(tokenizer, "chat_template", None) is None:
        return lambda messages, tools=None: [whole(messages, False, tools)]
    source, special = tokenizer.chat_template, _special(tokenizer)

    def examples(messages: list[dict], tools: list[dict] | None = None) -> list[Rendered]:
        try:
            return [whole(messages, False, tools)]
        except RewritesEarlierTurns:
            pass
        out = []
        for i in _replies(messages):
            through, start = _reply(source, special, messages, i, checked_tools(tools))
            out.append(_encoded(tokenizer, through, [(start, len(through))]))
        return out

    return examples


def _overlapping(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """Whether each token (character offsets) overlaps a span: transformers' assistant-mask rule."""
    return [any(start < e and end > s for s, e in spans) for start, end in offsets]


def _token_ends(offsets: list[tuple[int, int]], ends: list[int]) -> list[int]:
    """For each character position in ``ends`` where a token ends, the number of tokens up to it."""
    count = {end: k + 1 for k, (_, end) in enumerate(offsets)}  # last token ending there (an empty one may follow)
    return [count[e] for e in ends if e in count]


# The default format as a template (trim_blocks drops a newline right after a tag: each newline is an expression).
# Tools, when given, open the text as ``<|tools|>`` and one line per tool, ``name(arg, ...): description``; an
# assistant's ``tool_calls`` follow its content as the text a model writes for them (``format_tool_call``).
DEFAULT_TEMPLATE = (
    "{% if tools %}{{ '<|tools|>\\n' }}{% for tool in tools %}{% set f = tool['function'] %}"
    "{{ f['name'] + '(' + f.get('parameters', {}).get('properties', {})|join(', ') + ')' }}"
    "{% if f.get('description') %}{{ ': ' + f['description'] }}{% endif %}{{ '\\n' }}{% endfor %}{% endif %}"
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% for call in message.get('tool_calls', []) %}{{ '<tool_call>' + {'name': call['function']['name'], "
    "'arguments': call['function']['arguments']}|tojson + '</tool_call>' }}{% endfor %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def tool_lines(tools: list[dict] | None) -> str:
    """The default format's block of tools: ``<|tools|>`` and ``name(arg, ...): description`` a line each."""
    if not tools:
        return ""
    lines = []
    for tool in tools:
        f = tool["function"]
        description = f": {f['description']}" if f.get("description") else ""
        lines.append(f"{f['name']}({', '.join(f.get('parameters', {}).get('properties', {}))}){description}\n")
    return "<|tools|>\n" + "".join(lines)


def _content(m: dict) -> str:
    """A message's text in the default format: its content, then its tool calls as the model writes them."""
    calls = m.get("tool_calls", [])
    return m["content"] + "".join(format_tool_call(c["function"]["name"], c["function"]["arguments"]) for c in calls)


def template_source(tokenizer: Any) -> Any:
    """The chat template ``tokenizer``'s conversations render as, for an exported folder's tokenizer_config.json: its
    own, or the default format's; None where ``chat_renderer`` refuses conversations."""
    if getattr(tokenizer, "chat_template", None) is not None:
        return tokenizer.chat_template
    if isinstance(tokenizer, (CharTokenizer, PretrainedTokenizer)):
        return None
    return DEFAULT_TEMPLATE


def _default(tokenizer, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> Rendered:
    text: list[str] = [tool_lines(tools)]
    ids: list[int] = tokenizer.encode(text[0]) if tools else []
    mask: list[bool] = [False] * len(ids)
    ends: list[int] = []
    for m in messages:
        header = tokenizer.encode(f"<|{m['role']}|>\n")
        ids += header
        mask += [False] * len(header)
        if m["role"] == "assistant":
            reply = tokenizer.encode(_content(m)) + [tokenizer.eos_id]
            ids += reply
            mask += [True] * len(reply)
            ends.append(len(ids))
            text += [f"<|{m['role']}|>\n", _content(m), EOS_TOKEN]
        else:
            body = tokenizer.encode(_content(m) + "\n")
            ids += body
            mask += [False] * len(body)
            text += [f"<|{m['role']}|>\n", _content(m) + "\n"]
    if add_generation_prompt:
        ids += tokenizer.encode("<|assistant|>\n")
        mask += [False] * (len(ids) - len(mask))
        text.append("<|assistant|>\n")
    return Rendered(ids, mask, ends, "".join(text))


# -- how a template's model writes a tool call ----------------------------------------------------------------------

PROBE = "zoo_probe"  # the function a template is shown calling, to see its syntax


def tool_call_syntax(tokenizer: Any) -> Syntax:
    """How ``tokenizer``'s model writes a call, read off what its chat template renders for one: "json" where the
    template writes it as a bare JSON object (Llama 3.1's, 3.2's), else "hermes" (the zoo's default format, Qwen2.5's
    and Hermes' tags, a template that renders no calls)."""
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str):
        return "hermes"
    special = tuple(sorted((f"{k}_token", v) for k, v in getattr(tokenizer, "special", {}).items() if v))
    return _template_syntax(source, special)


@functools.lru_cache(maxsize=16)
def _template_syntax(source: str, special: tuple[tuple[str, str], ...]) -> Syntax:
    call = {"type": "function", "function": {"name": PROBE, "arguments": {"n": 1}}}
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        text = render(source, messages, **dict(special))
    except InputError:  # a template that refuses calls renders none: the zoo's syntax is the one read
        return "hermes"
    if OPEN not in text and re.search(r'\{\s*"name"\s*:\s*"' + PROBE + r'"\s*,\s*"parameters"', text):
        return "json"
    return "hermes"
