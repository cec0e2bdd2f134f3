"""Text environments: each one's dynamics and rewards in closed form, the calculator against Python's arithmetic,
FrozenLake as text against gymnasium's own lake, tools that fail, and the scripted episodes SFT trains on."""

from __future__ import annotations

import time
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest

from zoo.errors import InputError
from zoo.gpt.tune.envs import ENVS, CalculatorEnv, Tool, ToolError, check_env_id, evaluate, make
from zoo.gpt.tune.envs.calculator import MAX_DEPTH, MAX_EXPRESSION_CHARS, shown
from zoo.gpt.tune.envs.frozenlake import MOVES
from zoo.gpt.tune.envs.scripted import guess_binary, play, scripted_episodes, write_episodes
from zoo.io.tool_calls import format_tool_call

# -- the calculator -------------------------------------------------------------------------------------------------


def random_expression(rng: np.random.Generator, depth: int = 0) -> tuple[str, Fraction]:
    """An expression and its value by Python's own arithmetic (Fractions: exact), with negative numbers, unary
    signs, parentheses and spaces or none."""
    if depth > 3 or rng.random() < 0.3:
        n = int(rng.integers(0, 1000))
        if rng.random() < 0.25:
            return f"-{n}", Fraction(-n)
        return str(n), Fraction(n)
    left, a = random_expression(rng, depth + 1)
    right, b = random_expression(rng, depth + 1)
    op = str(rng.choice(list("+-*/")))
    if op == "/" and b == 0:
        op = "+"
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
    space = " " if rng.random() < 0.5 else ""
    return f"({left}{space}{op}{space}{right})", value


def test_the_calculator_equals_pythons_arithmetic_on_random_expressions():
    rng = np.random.default_rng(0)
    for _ in range(500):
        text, value = random_expression(rng)
        assert evaluate(text) == value, text
        if value.denominator == 1:
            assert shown(value) == str(value.numerator)
        else:
            assert float(shown(value)) == pytest.approx(float(value), rel=1e-11)
    # precedence and signs without parentheses, as Python reads them
    for text, value in (("2 + 3 * 4", 14), ("-2 * -3 - -4", 10), ("10 - 4 - 3", 3), ("7 / 2 * 2", 7), ("--5", 5)):
        assert evaluate(text) == value, text
    assert shown(Fraction(1, 3)) == "0.333333333333" and shown(Fraction(-7, 2)) == "-3.5"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1 / (3 - 3)", "division by zero"),
        ("2 ** 3", "unexpected '\\*'"),
        ("__import__('os')", "unexpected character '_'"),
        ("2 +", "ends too soon"),
        ("(1 + 2", "without its"),
        ("1 + 2)", "after a complete expression"),
        ("1.5 + 2", "unexpected character '.'"),
        ("", "ends too soon"),
        ("1" * (MAX_EXPRESSION_CHARS + 1), "at most"),
        ("(" * (MAX_DEPTH + 2) + "1" + ")" * (MAX_DEPTH + 2), "nested more than"),
        ("-" * (MAX_DEPTH + 2) + "1", "nested more than"),
        ("*".join(["99999999999"] * 5), "past 40 digits"),
    ],
)
def test_the_calculator_refuses_what_it_does_not_read_with_a_message(text, why):
    with pytest.raises(ToolError, match=why):
        evaluate(text)


def solve(env, reply_after_tool=None) -> tuple[float, dict]:
    expression = env.unwrapped.expression
    observation, *_ = env.step(format_tool_call("calculator", {"expression": expression}))
    assert observation == [{"role": "tool", "name": "calculator", "content": str(env.unwrapped.answer)}]
    _, reward, terminated, truncated, info = env.step(reply_after_tool or f"Answer: {observation[0]['content']}")
    assert terminated and not truncated
    return reward, info


def test_the_calculator_env_rewards_the_right_answer_only():
    env = make("zoo/Calculator-v0")
    observation, info = env.reset(seed=3)
    expression = env.unwrapped.expression
    assert observation == [{"role": "user", "content": f"What is {expression}?"}] and info["tool_calls"] == 0
    numbers = expression.split()[::2]
    assert len(numbers) == 4 and all(10 <= int(n) <= 99 for n in numbers)
    assert env.unwrapped.answer == evaluate(expression)
    assert solve(env) == (1.0, {"turns": 2, "tool_calls": 1, "success": True})
    env.reset(seed=3)
    assert solve(env, f"Answer: {env.unwrapped.answer + 1}") == (0.0, {"turns": 2, "tool_calls": 1, "success": False})
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step("I do not know.")  # no call and no answer: the end, nothing earned
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    env.reset(seed=3)  # a wrong call is the model's to read, and the turn limit truncates
    for turn in range(1, 5):
        observation, reward, terminated, truncated, info = env.step(format_tool_call("calc", {}))
        assert observation[0]["content"].startswith("error: no tool named 'calc'")
        assert (reward, terminated, truncated, info["tool_calls"]) == (0.0, False, turn == 4, turn)


