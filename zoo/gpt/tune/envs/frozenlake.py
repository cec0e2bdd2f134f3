"""gymnasium's FrozenLake played as text: the RL family's grid world, seen as a grid of letters and moved in words.

The lake is gymnasium's own ``FrozenLakeEnv`` (its map, slipping and reward), seeded as ``gym.make("FrozenLake-v1")``
is by the same ``reset(seed)``, so a game played here and there with the same moves goes the same way. The
observation is the map (``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal) with the player's cell shown as ``*``;
a reply ``Move: left`` (or down, right, up: gymnasium's actions 0 to 3) moves.
"""

from __future__ import annotations

import re

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

from zoo.errors import InputError
from zoo.gpt.tune.envs.base import TextEnv, user

MOVES = ("left", "down", "right", "up")  # gymnasium's action numbers
MOVE = re.compile(r"Move:\s*(left|down|right|up)\b", re.IGNORECASE)
MAX_CELLS = 256
RULES = "Reach G, avoid H; * is you. Reply Move: left, down, right or up."


class FrozenLakeTextEnv(TextEnv):
    """``zoo/FrozenLakeText-v0``: the first observation is ``RULES`` and the map, each later one the map; a move
    steps gymnasium's lake (reward its reward: 1 at the goal), and reaching the goal or a hole ends the episode
    (success at the goal). A reply without a move is told the format, counts as a turn and moves nothing."""

    def __init__(
        self,
        map_name: str = "4x4",
        desc: list[str] | None = None,
        is_slippery: bool = True,
        success_rate: float = 1 / 3,
        max_turns: int = 100,
        step_latency: float = 0.0,
    ) -> None:
        """
        Args:
            map_name: gymnasium's map ("4x4" or "8x8"), when desc is None.
            desc: a map of your own, rows of S F H G (at most 256 cells); None: map_name's.
            is_slippery: the ice may move the player sideways, as gymnasium's default.
            success_rate: on slippery ice, the chance a move goes where it was meant (else to either side alike):
                gymnasium's, 1/3 by default.
            max_turns: the most replies (gymnasium's FrozenLake-v1 stops the 4x4 lake at 100 steps).
            step_latency: as TextEnv's (seconds every step waits).
        """
        super().__init__(max_turns, step_latency=step_latency)
        if desc is not None and (
            not isinstance(desc, list)
            or not desc
            or sum(len(row) for row in desc) > MAX_CELLS
            or any(not isinstance(row, str) or len(row) != len(desc[0]) or set(row) - set("SFHG") for row in desc)
        ):
            raise InputError(f"desc is a list of equal rows of S F H G, at most {MAX_CELLS} cells")
        if desc is None and map_name not in ("4x4", "8x8"):
            raise InputError(f"map_name={map_name!r}: give 4x4 or 8x8, or a desc")
        if not isinstance(success_rate, (int, float)) or not 0 <= success_rate <= 1:
            raise InputError(f"success_rate={success_rate!r}: give a chance from 0 to 1")
        self.lake = FrozenLakeEnv(
            desc=desc, map_name=map_name, is_slippery=bool(is_slippery), success_rate=float(success_rate)
        )
        self._seed: int | None = None

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        self._seed = seed
        return super().reset(seed=seed, options=options)

    @property
    def position(self) -> int:
        return int(self.lake.s)

    def grid(self) -> str:
        rows = [[c.decode() for c in row] for row in self.lake.desc]
        cols = len(rows[0])
        rows[self.position // cols][self.position % cols] = "*"
        return "\n".join("".join(row) for row in rows)

    def observe_start(self) -> list[dict]:
        self.lake.reset(seed=self._seed)
        return user(f"{RULES}\n{self.grid()}")

    def respond(self, text: str) -> tuple[list[dict], float, bool]:
        found = MOVE.search(text)
        if found is None:
            return user(f"Reply Move: left, down, right or up.\n{self.grid()}"), 0.0, False
        state, reward, terminated, _, _ = self.lake.step(MOVES.index(found[1].lower()))
        self.success = terminated and reward > 0
        return ([] if terminated else user(self.grid())), float(reward), bool(terminated)
