"""Scripted players of the text environments: they write the demonstrations (tool-using traces) SFT learns from.

A player is a function ``(env, messages, rng) -> reply``: the environment (unwrapped, for the map a planner reads),
the conversation so far and a generator for its random choices. Each environment has a best player and worse
ones, so SFT can start from imperfect traces that RL must improve on:

- ``zoo/Calculator-v0``: ``tool`` (calls the calculator, answers its result), ``direct`` (answers at once, right),
  ``mixed`` (a quarter of its episodes ``tool``'s, the rest ``direct``'s: answers a small model cannot imitate),
  ``sloppy`` (always calls, but three times in four copies the question without its last term, and answers the
  result: a systematic slip that greedy imitation keeps);
- ``zoo/GuessNumber-v0``: ``binary`` (halves the range: at most 7 guesses), ``random`` (any number still possible),
  ``linear`` (the lowest still possible), ``mixed`` (each guess ``binary``'s one time in four, else ``linear``'s);
- ``zoo/FrozenLakeText-v0``: ``planner`` (value iteration on gymnasium's transition table), ``random``.

``write_episodes`` writes them as ``ChatDataModule`` records: ``{"messages": [...], "tools": [...]}`` a line, whose
environment and tool turns are context (not learned).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from zoo.errors import InputError
from zoo.gpt.tune.envs import check_env_id, make
from zoo.gpt.tune.envs.frozenlake import MOVES
from zoo.gpt.tune.envs.tools import with_tools
from zoo.io.tool_calls import format_tool_call

Player = Callable[..., str]
PLAYER_STREAM = 1  # the player's generator: seeded from (seed, PLAYER_STREAM)
QUESTION = re.compile(r"What is (.+)\?")
GUESS = re.compile(r"Guess: (\d+)")


def calculator_tool(env, messages: list[dict], rng: np.random.Generator) -> str:
    if messages[-1]["role"] == "tool":
        return f"Answer: {messages[-1]['content']}"
    return format_tool_call("calculator", {"expression": QUESTION.search(messages[-1]["content"])[1]})


def calculator_direct(env, messages: list[dict], rng: np.random.Generator) -> str:
    return f"Answer: {env.answer}"


MIXED_SHARE = 0.25  # the share of the mixed and sloppy players' choices that are the good player's
LAST_TERM = re.compile(r"\s*[-+*/]\s*\d+\s*$")


def calculator_sloppy(env, messages: list[dict], rng: np.random.Generator) -> str:
    if messages[-1]["role"] == "user" and rng.random() >= MIXED_SHARE:  # the slip
        expression = LAST_TERM.sub("", QUESTION.search(messages[-1]["content"])[1])
        return format_tool_call("calculator", {"expression": expression})
    return calculator_tool(env, messages, rng)


def calculator_mixed(env, messages: list[dict], rng: np.random.Generator) -> str:
    if messages[-1]["role"] == "tool" or rng.random() < MIXED_SHARE:
        return calculator_tool(env, messages, rng)
    return calculator_direct(env, messages, rng)


def _range(env, messages: list[dict]) -> tuple[int, int]:
    """The numbers still possible after the feedback so far."""
    low, high = env.low, env.high
    for reply, feedback in zip(messages, messages[1:]):
        if reply["role"] == "assistant" and (found := GUESS.search(reply["content"])):
            guess = int(found[1])
            if feedback["content"].startswith("Higher"):
                low = max(low, guess + 1)
            elif feedback["content"].startswith("Lower"):
                high = min(high, guess - 1)
    return low, high


def guess_binary(env, messages: list[dict], rng: np.random.Generator) -> str:
    low, high = _range(env, messages)
    return f"Guess: {(low + high) // 2}"


def guess_random(env, messages: list[dict], rng: np.random.Generator) -> str:
    low, high = _range(env, messages)
    return f"Guess: {int(rng.integers(low, high + 1))}"


def guess_linear(env, messages: list[dict], rng: np.random.Generator) -> str:
    return f"Guess: {_range(env, messages)[0]}"


def guess_mixed(env, messages: list[dict], rng: np.random.Generator) -> str:
    return (guess_binary if rng.random() < MIXED_SHARE else guess_linear)(env, messages, rng)


def lake_plan(lake, gamma: float = 0.99, tol: float = 1e-10) -> np.ndarray:
    """The greedy action of each state under value iteration on gymnasium's transition table ``lake.P`` (the
    discount prefers the shortest safe path; ties go to the lowest action)."""
    n = lake.observation_space.n
    value = np.zeros(n)
    for _ in range(10_000):
        q = np.array(
            [
                [sum(p * (r + gamma * value[s2] * (not done)) for p, s2, r, done in lake.P[s][a]) for a in range(4)]
                for s in range(n)
            ]
        )
        new = q.max(axis=1)
        if np.abs(new - value).max() < tol:
            break
        value = new
    return q.argmax(axis=1)


def lake_planner(env, messages: list[dict], rng: np.random.Generator) -> str:
    if getattr(env, "_plan", None) is None:
        env._plan = lake_plan(env.lake)
    return f"Move: {MOVES[env._plan[env.position]]}"


def lake_random(env, messages: list[dict], rng: np.random.Generator) -> str:
    return f"Move: {MOVES[int(rng.integers(4))]}"


PLAYERS: dict[str, dict[str, Player]] = {
    "zoo/Calculator-v0": {
        "tool": calculator_tool,
        "direct": calculator_direct,
        "mixed": calculator_mixed,
        "sloppy": calculator_sloppy,
    },
    "zoo/GuessNumber-v0": {
        "binary": guess_binary,
        "random": guess_random,
        "linear": guess_linear,
        "mixed": guess_mixed,
    },
    "zoo/FrozenLakeText-v0": {"planner": lake_planner, "random": lake_random},
}


def play(env, player: Player, rng: np.random.Generator, seed: int | None = None) -> tuple[list[dict], float, dict]:
    """One episode of ``player`` in ``env``: the conversation, the return and the last info."""
    messages, info = env.reset(seed=seed)
    messages, total = list(messages), 0.0
    while True:
        reply = player(env.unwrapped, messages, rng)
        messages.append({"role": "assistant", "content": reply})
        observation, reward, terminated, truncated, info = env.step(reply)
        messages += observation
        total += reward
        if terminated or truncated:
            return messages, total, info


def scripted_episodes(
    env_id: str, n: int, seed: int = 0, player: str | None = None, *, tools: list[str] | None = None, **env_kwargs
) -> list[list[dict]]:
    """``n`` conversations of ``player`` (the environment's best by default) in ``env_id`` made with ``env_kwargs``
    (and the user's ``tools``, ``zoo.gpt.tune.envs.tools``): the first episode reset with ``seed``, the next ones
    continuing the environment's generator, as gymnasium's."""
    check_env_id(env_id)
    players = PLAYERS[env_id]
    name = next(iter(players)) if player is None else player
    if name not in players:
        raise InputError(f"player={name!r}: {env_id}'s players are {', '.join(players)}")
    # The player's generator is not the environment's: seeded alike, a random guesser would draw the very target.
    env, rng = with_tools(make(env_id, **env_kwargs), tools), np.random.default_rng([seed, PLAYER_STREAM])
    return [play(env, players[name], rng, seed if k == 0 else None)[0] for k in range(n)]


def structured(messages: list[dict]) -> list[dict]:
    """The conversation with each reply's tool calls as OpenAI's ``tool_calls`` (what an imported chat template
    renders in its own syntax) and its text before them as the content; the zoo's format renders both alike."""
    from zoo.io.tool_calls import OPEN, parse_tool_calls

    out = []
    for m in messages:
        calls = parse_tool_calls(m["content"]) if m["role"] == "assistant" else []
        if calls and all("error" not in c for c in calls):
            m = {
                "role": "assistant",
                "content": m["content"][: m["content"].find(OPEN)],
                "tool_calls": [{"type": "function", "function": c} for c in calls],
            }
        out.append(m)
    return out


def write_episodes(
    path: str | Path,
    env_id: str,
    n: int,
    seed: int = 0,
    player: str | None = None,
    tool_calls: bool = False,
    *,
    tools: list[str] | None = None,
    **env_kwargs,
) -> Path:
    """``scripted_episodes`` written to the JSONL file ``path`` as ChatDataModule records (``messages`` and the
    environment's ``tools``); ``tool_calls``: each reply's calls as OpenAI ``tool_calls`` (``structured``)."""
    specs = with_tools(make(check_env_id(env_id), **env_kwargs), tools).unwrapped.tools
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for messages in scripted_episodes(env_id, n, seed, player, tools=tools, **env_kwargs):
            messages = structured(messages) if tool_calls else messages
            f.write(json.dumps({"messages": messages, "tools": specs}, ensure_ascii=False) + "\n")
    return path