def test_held_out_problems_never_reach_training_and_the_split_is_by_question():
    train, test = make("zoo/Calculator-v0", split="train"), make("zoo/Calculator-v0", split="test")
    train.reset(seed=0)
    test.reset(seed=0)
    seen = {"train": set(), "test": set()}
    for _ in range(300):
        for name, env in (("train", train), ("test", test)):
            env.reset()
            seen[name].add(env.unwrapped.expression)
            assert env.unwrapped.held_out(env.unwrapped.expression) == (name == "test")
    assert not seen["train"] & seen["test"] and len(seen["test"]) > 250


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({}, "needs the argument 'expression'"),
        ({"expression": "1+1", "x": 1}, "takes no argument 'x'"),
        ({"expression": 3}, "argument 'expression' is a string"),
        ({"expression": "1/0"}, "division by zero"),
    ],
)
def test_a_call_the_model_got_wrong_is_an_error_it_reads(arguments, why):
    env = make("zoo/Calculator-v0")
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("x " + format_tool_call("calculator", arguments))
    assert observation[0]["content"].startswith("error: ") and why in observation[0]["content"]
    assert (reward, terminated, truncated, info["tool_calls"]) == (0.0, False, False, 1)


def test_each_call_of_a_reply_is_run_and_answered_in_order():
    env = make("zoo/Calculator-v0")
    env.reset(seed=0)
    reply = format_tool_call("calculator", {"expression": "2*(3+4)"}) + format_tool_call(
        "calculator", {"expression": "-9/6"}
    )
    observation, reward, terminated, truncated, info = env.step(reply + " Answer: 14")  # calls first, answer unread
    assert [m["content"] for m in observation] == ["14", "-1.5"] and info["tool_calls"] == 2
    assert (reward, terminated, truncated) == (0.0, False, False)


class Broken(Tool):
    name, parameters = "calculator", {"type": "object", "properties": {}}

    def __init__(self, how: str) -> None:
        self.how = how

    def __call__(self) -> str:
        if self.how == "raises":
            raise RuntimeError("boom")
        if self.how == "hangs":  # for 3 s, far past its deadline (a thread left behind then ends)
            end = time.monotonic() + 3
            while time.monotonic() < end:
                time.sleep(0.01)
        return "x" * 10_000_000 if self.how == "megabytes" else 42


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("raises", "raised RuntimeError: boom"),
        ("hangs", "ran past its 0.2 s"),
        ("megabytes", "returned 10000000 characters"),
        ("number", "returned a int"),
    ],
)
def test_a_tool_that_fails_ends_the_episode_with_its_reason_or_stops_the_run(how, reason):
    env = CalculatorEnv(tool_timeout=0.2)
    env.toolbox = (Broken(how),)
    env.reset(seed=0)
    start = time.monotonic()
    observation, reward, terminated, truncated, info = env.step(format_tool_call("calculator", {}))
    assert time.monotonic() - start < 2
    assert (observation, reward, terminated, truncated) == ([], 0.0, False, True) and reason in info["failure"]
    env = CalculatorEnv(tool_timeout=0.2, on_tool_error="stop")
    env.toolbox = (Broken(how),)
    env.reset(seed=0)
    with pytest.raises(InputError, match=f"a tool failed: .*{reason}"):
        env.step(format_tool_call("calculator", {}))


def test_a_hanging_tool_off_the_main_thread_is_abandoned_at_its_deadline():
    import threading

    env = CalculatorEnv(tool_timeout=0.2)
    env.toolbox = (Broken("hangs"),)
    env.reset(seed=0)
    out = {}
    worker = threading.Thread(target=lambda: out.update(step=env.step(format_tool_call("calculator", {}))))
    worker.start()
    worker.join(5)
    assert "ran past" in out["step"][4]["failure"]


# -- guess the number -----------------------------------------------------------------------------------------------


