"""Tool calls: the parser's bounds, the zoo's own syntax, and conversations with tools rendered as transformers'
``apply_chat_template`` renders them (Qwen2.5's and Llama 3.1's published templates; the zoo's default format as
its exported folder's template)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo.errors import InputError
from zoo.io import hf_tokenizer
from zoo.io.chat_template import chat_examples, chat_renderer, checked_messages, template_source
from zoo.io.tokenizers import ByteTokenizer
from zoo.io.tool_calls import MAX_CALL_CHARS, MAX_TOOL_CALLS, checked_tools, format_tool_call, parse_tool_calls

TEMPLATES = Path(__file__).parent / "templates"
CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# One call a reply (Llama 3.1 takes no more), a reply with text before its call, two tool turns in a row (Qwen2.5
# joins them in one user turn), non-ASCII arguments, and a system prompt.
TOOL_CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 37 + 12 * 45, and the weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [call("calculator", expression="37 + 12 * 45")]},
    {"role": "tool", "name": "calculator", "content": "= 577"},
    {"role": "assistant", "content": "Now the weather.", "tool_calls": [call("get_weather", city="Zürich", days=2)]},
    {"role": "tool", "name": "get_weather", "content": "mon 12"},
    {"role": "tool", "name": "get_weather", "content": "tue 14"},
    {"role": "assistant", "content": "577; 12 then 14 °C."},
]


# -- the parser ---------------------------------------------------------------------------------------------------


def test_a_call_parses_back_to_its_name_and_arguments_in_the_zoos_syntax_and_qwens():
    arguments = {"expression": "(2 + 3) * -4", "note": "é </tool_call"[:5]}
    text = "Let me compute. " + format_tool_call("calculator", arguments) + " then " + format_tool_call("f", {})
    assert parse_tool_calls(text) == [{"name": "calculator", "arguments": arguments}, {"name": "f", "arguments": {}}]
    qwen = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    assert parse_tool_calls(qwen) == [{"name": "get_weather", "arguments": {"city": "Zürich"}}]
    assert parse_tool_calls("Answer: 5") == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("<tool_call>{not json}</tool_call>", "not JSON"),
        ('<tool_call>{"name": "f"}</tool_call>', 'exactly "name" and "arguments"'),
        ('<tool_call>{"name": "f", "arguments": {}, "x": 1}</tool_call>', 'exactly "name" and "arguments"'),
        ('<tool_call>["f", {}]</tool_call>', 'exactly "name" and "arguments"'),
        ('<tool_call>{"name": "f", "arguments": "{}"}</tool_call>', "not a JSON object"),
        ('<tool_call>{"name": "os.system; rm", "arguments": {}}</tool_call>', "not a function name"),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', "not a function name"),
        ('<tool_call>{"name": "f", "arguments": {}}', "without its </tool_call>"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", f"over the {MAX_CALL_CHARS}"),
        ("<tool_call>" + "[" * (MAX_CALL_CHARS - 1) + "</tool_call>", "not JSON"),  # deep, not long: no crash
    ],
)
def test_a_call_that_cannot_run_is_an_error_entry_never_an_exception(text, why):
    (entry,) = parse_tool_calls(text)
    assert why in entry["error"]


def test_a_reply_runs_at_most_max_tool_calls_and_says_the_rest_were_not():
    text = format_tool_call("f", {"i": 1}) * (MAX_TOOL_CALLS + 3)
    calls = parse_tool_calls(text)
    assert len(calls) == MAX_TOOL_CALLS + 1 and all("error" not in c for c in calls[:-1])
    assert "not run" in calls[-1]["error"]
    assert len(parse_tool_calls(format_tool_call("f", {}) * MAX_TOOL_CALLS)) == MAX_TOOL_CALLS


@pytest.mark.parametrize(
    ("tools", "why"),
    [
        ({"type": "function"}, "not a list"),
        ([{"type": "function", "function": {"name": "f"}, "extra": 1}], "is not"),
        ([{"function": {"name": "f"}}], "is not"),
        ([{"type": "function", "function": {"name": "no spaces"}}], "no function name"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], "not a JSON schema"),
        ([{"type": "function", "function": {"name": "f", "description": "x" * 20_000}}], "characters of JSON"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"default": object()}}}], "is not JSON"),
    ],
)
def test_tools_that_are_not_function_specs_are_refused_in_one_line(tools, why):
    with pytest.raises(InputError, match=why):
        checked_tools(tools)


def test_tool_messages_are_read_only_in_a_conversation_with_tools():
    with pytest.raises(InputError, match="role 'tool'"):
        checked_messages([{"role": "tool", "content": "577"}])
    with pytest.raises(InputError, match="'tool_calls'"):
        checked_messages(TOOL_CHAT[:3])
    assert checked_messages(TOOL_CHAT, tools=True) is TOOL_CHAT
    for bad, why in (
        ({"role": "user", "content": "x", "tool_calls": []}, "does not carry"),
        ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}, "not"),
        ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": "f"}]}, "not"),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("f") | {"function": {"name": "f", "arguments": "{}"}}],
            },
            "not a JSON string",
        ),
        ({"role": "tool", "content": "x", "name": 3}, "not a string"),
    ):
        with pytest.raises(InputError, match=why):
            checked_messages([bad], tools=True)


# -- rendering, as transformers renders -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from test_chat import write_tokenizer

    pytest.importorskip("transformers")
    return write_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"))


def _with_template(folder, template: str):
    import transformers
    from test_chat import _with_template as with_template

    del transformers
    return with_template(folder, template)


@pytest.mark.parametrize("name", ["qwen2.5_instruct", "llama3.1_instruct"])
@pytest.mark.parametrize("tools", [[CALC, WEATHER], [WEATHER], None], ids=["two_tools", "one_tool", "no_tools"])
def test_a_conversation_with_tools_has_transformers_ids_through_a_published_template(tokenizer_dir, name, tools):
    ours, theirs = _with_template(tokenizer_dir, (TEMPLATES / f"{name}.jinja").read_text())
    render = chat_renderer(ours)
    for end, prompt in ((len(TOOL_CHAT), False), (4, True), (7, True), (3, False), (2, True)):
        messages = TOOL_CHAT[:end]
        expected = theirs.apply_chat_template(messages, tools=tools, add_generation_prompt=prompt, return_dict=False)
        assert render(messages, prompt, tools).ids == expected, (name, end, prompt)


@pytest.mark.parametrize("name", ["qwen2.5_instruct", "llama3.1_instruct"])
def test_tool_results_are_context_and_each_reply_with_its_call_is_learned(tokenizer_dir, name):
    ours, _ = _with_template(tokenizer_dir, (TEMPLATES / f"{name}.jinja").read_text())
    (example,) = chat_examples(ours)(TOOL_CHAT, [CALC, WEATHER])
    learned = ours.hf.decode([i for i, m in zip(example.ids, example.mask) if m], skip_special_tokens=False)
    assert "37 + 12 * 45" in learned and "Zürich" in learned and "577; 12 then 14" in learned
    assert not any(result in learned for result in ("= 577", "mon 12", "tue 14", "tool_response", "ipython"))
    assert ("Now the weather." in learned) == (name == "qwen2.5_instruct")  # Llama 3.1's drops a call's text
    assert "Evaluate arithmetic" not in learned and "terse" not in learned and len(example.turn_ends) == 3


@pytest.fixture(scope="module")
def exported_bytes(tmp_path_factory):
    """A byte tokenizer's exported folder: the zoo's default format as its chat template, read by transformers."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("bytes_folder")
    ours = ByteTokenizer()
    hf_tokenizer.to_folder(ours, folder, template_source(ours), 64)
    return ours, transformers.AutoTokenizer.from_pretrained(folder)


