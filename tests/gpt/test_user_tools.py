"""Tools named in the user's YAML (``zoo.gpt.tune.envs.tools``): their specs as transformers' ``get_json_schema``
writes them, run by an environment with its limits, refused in one line where they are no tool, dropped from a stored
config; a tool that loops past its deadline off the main thread stopped; Llama 3's bare-JSON calls read where the
model's template writes them so."""

from __future__ import annotations

import enum
import json
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import pytest

from zoo.errors import InputError
from zoo.gpt.tune.envs import CalculatorEnv
from zoo.gpt.tune.envs.tools import function_spec, resolve_tool, resolve_tools, with_tools
from zoo.gpt.tune.episodes import EnvSource, scaffold_for
from zoo.io.chat_template import tool_call_syntax
from zoo.io.tool_calls import MAX_CALL_CHARS, MAX_TOOL_CALLS, format_tool_call, parse_tool_calls

TEMPLATES = Path(__file__).parent / "templates"
USER_TOOLS = '''
    from typing import Literal

    from zoo.gpt.tune.envs import ToolError

    CITIES = {"paris": 12, "oslo": -3}


    def temperature(city: str, unit: Literal["c", "f"] = "c") -> str:
        """The temperature in a city now.

        Args:
            city: The city, in lower case.
            unit: Celsius or Fahrenheit.
        """
        if city not in CITIES:
            raise ToolError(f"no city {city!r}")
        return f"{CITIES[city] if unit == 'c' else CITIES[city] * 9 / 5 + 32} {unit}"


    def count(items: list[int]) -> int:
        """How many items there are.

        Args:
            items: The items.
        """
        return len(items)


    def boom(x: int) -> str:
        """Raises.

        Args:
            x: Anything.
        """
        raise RuntimeError("boom")


    def spin(x: int) -> str:
        """Loops in Python for good.

        Args:
            x: Anything.
        """
        while True:
            x += 1


    def flood(x: int) -> str:
        """Returns megabytes.

        Args:
            x: Anything.
        """
        return "x" * 10_000_000


    def calculator(expression: str) -> str:
        """A second calculator.

        Args:
            expression: Arithmetic.
        """
        return "0"


    def undescribed(x: int) -> str:
        """Says nothing of x."""


    def untyped(x) -> str:
        """Untyped.

        Args:
            x: Something.
        """


    def starred(*xs: int) -> str:
        """Takes any number.

        Args:
            xs: Numbers.
        """


    def undocumented(x: int) -> str:
        return ""


    NOT_A_FUNCTION = 3
'''


@pytest.fixture(scope="module")
def user_tools(tmp_path_factory):
    """``usertools``, a module of the user's on the path, and ``usersentinel``, whose import would be seen."""
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "usertools.py").write_text(textwrap.dedent(USER_TOOLS))
    (folder / "usersentinel.py").write_text("def f(x: int) -> str:\n    '''F.\n\n    Args:\n        x: X.\n    '''\n")
    sys.path.insert(0, str(folder))
    yield "usertools"
    sys.path.remove(str(folder))
    for name in ("usertools", "usersentinel"):
        sys.modules.pop(name, None)


# -- the spec --------------------------------------------------------------------------------------------------------


class Unit(enum.Enum):
    C = "c"
    F = "f"


def weather(city: str, days: int = 1, unit: Literal["c", "f"] = "c", tags: list[str] | None = None) -> str:
    """The weather in a city.

    Said over two lines.

    Args:
        city: The city, spelled as its
            people spell it.
        days (int): How many days ahead.
        unit: The unit (choices: ["c", "f"])
        tags: Free tags.

    Returns:
        A line per day.
    """


def mixed(a: float, b: dict[str, int], c: tuple[int, str], d: Unit, e: int | str | None, f: list[list[float]] | str):
    """Every kind of argument.

    Args:
        a: A number.
        b: Counts by name.
        c: A pair.
        d: A unit.
        e: An id or a name, or none.
        f: A matrix or its name.
    """


def bare(flag: bool = False, anything: dict | None = None) -> int:
    """No return description.

    Args:
        flag: A flag.
        anything: A mapping.
    """