def test_binary_search_finds_every_number_in_1_to_100_within_7_guesses():
    env, rng = make("zoo/GuessNumber-v0"), np.random.default_rng(0)
    env.reset(seed=0)
    turns = []
    for target in range(1, 101):
        messages, _ = env.reset()
        env.unwrapped.target = target
        messages = list(messages)
        while True:
            reply = guess_binary(env.unwrapped, messages, rng)
            observation, reward, terminated, truncated, info = env.step(reply)
            messages += [{"role": "assistant", "content": reply}, *observation]
            if terminated or truncated:
                break
        assert terminated and info["success"] and reward == 1.0, target
        turns.append(info["turns"])
    assert max(turns) == 7 and sum(turns) == 580  # ceil(log2(101)); the sum over a complete search tree


def test_the_guessing_game_answers_higher_lower_and_shapes_by_turns():
    env = make("zoo/GuessNumber-v0", turn_cost=0.1, max_turns=4)
    env.reset(seed=0)
    env.unwrapped.target = 42
    steps = [env.step(reply) for reply in ("Guess: 50", "I think Guess: 10", "Guess: 101", "Guess: 42")]
    assert [s[0] for s in steps] == [
        [{"role": "user", "content": "Lower."}],
        [{"role": "user", "content": "Higher."}],
        [{"role": "user", "content": "Reply Guess: N with N from 1 to 100."}],
        [],
    ]
    assert [s[1] for s in steps] == pytest.approx([-0.1, -0.1, -0.1, 0.9])
    assert [s[2] for s in steps] == [False, False, False, True] and steps[-1][4]["success"]
    env.reset(seed=0)
    for _ in range(4):
        *_, terminated, truncated, info = env.step("Guess: 0")
    assert (terminated, truncated, info["success"], info["turns"]) == (False, True, False, 4)


def test_the_range_feedback_states_the_numbers_still_possible_whatever_the_guesses():
    env = make("zoo/GuessNumber-v0", feedback="range")
    env.reset(seed=0)
    env.unwrapped.target = 42
    replies = ("Guess: 50", "Guess: 90", "Guess: 10", "Guess: 41", "Guess: 7", "Guess: 43", "Guess: 42")
    answers = [env.step(reply)[0] for reply in replies]
    assert [a[0]["content"] if a else None for a in answers] == [
        "Lower, from 1 to 49.",
        "Lower, from 1 to 49.",  # a guess outside the range narrows nothing
        "Higher, from 11 to 49.",
        "Higher, from 42 to 49.",
        "Higher, from 42 to 49.",
        "Lower, from 42 to 42.",
        None,
    ]
    env.reset(seed=1)  # a new episode starts from the whole range
    env.unwrapped.target = 60
    assert env.step("Guess: 70")[0] == [{"role": "user", "content": "Lower, from 1 to 69."}]
    with pytest.raises(InputError, match="feedback"):
        make("zoo/GuessNumber-v0", feedback="hot")
    guess = scripted_episodes("zoo/GuessNumber-v0", 50, 0, "binary", feedback="range")
    assert max(sum(m["role"] == "assistant" for m in e) for e in guess) <= 7  # the players read either answer


def test_the_worse_players_need_clearly_more_turns():
    mean = {
        player: np.mean([sum(m["role"] == "assistant" for m in e) for e in scripted_episodes(*args)])
        for player, args in (
            ("binary", ("zoo/GuessNumber-v0", 100, 0, "binary")),
            ("random", ("zoo/GuessNumber-v0", 100, 0, "random")),
            ("linear", ("zoo/GuessNumber-v0", 100, 0, "linear")),
        )
    }
    assert mean["binary"] < 6.2 and mean["random"] > mean["binary"] + 1 and mean["linear"] > 15


# -- FrozenLake as text ---------------------------------------------------------------------------------------------


def position_in(text: str) -> int:
    rows = text.split("\n")[-4:]
    return next(r * 4 + c for r, row in enumerate(rows) for c, cell in enumerate(row) if cell == "*")


