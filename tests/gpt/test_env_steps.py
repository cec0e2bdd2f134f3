"""The envs of the episodes whose turn ended together step at once (zoo.gpt.tune.env_steps): a turn of envs that
wait costs about one wait; the episodes are those stepped one after another; a tool that hangs or raises on a pool
thread ends its episode with its reason; an exception that escapes a step is raised as before; no thread is left."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import pytest
import torch

from zoo.errors import InputError
from zoo.gpt import GPT
from zoo.gpt.tune import episodes as E
from zoo.gpt.tune.env_steps import THREAD_NAME, EnvSteps
from zoo.gpt.tune.envs import Calculator, CalculatorEnv, Tool
from zoo.io.tokenizers import ByteTokenizer
from zoo.io.tool_calls import format_tool_call

LATENCY = 0.05


def tiny(block_size: int = 256) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=257, block_size=block_size, n_layer=1, n_embd=32, n_head=2).eval()


def pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


class Clocked(gym.Wrapper):
    """The env, each step's (start, end) on the monotonic clock kept in ``spans``."""

    def __init__(self, env, spans: list) -> None:
        super().__init__(env)
        self.spans = spans

    def step(self, action):
        start = time.monotonic()
        out = self.env.step(action)
        self.spans.append((self.env.unwrapped.turns, start, time.monotonic()))
        return out


def played(threads: int, spans: list | None = None, env_id="zoo/GuessNumber-v0", kwargs=None, seeds=range(8)):
    source = E.EnvSource(env_id, kwargs or {"step_latency": LATENCY, "max_turns": 2})
    envs = E.EnvRows(lambda: Clocked(source.make(), spans if spans is not None else []))
    scaffold = E.scaffold_for(ByteTokenizer(), envs.first)
    generators = [torch.Generator().manual_seed(7 + k) for k in range(len(seeds))]
    settings = E.Episodes(max_turns=2, env_threads=threads)
    return E.play_all(tiny(), envs.rows(len(seeds)), list(seeds), scaffold, settings, 4, 1.0, generators=generators)


def test_envs_that_wait_answer_at_once_and_the_episodes_are_those_stepped_in_turn():
    spans: list = []
    together, apart = played(32, spans), played(1)
    assert not pool_threads()  # the pool went with play_all
    for a, b in zip(together, apart, strict=True):
        assert a == b  # every field: ids, policy, logps, turns, rewards, tool calls, success, ended, messages
    assert {e.turns for e in together} == {2} and len(spans) == 16
    for turn in (1, 2):  # the 8 envs' steps of a turn overlap: about one wait, where one after another takes 8
        starts, ends = zip(*[(s, t) for k, s, t in spans if k == turn])
        assert max(starts) < min(ends) and max(ends) - min(starts) < 4 * LATENCY


def test_a_seeded_threaded_run_repeats():
    assert played(32) == played(32)


def test_one_env_or_one_thread_steps_on_the_calling_thread():
    caller = threading.get_ident()

    class Where:
        def step(self, action):
            return threading.get_ident()

    with EnvSteps(1) as one:
        assert one.step([Where(), Where()], ["a", "b"]) == [caller, caller] and one.pool is None
    with EnvSteps(4) as four:
        assert four.step([Where()], ["a"]) == [caller] and four.pool is None
        assert caller not in four.step([Where(), Where()], ["a", "b"])
    assert four.pool is None and not pool_threads()


def test_a_pool_thread_steps_in_the_callers_inference_mode():
    class Mode:
        def step(self, action):
            return torch.is_inference_mode_enabled()

    for mode in (True, False):
        with torch.inference_mode(mode), EnvSteps(4) as steps:
            assert steps.step([Mode(), Mode()], ["a", "b"]) == [mode, mode]


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "4"])
def test_env_threads_is_a_whole_number_from_one(threads):
    with pytest.raises(InputError, match="^episodes.env_threads is a whole number"):
        E.Episodes(env_threads=threads)


# -- tools that fail on a pool thread --------------------------------------------------------------------------------


class Failing(Tool):
    parameters = {"type": "object", "properties": {}}

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> str:
        if self.name == "boom":
            raise RuntimeError("boom")
        end = time.monotonic() + 30  # hangs in Python: stopped at its deadline (interrupt), not 30 s later
        while time.monotonic() < end:
            time.sleep(0.01)
        return "late"


CALLS = {0: "hang", 1: "boom", 2: "hang", 3: "calculator"}  # what each row's first reply calls


