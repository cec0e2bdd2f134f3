"""The text environment: what a language model talks to over several turns, in gymnasium's API.

The contract (what multi-turn rollouts, the SFT writer and evaluation rely on):

- ``reset(seed=None, options=None) -> (observation, info)`` and ``step(action) -> (observation, reward, terminated,
  truncated, info)``, as every ``gymnasium.Env``. An observation is a list of chat messages to append to the
  conversation (``{"role": "user", "content": ...}`` for the environment's turns, ``{"role": "tool", "name": ...,
  "content": ...}`` for a tool's result; empty when the episode ends); an action is the assistant message's text,
  as the model generated it and it was decoded.
- The environment runs the tools: a reply holding tool calls (``zoo.io.tool_calls``' syntax,
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, or Llama 3's bare JSON where ``tool_syntax`` says the
  model writes that) has them run, each within ``tool_timeout`` seconds,
  and gets their results back as ``tool`` messages, at most ``max_tool_chars`` characters each; such a turn earns
  nothing and ends nothing (but the turn limit). A reply without one is the environment's to judge (``respond``).
  A call the model got wrong (not JSON, an unknown tool, missing or extra arguments) or one the tool refuses
  (``ToolError``: a division by zero) is an ``error: ...`` result the model reads. A tool that fails (raises, runs
  past its time, returns a non-string or more than ``max_tool_chars``) ends the episode (truncated) with the reason in
  ``info["failure"]``, or, with ``on_tool_error="stop"``, stops the run with one ``error:`` line.
- ``info`` always carries ``turns`` (replies so far), ``tool_calls`` (calls so far) and ``success`` (whether the
  episode's task is done; final once it ends); ``env.unwrapped.tools`` lists the tools' OpenAI function specs, to
  render into the prompt (``chat_renderer(tokenizer)(messages, True, tools)``).
- ``max_turns`` replies at most: the reply that reaches it truncates the episode if it did not end it.
- ``step_latency`` seconds (0 to 10; 0 by default) every step waits before it answers: a remote tool's or
  environment's round trip, which a synchronous trainer waits out and an actor pool overlaps (``bench/agentic.py``).

Environment turns and tool results are context: the trainer masks them (only the assistant's tokens are learned).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym

from zoo.errors import InputError
from zoo.io.tool_calls import Syntax, parse_tool_calls

MAX_ACTION_CHARS = 100_000  # what an environment reads of one reply
OnToolError = Literal["end", "stop"]


class ToolError(Exception):
    """A tool's refusal of its arguments, meant for the model (``error: division by zero``): not a failure."""