@pytest.mark.parametrize("slippery, success_rate", [(True, 1 / 3), (True, 0.8), (False, 1 / 3)])
def test_frozenlake_as_text_goes_as_gymnasiums_lake_with_the_same_seed_and_moves(slippery, success_rate):
    rng = np.random.default_rng(1)
    for seed in range(8):
        ours, theirs = (
            make("zoo/FrozenLakeText-v0", is_slippery=slippery, success_rate=success_rate),
            gym.make("FrozenLake-v1", is_slippery=slippery, success_rate=success_rate),
        )
        observation, _ = ours.reset(seed=seed)
        state, _ = theirs.reset(seed=seed)
        assert position_in(observation[0]["content"]) == state == 0
        assert observation[0]["content"].endswith("\n*FFF\nFHFH\nFFFH\nHFFG")
        for _ in range(100):
            action = int(rng.integers(4))
            observation, reward, terminated, truncated, info = ours.step(f"Move: {MOVES[action].upper()}")
            state, their_reward, their_terminated, _, _ = theirs.step(action)
            assert (reward, terminated) == (their_reward, their_terminated)
            assert ours.unwrapped.position == state
            if terminated:
                assert observation == [] and info["success"] == (state == 15)
                break
            assert position_in(observation[0]["content"]) == state


def test_frozenlake_refuses_a_reply_without_a_move_and_truncates_at_its_turns():
    env = make("zoo/FrozenLakeText-v0", is_slippery=False, max_turns=2)
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("north")
    assert observation[0]["content"].startswith("Reply Move: left, down, right or up.\n*FFF")
    assert (reward, terminated, truncated) == (0.0, False, False)
    *_, truncated, info = env.step("Move: left")
    assert truncated and info["turns"] == 2 and env.unwrapped.position == 0


def test_the_planner_reaches_the_goal_on_still_ice_in_six_moves_and_mostly_on_slippery():
    (episode,) = scripted_episodes("zoo/FrozenLakeText-v0", 1, 0, is_slippery=False)
    assert sum(m["role"] == "assistant" for m in episode) == 6
    env, rng = make("zoo/FrozenLakeText-v0"), np.random.default_rng(0)
    from zoo.gpt.tune.envs.scripted import lake_planner, lake_random

    wins = {
        p.__name__: np.mean([play(env, p, rng, seed)[1] for seed in range(100)]) for p in (lake_planner, lake_random)
    }
    assert wins["lake_planner"] > 0.6 > 0.1 > wins["lake_random"]  # gymnasium's 4x4 optimum is ~0.74