@pytest.mark.parametrize("fn", [weather, mixed, bare])
def test_a_functions_spec_is_what_transformers_get_json_schema_writes(fn):
    transformers = pytest.importorskip("transformers")
    expected = transformers.utils.get_json_schema(fn)
    assert function_spec(fn) == expected
    assert json.dumps(function_spec(fn)) == json.dumps(expected)  # key order too: a template renders it with tojson


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("usertools.undescribed", "does not describe the argument 'x'"),
        ("usertools.untyped", "'x' has no type annotation"),
        ("usertools.starred", r"takes \*args"),
        ("usertools.undocumented", "has no docstring"),
        ("usertools.NOT_A_FUNCTION", "is a int, not a function"),
        ("usertools.missing", "usertools has no missing"),
        ("no_such_package.tools.f", "no module of no_such_package.tools.f can be imported"),
        ("not a path", "not a dotted path"),
        ("builtins.print", "is a builtin_function_or_method"),
    ],
)
def test_a_path_that_names_no_tool_is_refused_in_one_line(user_tools, path, why):
    with pytest.raises(InputError, match=why):
        resolve_tool(path)


def test_tools_are_refused_past_their_count_or_sharing_a_name(user_tools):
    with pytest.raises(InputError, match="at most 16"):
        resolve_tools(["usertools.count"] * 17)
    with pytest.raises(InputError, match="two tools are named 'calculator'"):
        with_tools(CalculatorEnv(), ["usertools.calculator"])
    with pytest.raises(InputError, match="no text environment"):
        import gymnasium as gym

        with_tools(gym.make("CartPole-v1"), ["usertools.count"])


# -- run by the environment ------------------------------------------------------------------------------------------


def call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


def test_a_named_tool_runs_beside_the_envs_own_and_a_wrong_call_is_an_error_message(user_tools):
    env = EnvSource("zoo/Calculator-v0", {"tool_timeout": 0.5}, ["usertools.temperature", "usertools.count"]).make()
    assert [t["function"]["name"] for t in env.unwrapped.tools] == ["calculator", "temperature", "count"]
    env.reset(seed=0)
    reply = "".join(
        [
            call("temperature", city="oslo", unit="f"),
            call("count", items=[1, 2, 3]),
            call("calculator", expression="2*3"),
            call("temperature", city="lyon"),  # the tool's own refusal
            call("temperature", city="oslo", unit="k"),  # not one of the choices
            call("count", items=[1, "2"]),  # an item of the wrong type
            call("temperature"),
            call("count", items=[], extra=1),
        ]
    )
    observation, reward, terminated, truncated, info = env.step(reply)
    assert [m["content"] for m in observation] == [
        "26.6 f",
        "3",  # an int result is its JSON
        "6",
        "error: no city 'lyon'",
        'error: temperature\'s argument \'unit\' is not one of ["c", "f"]',
        "error: count's argument 'items' is not an array",
        "error: temperature needs the argument 'city'",
        "error: count takes no argument 'extra' (it takes items)",
    ]
    assert (reward, terminated, truncated, info["tool_calls"]) == (0.0, False, False, 8)
    observation = env.step(call("count", items=[True]))[0]  # a boolean is no integer in JSON
    assert observation[0]["content"] == "error: count's argument 'items' is not an array"


@pytest.mark.parametrize(
    ("tool", "reason"),
    [("boom", "raised RuntimeError: boom"), ("spin", "ran past its 0.2 s"), ("flood", "returned 10000000 characters")],
)
@pytest.mark.parametrize("main", [True, False], ids=["main_thread", "worker_thread"])
def test_a_named_tool_that_fails_ends_the_episode_never_the_run_on_any_thread(
    user_tools, tool, reason, main, monkeypatch
):
    raised = []
    monkeypatch.setattr(threading, "excepthook", raised.append)  # the stopped thread ends without a traceback
    env = with_tools(CalculatorEnv(tool_timeout=0.2), [f"usertools.{tool}"])
    env.reset(seed=0)
    out, before = {}, set(threading.enumerate())
    step = lambda: out.update(step=env.step(call(tool, x=1)))  # noqa: E731
    start = time.monotonic()
    if main:
        step()
    else:
        worker = threading.Thread(target=step)
        worker.start()
        worker.join(5)
    assert time.monotonic() - start < 2
    observation, reward, terminated, truncated, info = out["step"]
    assert (observation, reward, terminated, truncated) == ([], 0.0, False, True) and reason in info["failure"]
    deadline = time.monotonic() + 2  # the looping tool's thread is stopped, not left spinning beside the run
    while time.monotonic() < deadline and set(threading.enumerate()) - before:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - before and not raised


def test_a_stopped_run_says_which_named_tool_failed_off_the_main_thread(user_tools):
    env = with_tools(CalculatorEnv(tool_timeout=0.2, on_tool_error="stop"), ["usertools.spin"])
    env.reset(seed=0)
    out = {}

    def step():
        try:
            env.step(call("spin", x=1))
        except InputError as err:
            out["error"] = str(err)

    worker = threading.Thread(target=step)
    worker.start()
    worker.join(5)
    assert out["error"].startswith("a tool failed: spin ran past its 0.2 s")