class Tool:
    """A tool the model may call: ``name``, a one-line ``description``, the JSON schema ``parameters`` of its
    arguments (an object's ``properties`` and ``required``), and ``__call__(**arguments) -> str``."""

    name: str = ""
    description: str = ""
    parameters: dict = {"type": "object", "properties": {}, "required": []}

    def __call__(self, **arguments: Any) -> str:
        raise NotImplementedError

    @property
    def spec(self) -> dict:
        """The OpenAI function spec a chat template renders (``apply_chat_template(tools=[...])``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def argument_error(self, arguments: dict) -> str | None:
        """What is wrong with ``arguments`` against ``parameters`` (a missing or unknown name, a JSON type that is
        not the declared one), for the model; None when they fit."""
        properties, required = self.parameters.get("properties", {}), self.parameters.get("required", [])
        if missing := [k for k in required if k not in arguments]:
            return f"{self.name} needs the argument {missing[0]!r}"
        if unknown := [k for k in arguments if k not in properties]:
            return f"{self.name} takes no argument {unknown[0][:64]!r} (it takes {', '.join(properties) or 'none'})"
        for key, value in arguments.items():
            kind = properties[key].get("type")
            expected = JSON_TYPES.get(kind)
            if expected and (not isinstance(value, expected) or (isinstance(value, bool) and kind != "boolean")):
                return f"{self.name}'s argument {key!r} is a {kind}"
        return None


JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


class ToolFailure(Exception):
    """A tool that raised, ran past its time or returned what an episode cannot hold: the reason."""


def run_tool(tool: Tool, arguments: dict, timeout: float, max_chars: int) -> str:
    """``tool(**arguments)`` within ``timeout`` seconds: its result (at most ``max_chars`` characters), or
    ``error: <why>`` for a refusal meant for the model (``ToolError``); a ``ToolFailure`` naming why otherwise. On the
    main thread the deadline interrupts the tool (``zoo.gpt.tasks.timed``, SIGALRM); elsewhere the tool runs on a
    daemon thread that is abandoned at the deadline and stopped at its next Python instruction (``interrupt``)."""
    from zoo.gpt.tasks import PastDeadline, timed

    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["result"] = tool(**arguments)
        except ToolError as err:
            outcome["result"] = f"error: {err}"
        except PastDeadline:
            raise
        except Exception as err:  # the tool is code: whatever it raises ends the episode, not the run
            outcome["failure"] = f"{tool.name} raised {type(err).__name__}: {str(err)[:200]}"

    try:
        if threading.current_thread() is threading.main_thread():
            timed(call, timeout)
        else:
            worker = threading.Thread(target=quietly(call), daemon=True)
            worker.start()
            worker.join(timeout)
            if worker.is_alive():
                interrupt(worker)
                raise PastDeadline
    except PastDeadline:
        raise ToolFailure(f"{tool.name} ran past its {timeout} s") from None
    if "failure" in outcome:
        raise ToolFailure(outcome["failure"])
    result = outcome.get("result")
    if not isinstance(result, str):
        raise ToolFailure(f"{tool.name} returned a {type(result).__name__}, not a string")
    if len(result) > max_chars:
        raise ToolFailure(f"{tool.name} returned {len(result)} characters, over max_tool_chars={max_chars}")
    return result


def quietly(call: Callable[[], None]) -> Callable[[], None]:
    """``call``, ended without a traceback when ``interrupt`` stops it past its deadline."""
    from zoo.gpt.tasks import PastDeadline

    def run() -> None:
        with contextlib.suppress(PastDeadline):
            call()

    return run


def interrupt(worker: threading.Thread) -> None:
    """Raise ``PastDeadline`` in ``worker`` at its next Python instruction, so a tool looping in Python past its
    deadline stops instead of spinning beside the run for good (a call blocked in C ends when it returns; one that
    holds the interpreter lock meanwhile, a huge integer power, holds the caller too: no thread can bound it)."""
    from zoo.gpt.tasks import PastDeadline

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(PastDeadline))


class TextEnv(gym.Env):
    """The contract above; a subclass defines ``observe_start`` (the first messages, after ``self.np_random`` is
    seeded) and ``respond`` (a reply without tool calls judged), and lists its ``Tool`` objects in ``toolbox``."""

    metadata = {"render_modes": []}
    toolbox: tuple[Tool, ...] = ()
    tool_syntax: Syntax = "hermes"  # how the model writes a call (``tool_call_syntax``): set by whoever plays

    def __init__(
        self,
        max_turns: int = 8,
        tool_timeout: float = 1.0,
        max_tool_chars: int = 2000,
        on_tool_error: OnToolError = "end",
        step_latency: float = 0.0,
    ) -> None:
        """
        Args:
            max_turns: the most assistant replies an episode takes; the last one truncates it.
            tool_timeout: seconds a tool call may run.
            max_tool_chars: the most characters of a tool's result; more is a failure.
            on_tool_error: a failing tool ends the episode with the reason in info["failure"] ("end"), or stops
                the run with one error line ("stop").
            step_latency: seconds every step waits before it answers, 0 to 10: a remote tool's or environment's
                round trip, to measure what waiting costs a trainer (``bench/agentic.py``); 0: none.
        """
        if not (isinstance(max_turns, int) and 1 <= max_turns <= 1000):
            raise InputError(f"max_turns={max_turns!r}: give a whole number from 1 to 1000")
        if not (0 < tool_timeout <= 60) or not (1 <= max_tool_chars <= 1_000_000):
            raise InputError("tool_timeout is 0 to 60 seconds and max_tool_chars 1 to 1,000,000")
        if on_tool_error not in ("end", "stop"):
            raise InputError(f"on_tool_error={on_tool_error!r}: give end or stop")
        self.max_turns, self.tool_timeout, self.max_tool_chars = max_turns, tool_timeout, max_tool_chars
        self.on_tool_error = on_tool_error
        self.step_latency = check_latency(step_latency)
        self.turns = self.calls = 0
        self.success = False

    @property
    def tools(self) -> list[dict]:
        """The tools' OpenAI function specs, for the chat template."""
        return [tool.spec for tool in self.toolbox]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        super().reset(seed=seed)
        self.turns = self.calls = 0
        self.success = False
        return self.observe_start(), self.info()

    def step(self, action: str) -> tuple[list[dict], float, bool, bool, dict]:
        if not isinstance(action, str):
            raise TypeError(f"a text environment's action is the reply's text, not a {type(action).__name__}")
        if self.step_latency:
            time.sleep(self.step_latency)
        self.turns += 1
        text = action[:MAX_ACTION_CHARS]
        calls = parse_tool_calls(text, self.tool_syntax) if self.toolbox else []
        if calls:
            self.calls += len(calls)
            try:
                observation, reward, terminated = self.run_calls(calls), 0.0, False
            except ToolFailure as failure:
                if self.on_tool_error == "stop":
                    raise InputError(f"a tool failed: {failure} (on_tool_error=end ends the episode instead)") from None
                return [], 0.0, False, True, self.info(failure=str(failure))
        else:
            observation, reward, terminated = self.respond(text)
        truncated = not terminated and self.turns >= self.max_turns
        return observation, reward, terminated, truncated, self.info()

    def run_calls(self, calls: list[dict]) -> list[dict]:
        """A ``tool`` message per call: the tool's result, or ``error: ...`` for a call it cannot take."""
        by_name, out = {tool.name: tool for tool in self.toolbox}, []
        for call in calls:
            name = call.get("name", "")
            if "error" in call:
                content = f"error: {call['error']}"
            elif name not in by_name:
                content = f"error: no tool named {name!r}; the tools are {', '.join(by_name)}"
            elif why := by_name[name].argument_error(call["arguments"]):
                content = f"error: {why}"
            else:
                content = run_tool(by_name[name], call["arguments"], self.tool_timeout, self.max_tool_chars)
            out.append({"role": "tool", "name": name, "content": content})
        return out

    def info(self, **more: Any) -> dict:
        return {"turns": self.turns, "tool_calls": self.calls, "success": self.success, **more}

    # -- what a subclass defines ------------------------------------------------------------------------------

    def observe_start(self) -> list[dict]:
        raise NotImplementedError

    def respond(self, text: str) -> tuple[list[dict], float, bool]:
        """``(observation, reward, terminated)`` for a reply without tool calls; sets ``self.success``."""
        raise NotImplementedError


MAX_STEP_LATENCY = 10.0  # seconds: a slower environment is a bug, not a setting


def check_latency(seconds: object) -> float:
    """``seconds`` as a float when it is a number from 0 to ``MAX_STEP_LATENCY``; else one InputError."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_STEP_LATENCY:
        raise InputError(f"step_latency={str(seconds)[:40]!r}: give seconds from 0 to {MAX_STEP_LATENCY:g}")
    return float(seconds)


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]