def test_in_a_short_game_on_surer_ice_the_careful_planner_loses_to_the_shortest_path():
    """The setting sft_frozenlake.yaml trains in (12 moves, a move going where meant 4 times in 5): the planner, the
    best for gymnasium's 100-move game, waits at walls for the ice to carry it, which a 12-move game cannot afford,
    so its traces are imperfect in a way greedy imitation keeps (finite-horizon values: 0.296 against 0.721)."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    from zoo.gpt.tune.envs.scripted import lake_plan, lake_planner

    shortest = lake_plan(FrozenLakeEnv(is_slippery=False))

    def lake_shortest(env, messages, rng):
        return f"Move: {MOVES[shortest[env.position]]}"

    env, rng = make("zoo/FrozenLakeText-v0", success_rate=0.8, max_turns=12), np.random.default_rng(0)
    wins = {p.__name__: np.mean([play(env, p, rng, s)[1] for s in range(400)]) for p in (lake_planner, lake_shortest)}
    assert 0.2 < wins["lake_planner"] < 0.4 and 0.62 < wins["lake_shortest"] < 0.82
    with pytest.raises(InputError, match="success_rate"):
        make("zoo/FrozenLakeText-v0", success_rate=1.5)


# -- ids, registration, demonstrations ------------------------------------------------------------------------------


def test_the_envs_are_registered_and_a_config_names_only_them():
    from zoo.io import trust

    for env_id in ENVS:
        assert env_id in gym.registry and check_env_id(env_id) == env_id
        trust.check_env_id(env_id, "data.init_args.env_id", "a checkpoint", trust.Allowlist({}, {}, {}))
    for bad in ("CartPole-v1", "zoo.gpt.tune.envs:CalculatorEnv", "os:system", 3):
        with pytest.raises(InputError, match="not one of the zoo's text environments"):
            make(bad)
    with pytest.raises(InputError, match="does not take these settings"):
        make("zoo/GuessNumber-v0", hostname="x")
    with pytest.raises(InputError, match="max_turns"):
        make("zoo/GuessNumber-v0", max_turns=0)


def test_written_episodes_train_only_the_replies(tmp_path):
    from datamodules import ChatDataModule
    from zoo.gpt.losses import IGNORE_INDEX
    from zoo.io.tokenizers import ByteTokenizer

    path = write_episodes(tmp_path / "calc.jsonl", "zoo/Calculator-v0", 6, seed=1)
    dm = ChatDataModule(str(path), tokenizer="bytes", block_size=400, batch_size=6, val_fraction=0)
    dm.setup("fit")
    inputs, targets = next(iter(dm.train_dataloader()))
    tok, episodes = ByteTokenizer(), scripted_episodes("zoo/Calculator-v0", 6, seed=1)
    learned = sorted([t for t in row if t != IGNORE_INDEX] for row in targets.tolist())  # shuffled rows
    replies = [[m["content"] for m in episode if m["role"] == "assistant"] for episode in episodes]
    assert learned == sorted([i for r in rs for i in tok.encode(r) + [tok.eos_id]] for rs in replies)
    assert all("<tool_call>" in rs[0] and rs[1].startswith("Answer: ") for rs in replies)
    assert tok.decode(inputs[0].tolist()).startswith("<|tools|>\ncalculator(expression): Evaluate")


def test_the_manuals_example_runs_as_shown():
    import json
    import re

    from conftest import ROOT

    page = (ROOT / "docs" / "gpt-envs.md").read_text()
    code = re.search(r"```python\n(from zoo.gpt.tune.envs import make\n.*?)```", page, re.S)[1]
    shown = [json.loads(m) for m in re.findall(r"^# messages == (.*)$", code, re.M)]
    env = make("zoo/Calculator-v0")
    messages, info = env.reset(seed=2)
    assert messages == shown[0]
    reply = re.search(r"^reply = '(.*)'$", code, re.M)[1]
    messages, reward, terminated, truncated, info = env.step(reply)
    assert messages == shown[1]
    last = json.loads(
        re.search(r"^# \((.*)\)$", code, re.M)[1].join("[]").replace("True", "true").replace("False", "false")
    )
    assert list(env.step("Answer: -578")) == last


def test_a_chat_datamodule_writes_its_episodes_once_and_refuses_a_folder_of_someone_elses(tmp_path):
    from datamodules.chat import ChatDataModule, Episodes

    folder = tmp_path / "guess"
    episodes = Episodes("zoo/GuessNumber-v0", n=12, player="linear", env_kwargs={"max_turns": 5})
    dm = ChatDataModule(str(folder), tokenizer="bytes", block_size=512, val_fraction=0.25, episodes=episodes)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set)) == (9, 3)
    written = (folder / "episodes.jsonl").stat().st_mtime_ns
    ChatDataModule(str(folder), tokenizer="bytes", episodes=episodes).prepare_data()  # the same settings: kept
    assert (folder / "episodes.jsonl").stat().st_mtime_ns == written
    more = Episodes("zoo/GuessNumber-v0", n=13, player="linear", env_kwargs={"max_turns": 5})
    ChatDataModule(str(folder), tokenizer="bytes", episodes=more).prepare_data()  # other settings: written again
    assert len((folder / "episodes.jsonl").read_text().splitlines()) == 13
    first = (folder / "episodes.jsonl").read_text().splitlines()[0]
    assert first.count('"content": "Guess: ') == 5 and '"tools": []' in first  # linear, truncated at 5 guesses
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "episodes.jsonl").write_text("{}\n")
    with pytest.raises(InputError, match="was not written from episodes settings"):
        ChatDataModule(str(theirs), tokenizer="bytes", episodes=episodes).prepare_data()
    with pytest.raises(InputError, match="not one of the zoo's text environments"):
        ChatDataModule(str(folder), tokenizer="bytes", episodes=Episodes("CartPole-v1"))


def test_a_stored_config_with_episodes_builds_and_names_no_code(tmp_path):
    from zoo.app.stored_config import stored_config_allowlist
    from zoo.io import build

    episodes = {"env_id": "zoo/FrozenLakeText-v0", "n": 3, "env_kwargs": {"is_slippery": False, "max_turns": 9}}
    stored = {"path": str(tmp_path / "lake"), "tokenizer": "bytes", "episodes": episodes}
    part = build.resolve_data("datamodules.ChatDataModule", stored, "x.ckpt", stored_config_allowlist(), complete=False)
    dm = build.build(part, path=str(tmp_path / "lake"))  # a stored config never chooses where data is read
    assert dm.episodes.env_kwargs == episodes["env_kwargs"] and dm.episodes.env_id == "zoo/FrozenLakeText-v0"
    decoy = {**stored, "episodes": {**episodes, "env_id": "datamodules.gym_envs:NumpyCartPole-v1"}}
    part = build.resolve_data("datamodules.ChatDataModule", decoy, "x.ckpt", stored_config_allowlist(), complete=False)
    with pytest.raises(InputError, match="not one of the zoo's text environments"):
        build.build(part, path=str(tmp_path / "lake"))