# -- a stored config names no code ---------------------------------------------------------------------------------


def test_a_stored_configs_tools_are_dropped_and_its_test_run_refused_until_given_again(user_tools, tmp_path, capsys):
    import torch

    import zoo
    from zoo.app.stored_config import from_checkpoint

    ckpt = tmp_path / "episodes.ckpt"
    data = {"_class_path": "datamodules.EpisodeDataModule", "env_id": "zoo/Calculator-v0", "test_seeds": 4}
    net = {"class_path": "zoo.gpt.GPT", "init_args": {"vocab_size": 260, "block_size": 32, "n_layer": 1}}
    model = {"_class_path": "zoo.gpt.GRPOModule", "_zoo_version": zoo.__version__, "net": net}
    stored = data | {"tools": ["usersentinel.f"]}
    torch.save({"hyper_parameters": model, "datamodule_hyper_parameters": stored, "state_dict": {}}, ckpt)
    with pytest.raises(SystemExit) as refused:
        from_checkpoint(["test", "--ckpt_path", str(ckpt)])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("error: ") and 'tools: ["usersentinel.f"]' in line and "--data.init_args.tools=" in line
    assert "usersentinel" not in sys.modules  # named, never imported
    out = from_checkpoint(["test", "--ckpt_path", str(ckpt), '--data.init_args.tools=["usertools.count"]'])
    built = out.data()
    assert built.env.tools == ["usertools.count"] and "usersentinel" not in sys.modules
    assert "replace its data.init_args.tools" in capsys.readouterr().err
    without = from_checkpoint(["test", "--ckpt_path", str(ckpt), "--data.init_args.tools=[]"])  # said: none
    assert without.data().env.tools is None
    torch.save({"hyper_parameters": model, "datamodule_hyper_parameters": data, "state_dict": {}}, ckpt)
    assert from_checkpoint(["test", "--ckpt_path", str(ckpt)]).data().env.tools is None  # none stored: none asked


# -- Llama 3's calls: bare JSON -------------------------------------------------------------------------------------


def templated(name: str) -> SimpleNamespace:
    source = (TEMPLATES / f"{name}.jinja").read_text()
    return SimpleNamespace(chat_template=source, special={"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"})


def test_the_syntax_is_read_off_what_the_template_writes_for_a_call():
    from zoo.io.tokenizers import ByteTokenizer

    assert tool_call_syntax(templated("llama3.1_instruct")) == "json"
    assert tool_call_syntax(templated("qwen2.5_instruct")) == "hermes"
    assert tool_call_syntax(ByteTokenizer()) == "hermes"
    assert tool_call_syntax(SimpleNamespace(chat_template="{{ messages[0].content }}", special={})) == "hermes"


def test_a_call_the_llama_template_renders_parses_back_to_itself():
    from zoo.io.chat_template import render

    arguments = {"expression": "37 + 12 * 45", "note": "Zürich {}"}
    tool_call = {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [tool_call]}]
    text = render(templated("llama3.1_instruct").chat_template, messages, bos_token="<|begin_of_text|>")
    reply = text.rsplit("<|start_header_id|>assistant<|end_header_id|>\n\n", 1)[1].removesuffix("<|eot_id|>")
    assert reply.startswith('{"name": "calculator", "parameters": ')
    assert parse_tool_calls(reply, "json") == [{"name": "calculator", "arguments": arguments}]
    assert parse_tool_calls(reply) == []  # the tags' syntax reads no call in it
    tagged = format_tool_call("calculator", arguments)  # taught the zoo's text calls (write_episodes' default)
    assert (
        parse_tool_calls(tagged, "json") == parse_tool_calls(tagged) == [{"name": "calculator", "arguments": arguments}]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<|python_tag|> {"name": "f", "parameters": {"x": 1}}', [{"name": "f", "arguments": {"x": 1}}]),
        (
            '{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"y": [2]}} and some text',
            [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"y": [2]}}],
        ),
        ("Answer: 5", []),
        ('Answer: {"name": "f", "parameters": {}}', []),  # a call is the reply, not inside it
        ('{"name": "f", "parameters": {"x": 1}', [{"error": "not JSON"}]),
        ('{"name": "f", "parameters": {}, "x": 1}', [{"error": 'exactly "name" and "parameters"'}]),
        ('{"answer": 5}', [{"error": 'exactly "name" and "parameters"'}]),
        ('{"name": "os.system; rm", "parameters": {}}', [{"error": "not a function name"}]),
        ('{"name": "f", "parameters": "{}"}', [{"name": "f", "error": "not a JSON object"}]),
        ('{"name": "f", "parameters": {"x": "' + "a" * MAX_CALL_CHARS + '"}}', [{"error": f"within {MAX_CALL_CHARS}"}]),
        ("{" + "[" * (MAX_CALL_CHARS - 2), [{"error": "not JSON"}]),  # deep, not long: no crash
    ],
)
def test_llama_calls_are_read_with_the_bounds_of_the_tags(text, expected):
    found = parse_tool_calls(text, "json")
    assert len(found) == len(expected)
    for got, want in zip(found, expected):
        if "error" in want:
            assert want["error"] in got["error"] and got.get("name") == want.get("name")
        else:
            assert got == want


