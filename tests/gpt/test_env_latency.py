"""A text environment's ``step_latency``: every step of every env waits it out; a value out of 0..10 s is refused."""

from __future__ import annotations

import time

import pytest

from zoo.errors import InputError
from zoo.gpt.tune.envs import ENVS, make


@pytest.mark.parametrize("env_id", sorted(ENVS))
def test_every_step_of_every_env_waits_its_latency(env_id):
    env = make(env_id, step_latency=0.03)
    assert env.unwrapped.step_latency == 0.03 and make(env_id).unwrapped.step_latency == 0.0
    env.reset(seed=0)
    for _ in range(2):
        start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step("nothing the env reads")
        assert time.perf_counter() - start >= 0.03
        if terminated or truncated:
            env.reset(seed=1)


@pytest.mark.parametrize("latency", [-0.001, 10.001, float("nan"), float("inf"), True, "0.1", None])
def test_a_latency_out_of_bounds_is_one_error(latency):
    with pytest.raises(InputError, match=r"^step_latency=.*give seconds from 0 to 10$"):
        make("zoo/Calculator-v0", step_latency=latency)


def test_the_bounds_themselves_are_settings():
    assert make("zoo/GuessNumber-v0", step_latency=10).unwrapped.step_latency == 10.0
    assert make("zoo/GuessNumber-v0", step_latency=0).unwrapped.step_latency == 0.0