def with_failing_tools(on_tool_error: str = "end"):
    env = CalculatorEnv(max_turns=2, tool_timeout=0.3, on_tool_error=on_tool_error)
    env.toolbox = (Calculator(), Failing("hang"), Failing("boom"))
    return env


def scripted_calls(monkeypatch, generators: list) -> None:
    """Row k's first reply is a call of ``CALLS[k]``, then the net's own tokens."""
    real = getattr(E.draw, "real", E.draw)  # not an earlier call's script
    said = {}
    for k, g in enumerate(generators):
        args = {"expression": "12+30"} if CALLS[k] == "calculator" else {}
        said[id(g)] = [*format_tool_call(CALLS[k], args).encode(), 256]

    def draw(logits, temperature, top_p, gens):
        tokens, logps = real(logits, temperature, top_p, gens)
        for i, g in enumerate(gens):
            if said[id(g)]:
                tokens[i] = said[id(g)].pop(0)
        return tokens, logps

    draw.real = real
    monkeypatch.setattr(E, "draw", draw)


def play_tools(monkeypatch, threads: int, on_tool_error: str = "end") -> list[E.Episode]:
    envs = [with_failing_tools(on_tool_error) for _ in CALLS]
    scaffold = E.scaffold_for(ByteTokenizer(), envs[0])
    generators = [torch.Generator().manual_seed(k) for k in CALLS]
    scripted_calls(monkeypatch, generators)
    settings = E.Episodes(max_turns=2, env_threads=threads)
    return E.play_all(tiny(512), envs, list(CALLS), scaffold, settings, 96, 1.0, generators=generators)


def test_a_tool_that_hangs_or_raises_on_a_pool_thread_ends_its_episode_with_its_reason(monkeypatch):
    before, took, step = set(threading.enumerate()), [], EnvSteps.step

    def timed(self, envs, actions):
        start = time.monotonic()
        out = step(self, envs, actions)
        took.append(time.monotonic() - start)
        return out

    monkeypatch.setattr(EnvSteps, "step", timed)
    together = play_tools(monkeypatch, 32)
    assert [e.ended for e in together[:3]] == [
        "truncated: hang ran past its 0.3 s",
        "truncated: boom raised RuntimeError: boom",
        "truncated: hang ran past its 0.3 s",
    ]
    assert together[3].turns == 2 and together[3].messages[2] == {"role": "tool", "name": "calculator", "content": "42"}
    assert not pool_threads()
    for t in set(threading.enumerate()) - before:  # the abandoned tools, stopped at their next instruction
        t.join(2)
        assert not t.is_alive()
    assert took[0] < 2  # the turn with the hanging tools: both abandoned at their deadline, not 30 s on
    apart = play_tools(monkeypatch, 1)  # on the main thread: SIGALRM bounds the tools; the same episodes
    assert together == apart


@pytest.mark.parametrize("threads", [1, 32])
def test_a_tool_failure_that_stops_the_run_is_one_error_line_as_before(monkeypatch, threads):
    # row 0's hang, the first in the episodes' order, though row 1's tool raised 0.3 s sooner on its thread
    with pytest.raises(InputError, match=r"^a tool failed: hang ran past its 0.3 s "):
        play_tools(monkeypatch, threads, on_tool_error="stop")
    assert not pool_threads()


class Raising(gym.Env):
    """Steps raise on the seeds in ``raises`` (the user's env with a bug), after a wait."""

    def reset(self, seed=None, options=None):
        self.seed_ = seed
        return [{"role": "user", "content": "Say something."}], {}

    def step(self, action):
        time.sleep(0.02)
        if self.seed_ in (1, 3):
            raise ValueError(f"bad step of seed {self.seed_}")
        return [{"role": "user", "content": "More."}], 0.0, False, False, {}


@pytest.mark.parametrize("threads", [1, 32])
def test_an_exception_from_an_env_step_is_raised_as_before_the_first_in_order(threads):
    envs = [Raising() for _ in range(4)]
    settings = E.Episodes(max_turns=2, env_threads=threads)
    with pytest.raises(ValueError, match="^bad step of seed 1$"):
        E.play_all(tiny(), envs, [0, 1, 2, 3], E.Scaffold(ByteTokenizer()), settings, 4, 1.0)
    assert not pool_threads()


def test_a_stored_setting_without_env_threads_loads_with_the_default():
    stored = {"max_turns": 3, "max_tokens": None, "turn_credit": False}  # a checkpoint's hparams (zoo.io.hparams)
    assert E.Episodes.of(stored) == E.Episodes(max_turns=3, env_threads=32)