def test_the_default_format_with_tools_is_its_exported_templates_and_masks_the_tool_turns(exported_bytes):
    ours, theirs = exported_bytes
    for tools in ([CALC, WEATHER], [{"type": "function", "function": {"name": "now"}}], None):
        for end, prompt in ((len(TOOL_CHAT), False), (4, True), (2, True)):
            expected = theirs.apply_chat_template(
                TOOL_CHAT[:end], tools=tools, add_generation_prompt=prompt, return_dict=False
            )
            assert chat_renderer(ours)(TOOL_CHAT[:end], prompt, tools).ids == expected
    rendered = chat_renderer(ours)(TOOL_CHAT, False, [CALC])
    assert rendered.text.startswith("<|tools|>\ncalculator(expression): Evaluate arithmetic.\n<|system|>\n")
    learned = ours.decode([i for i, m in zip(rendered.ids, rendered.mask) if m])
    expected = (
        format_tool_call("calculator", {"expression": "37 + 12 * 45"})
        + "Now the weather."
        + format_tool_call("get_weather", {"city": "Zürich", "days": 2})
        + "577; 12 then 14 °C."
    )
    assert learned == expected  # the replies and their calls, as a model writes them; no tool result, no header


def test_a_call_as_text_and_as_tool_calls_render_alike_in_the_zoos_format():
    from zoo.gpt.tune.envs.scripted import structured

    raw = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "Sure. " + format_tool_call("calculator", {"expression": "2+3"})},
        {"role": "tool", "name": "calculator", "content": "5"},
        {"role": "assistant", "content": "Answer: 5"},
    ]
    parsed = structured(raw)
    assert parsed[1] == {"role": "assistant", "content": "Sure. ", "tool_calls": [call("calculator", expression="2+3")]}
    render = chat_renderer(ByteTokenizer())
    assert render(raw, False, [CALC]).ids == render(parsed, False, [CALC]).ids
    assert json.loads(json.dumps(parsed)) == parsed
