"""Text environments for multi-turn RL and their scripted players (``zoo.gpt.tune.envs.base`` states the contract).

Importing this package registers them with gymnasium under the ``zoo`` namespace; a config names one by its id
(``env_id: zoo/GuessNumber-v0``) and its settings (``env_kwargs``), never by code: ``make`` builds only the ids
below and refuses any other in one line. Tools of the user's own, named in their YAML, join an environment's
(``zoo.gpt.tune.envs.tools``).

| id                      | task                                                        | tools      |
|-------------------------|-------------------------------------------------------------|------------|
| ``zoo/Calculator-v0``   | 4 terms of 2-digit numbers, ``Answer: N``                   | calculator |
| ``zoo/GuessNumber-v0``  | a number in 1..100 with higher/lower feedback, ``Guess: N`` | none       |
| ``zoo/FrozenLakeText-v0`` | gymnasium's FrozenLake as a grid of letters, ``Move: up`` | none       |
"""

from __future__ import annotations

import gymnasium as gym

from zoo.errors import InputError
from zoo.gpt.tune.envs.base import TextEnv, Tool, ToolError, run_tool
from zoo.gpt.tune.envs.calculator import Calculator, CalculatorEnv, evaluate
from zoo.gpt.tune.envs.frozenlake import FrozenLakeTextEnv
from zoo.gpt.tune.envs.guess import GuessNumberEnv

ENVS: dict[str, type[TextEnv]] = {
    "zoo/Calculator-v0": CalculatorEnv,
    "zoo/GuessNumber-v0": GuessNumberEnv,
    "zoo/FrozenLakeText-v0": FrozenLakeTextEnv,
}
for _id, _cls in ENVS.items():
    if _id not in gym.registry:  # the env checker reads Box-like spaces; a text env's are messages and strings
        gym.register(_id, entry_point=_cls, disable_env_checker=True)


def check_env_id(env_id: object, setting: str = "env_id") -> str:
    """``env_id`` when it is one of the zoo's text environments; else one InputError naming them."""
    if not isinstance(env_id, str) or env_id not in ENVS:
        raise InputError(
            f"{setting}={str(env_id)[:100]!r} is not one of the zoo's text environments ({', '.join(ENVS)}); a "
            f"config names an environment by its registered id, never by code"
        )
    return env_id


def make(env_id: str, **kwargs) -> gym.Env:
    """``gym.make(env_id, **kwargs)`` for one of ``ENVS``; an id or a setting it refuses is one InputError."""
    check_env_id(env_id)
    try:
        return gym.make(env_id, **kwargs)
    except TypeError as err:  # a setting the environment does not take
        raise InputError(f"{env_id} does not take these settings ({err}); see {ENVS[env_id].__name__}") from None


__all__ = [
    "ENVS",
    "Calculator",
    "CalculatorEnv",
    "FrozenLakeTextEnv",
    "GuessNumberEnv",
    "TextEnv",
    "Tool",
    "ToolError",
    "check_env_id",
    "evaluate",
    "make",
    "run_tool",
]
