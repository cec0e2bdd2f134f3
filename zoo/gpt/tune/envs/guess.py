"""Guess a number with higher/lower feedback: a game whose best play needs the observations. Binary search finds any
of 1..100 in at most 7 guesses (ceil(log2(101))); a linear or random search needs many more."""

from __future__ import annotations

import re
from typing import Literal

from zoo.errors import InputError
from zoo.gpt.tune.envs.base import TextEnv, user

GUESS = re.compile(r"Guess:\s*(-?\d{1,12})\b")


class GuessNumberEnv(TextEnv):
    """``zoo/GuessNumber-v0``: the environment draws a number in ``low..high``; each reply ``Guess: N`` is answered
    ``Higher.`` or ``Lower.`` until it is right (reward 1, the episode ends, success), less ``turn_cost`` for every
    reply (a shaped reward that favours fewer guesses). A reply without a guess in range is told the format and
    counts as a turn. No tools.

    ``feedback="range"`` adds the numbers still possible to each answer (``Higher, from 38 to 100.``): the player no
    longer has to gather them from the whole history, but still has to choose where in them to guess."""

    def __init__(
        self,
        low: int = 1,
        high: int = 100,
        turn_cost: float = 0.0,
        max_turns: int = 20,
        step_latency: float = 0.0,
        feedback: Literal["direction", "range"] = "direction",
    ) -> None:
        """
        Args:
            low, high: the range of the number, both included.
            turn_cost: subtracted from the reward at every reply (0: reward 1 on success only).
            max_turns: the most guesses; the last one truncates the episode.
            step_latency: as TextEnv's (seconds every step waits).
            feedback: ``direction``: ``Higher.`` or ``Lower.``; ``range``: and the numbers still possible.
        """
        super().__init__(max_turns, step_latency=step_latency)
        if not (isinstance(low, int) and isinstance(high, int) and 0 <= low < high <= 10**9):
            raise InputError(f"low={low!r} and high={high!r}: give whole numbers 0 <= low < high <= 10^9")
        if not 0 <= turn_cost <= 1:
            raise InputError(f"turn_cost={turn_cost!r}: give a number from 0 to 1")
        if feedback not in ("direction", "range"):
            raise InputError(f"feedback={feedback!r}: give 'direction' (Higher./Lower.) or 'range' (and the range)")
        self.low, self.high, self.turn_cost, self.feedback = low, high, turn_cost, feedback
        self.target, self.possible = low, (low, high)

    def observe_start(self) -> list[dict]:
        self.target = int(self.np_random.integers(self.low, self.high + 1))
        self.possible = (self.low, self.high)
        return user(f"Guess my number from {self.low} to {self.high}. Reply Guess: N.")

    def respond(self, text: str) -> tuple[list[dict], float, bool]:
        found = GUESS.search(text)
        guess = int(found[1]) if found else None
        if guess is None or not self.low <= guess <= self.high:
            return user(f"Reply Guess: N with N from {self.low} to {self.high}."), 0.0 - self.turn_cost, False
        if guess == self.target:
            self.success = True
            return [], 1.0 - self.turn_cost, True
        low, high = self.possible
        low, high = (max(low, guess + 1), high) if guess < self.target else (low, min(high, guess - 1))
        self.possible = (low, high)
        answer = "Higher" if guess < self.target else "Lower"
        answer += f", from {low} to {high}." if self.feedback == "range" else "."
        return user(answer), 0.0 - self.turn_cost, False