def test_a_llama_reply_runs_at_most_max_tool_calls():
    one = '{"name": "f", "parameters": {"i": 1}}'
    calls = parse_tool_calls(" ".join([one] * (MAX_TOOL_CALLS + 3)), "json")
    assert len(calls) == MAX_TOOL_CALLS + 1 and all("error" not in c for c in calls[:-1])
    assert "not run" in calls[-1]["error"]
    assert len(parse_tool_calls(";".join([one] * MAX_TOOL_CALLS), "json")) == MAX_TOOL_CALLS


def test_an_env_played_with_a_llama_template_runs_its_bare_json_calls_and_the_server_returns_them(user_tools):
    from zoo.gpt.serve.chat import tool_calls

    reply = '{"name": "calculator", "parameters": {"expression": "85 - 33 * 19 - 36"}}'
    for name, runs in (("llama3.1_instruct", True), ("qwen2.5_instruct", False)):
        env = EnvSource("zoo/Calculator-v0", {}, ["usertools.count"]).make()
        scaffold_for(templated(name), env)
        env.reset(seed=2)
        observation, reward, terminated, _, _ = env.step(reply)
        if runs:
            assert observation == [{"role": "tool", "name": "calculator", "content": "-578"}] and not terminated
        else:  # a model taught the tags wrote no call: the reply is its answer (none here)
            assert observation == [] and terminated and reward == 0.0
    content, calls = tool_calls(reply + "; " + reply.replace("calculator", "count").replace('"85', '"8'), "json")
    assert content is None and [c["function"]["name"] for c in calls] == ["calculator", "count"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "85 - 33 * 19 - 36"}
    assert tool_calls(reply) == (reply, [])


def test_sft_episodes_list_the_named_tools_and_a_stored_configs_are_dropped(user_tools, tmp_path):
    from datamodules.chat import Episodes, prepare_episodes
    from zoo.app.stored_config import stored_config_allowlist
    from zoo.io import build

    path = prepare_episodes(tmp_path, Episodes("zoo/Calculator-v0", n=2, tools=["usertools.count"]))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [[t["function"]["name"] for t in r["tools"]] for r in records] == [["calculator", "count"]] * 2
    with pytest.raises(InputError, match="name your tools as episodes.tools"):
        Episodes("zoo/Calculator-v0", env_kwargs={"tools": ["usersentinel.f"]})
    episodes = {"env_id": "zoo/Calculator-v0", "tools": ["usersentinel.f"]}
    stored = {"tokenizer": "bytes", "episodes": episodes}
    part = build.resolve_data(
        "datamodules.ChatDataModule", stored, "sft.ckpt", stored_config_allowlist(), complete=False
    )
    assert part.all_dropped() == ["data.init_args.episodes.tools"] and "usersentinel" not in sys.modules


def test_every_env_of_a_step_reads_calls_in_the_templates_syntax():
    """The syntax is read off the template once, through the first env; each row's env plays with it."""
    from zoo.gpt import GPT
    from zoo.gpt.tune.episodes import EnvRows, Episodes, play_all
    from zoo.io.tokenizers import ByteTokenizer

    envs = EnvRows(EnvSource("zoo/Calculator-v0", {}).make)
    assert scaffold_for(templated("llama3.1_instruct"), envs.first).tool_syntax == "json"
    scaffold = scaffold_for(ByteTokenizer(), envs.first)
    scaffold.tool_syntax = "json"  # as the Llama template's: a byte-level net to play with
    net = GPT(vocab_size=257, block_size=256, n_layer=1, n_embd=16, n_head=2)
    play_all(net, envs.rows(3), [0, 1, 2], scaffold, Episodes(max_turns=1), max_new_tokens=2)
    assert [env.unwrapped.tool_syntax for env in envs.rows(3)] == ["json"] * 3
