"""Verifiable rewards for RL on the GPT: programs that score a completion against its record's answer.

Each reward is a small class, ``reward(completions, answers) -> list[float]``, built from the user's own YAML by class
path (``model.init_args.rewards``); the run's reward is their sum, each times its ``weight`` (TRL's
``reward_weights``). A subclass of ``Reward`` in the user's code is one too. A checkpoint or a registered model never
names one: ``rewards`` is dropped from every stored config (``zoo.io.build.drops_location``), so a reloaded model
builds none.

``score`` runs them guarded: a reward that raises, returns a non-finite value or runs past ``timeout`` seconds
(``signal.setitimer``, on the main thread only) stops the run with one ``error:`` line naming the reward and the
completion, or, with ``on_error="zero"``, gives that completion 0 from it and counts it.

A ``StepReward`` scores each reasoning step of a completion instead (``steps``: where each step ends and its
score): GRPO then credits each token with the group-normalised scores of the steps ending at or after it, or of
its own step alone (process supervision, DeepSeekMath section 4.1.3; ``step_credit``). ``WorkedLines`` scores each
worked line ``a + b = c`` of the arithmetic task by whether it holds on the reference's numbers.

Answers are read by the answer rule of ``cli.py test`` (``zoo.gpt.tasks.correct``): the data's ``answer_pattern``, a
regex whose one group at its first match is the answer (a string), in the completion and in the reference alike; by
default GSM8K's ``#### <number>`` (a completion without one: its last number), the arithmetic task's. An
``AnswerReward`` (``ExactMatch``, ``NumericTolerance``) is handed that rule with each batch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

from zoo.errors import InputError
from zoo.gpt.tasks import PastDeadline, correct, extract_answer, reference, timed

OnError = Literal["stop", "zero"]


class Reward:
    """A reward function with its weight in the sum; subclasses define ``score_one`` (or ``__call__`` for a batch)."""

    def __init__(self, weight: float = 1.0) -> None:
        """
        Args:
            weight: this reward's weight in the sum of the run's rewards.
        """
        self.weight = weight

    @property
    def name(self) -> str:
        return type(self).__name__

    def __call__(self, completions: list[str], answers: list[str]) -> list[float]:
        return [self.score_one(c, a) for c, a in zip(completions, answers)]

    def score_one(self, completion: str, answer: str) -> float:
        raise NotImplementedError


class AnswerReward(Reward):
    """A reward on the completion's final answer against its record's, both read by the run's answer rule (the
    data's ``answer_pattern``, as ``cli.py test`` reads them): subclasses define ``score_answer``."""

    def __call__(self, completions: list[str], answers: list[str], pattern: str | None = None) -> list[float]:
        return [self.score_answer(c, a, pattern) for c, a in zip(completions, answers)]

    def score_one(self, completion: str, answer: str) -> float:
        return self.score_answer(completion, answer, None)

    def score_answer(self, completion: str, answer: str, pattern: str | None) -> float:
        raise NotImplementedError


class ExactMatch(AnswerReward):
    """1 when the completion's answer equals the reference's by the answer rule (``zoo.gpt.tasks.correct``), else 0."""

    def score_answer(self, completion: str, answer: str, pattern: str | None) -> float:
        return float(correct(completion, answer, pattern))


class FormatCheck(Reward):
    """1 when ``pattern`` matches the completion (``re.search``), else 0: the format reward of R1-style training."""

    def __init__(self, pattern: str = r"####\s*-?\d", weight: float = 1.0) -> None:
        """
        Args:
            pattern: a regular expression the completion must contain; by default GSM8K's answer line.
            weight: this reward's weight in the sum.
        """
        super().__init__(weight)
        self.pattern = re.compile(pattern)

    def score_one(self, completion: str, answer: str) -> float:
        return float(self.pattern.search(completion) is not None)


class NumericTolerance(AnswerReward):
    """1 when the completion's answer, read by the answer rule, is a number within ``tol`` of the reference's, else 0
    (0 when either is no number)."""

    def __init__(self, tol: float = 0.0, weight: float = 1.0) -> None:
        """
        Args:
            tol: the largest absolute difference still scored right.
            weight: this reward's weight in the sum.
        """
        super().__init__(weight)
        self.tol = tol

    def score_answer(self, completion: str, answer: str, pattern: str | None) -> float:
        try:
            mine, want = extract_answer(completion, pattern), reference(answer, pattern)
            return float(abs(float(mine) - float(want)) <= self.tol)
        except (TypeError, ValueError):  # None (the rule read nothing) or not a number
            return 0.0


class StepReward(Reward):
    """A reward per reasoning step: subclasses define ``steps``. GRPO turns the steps' scores into per-token
    advantages (``zoo.train.policy_gradient.process_advantages``); read as a plain reward, the mean of the steps'
    scores (0 with no step)."""

    def steps(self, completion: str, answer: str) -> list[tuple[int, float]]:
        """(end, score) per step, ``end`` the character offset in ``completion`` just past the step."""
        raise NotImplementedError

    def score_one(self, completion: str, answer: str) -> float:
        steps = self.steps(completion, answer)
        return sum(v for _, v in steps) / len(steps) if steps else 0.0


_EQUATION = re.compile(r"\s*(-?\d{1,30}(?:\s*[-+*]\s*-?\d{1,30})+)\s*=\s*(-?\d{1,30})\s*")
_TERM = re.compile(r"([-+*]?)\s*(-?\d+)")


def _equation(line: str) -> tuple[list[str], list[int], int] | None:
    """A worked line ``a op b ... = c`` as (ops, operands, c), the first operand signed; None for anything else."""
    m = _EQUATION.fullmatch(line)
    if m is None:
        return None
    terms = _TERM.findall(m.group(1))
    first = -int(terms[0][1]) if terms[0][0] == "-" else int(terms[0][1])
    return [op for op, _ in terms[1:]], [first] + [int(n) for _, n in terms[1:]], int(m.group(2))


def _holds(ops: list[str], operands: list[int], result: int) -> bool:
    """Whether integers joined by + - * (products first) equal ``result``: read by this rule, never run as code."""
    total, product, sign = 0, operands[0], 1
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            product *= x
            continue
        total, sign, product = total + sign * product, (-1 if op == "-" else 1), x
    return total + sign * product == result


def _worked(text: str) -> list[tuple[int, str]]:
    """(end, line) of each non-blank line before the answer line (``####``)."""
    out, end = [], 0
    for line in text.splitlines(keepends=True):
        end += len(line)
        if line.lstrip().startswith("####"):
            break
        if line.strip():
            out.append((end, line))
    return out


class WorkedLines(StepReward):
    """Each line before the answer line (``#### n``) is a step, 1 when it is an equation of integers joined by
    + - * that holds and works on the right numbers, else 0: those of the reference's line in the same place, except
    where the reference carries an earlier line's result, which the completion carries from its own line there
    (a slip is scored once, where it happened; the lines after it that carry it correctly score 1). Checking only
    that a line holds is gamed: a policy learns to write true sums of the wrong numbers. A reference without worked
    lines gives every step 0. The worked replies of ``datamodules.arithmetic`` are such references."""

    def steps(self, completion: str, answer: str) -> list[tuple[int, float]]:
        reference = [_equation(line) for _, line in _worked(answer)]
        mine, out = [], []
        for k, (end, line) in enumerate(_worked(completion)):
            eq = _equation(line)
            mine.append(eq)
            ref = reference[k] if k < len(reference) else None
            ok = eq is not None and ref is not None and eq[0] == ref[0] and len(eq[1]) == len(ref[1])
            ok = ok and _holds(*eq)
            if ok:
                carried = [(r[2], m[2]) for r, m in zip(reference[:k], mine[:k]) if r is not None and m is not None]
                ok = all(x == want or (want, x) in carried for x, want in zip(eq[1], ref[1]))
            out.append((end, float(ok)))
        return out


def _one(
    reward: Reward, completion: str, answer: str, timeout: float | None, pattern: str | None = None
) -> tuple[float, str | None]:
    """One completion's score from ``reward`` (an ``AnswerReward`` by the answer rule ``pattern``) and why it failed
    (None when it did not; NaN when it did)."""
    rule = (pattern,) if isinstance(reward, AnswerReward) else ()
    try:
        out = timed(reward, timeout, [completion], [answer], *rule)
        value = float(out[0]) if len(out) == 1 else math.nan
    except PastDeadline:
        return math.nan, f"ran past reward_timeout={timeout} s"
    except Exception as err:  # the user's code: any failure is this completion's, named
        return math.nan, f"raised {type(err).__name__}: {err}"
    if not math.isfinite(value):
        return math.nan, f"returned {out!r}, not one finite number"
    return value, None


def _steps(reward: StepReward, completion: str, answer: str, timeout: float | None, pattern: str | None = None):
    """One completion's steps from ``reward`` as (end, score) pairs, ends rising within the text, and why it failed
    (None when it did not; no steps when it did)."""
    try:
        out = timed(reward.steps, timeout, completion, answer)
        steps = [(int(end), float(value)) for end, value in out]
    except PastDeadline:
        return [], f"ran past reward_timeout={timeout} s"
    except Exception as err:  # the user's code, or pairs that are not (int, number)
        return [], f"raised {type(err).__name__}: {err}"
    ends = [end for end, _ in steps]
    if (
        not all(math.isfinite(v) for _, v in steps)
        or ends != sorted(set(ends))
        or any(not 0 < end <= len(completion) for end in ends)
    ):
        return [], f"returned {out!r}, not (end, finite score) pairs with rising ends inside the completion"
    return steps, None


def _guarded(rewards, call, completions: list[str], answers: list[str], timeout, on_error: OnError, failed_as, pattern):
    """Each reward's ``call(reward, completion, answer, timeout, pattern)`` result per completion, ``failed_as``
    where it failed, and how many failed; with ``on_error="stop"`` the first failure raises one line naming it."""
    out, errors = {}, 0
    for reward in rewards:
        mine = []
        for completion, answer in zip(completions, answers):
            value, failed = call(reward, completion, answer, timeout, pattern)
            if failed is not None:
                if on_error == "stop":
                    raise InputError(
                        f"reward {reward.name} {failed} on the completion {completion!r}: fix it, or pass "
                        "--model.init_args.reward_errors=zero to score such completions 0 and count them"
                    )
                errors, value = errors + 1, failed_as
            mine.append(value)
        out[reward] = mine
    return out, errors


def score_steps(
    rewards: Sequence[StepReward],
    completions: list[str],
    answers: list[str],
    timeout: float | None = 5.0,
    on_error: OnError = "stop",
    pattern: str | None = None,
) -> tuple[list[list[tuple[int, float]]], dict[str, list[float]], int]:
    """Each completion's steps from all ``rewards``, each score times its reward's weight (a step two rewards end at
    the same place sums them), each reward's mean step score per completion by name, and how many calls failed
    (guarded as ``score``: a failure stops the run, or with "zero" gives that completion no steps from it)."""
    results, errors = _guarded(rewards, _steps, completions, answers, timeout, on_error, [], pattern)
    merged: list[dict[int, float]] = [{} for _ in completions]
    for reward, per_completion in results.items():
        for i, steps in enumerate(per_completion):
            for end, value in steps:
                merged[i][end] = merged[i].get(end, 0.0) + reward.weight * value
    means = {r.name: [sum(v for _, v in st) / len(st) if st else 0.0 for st in per] for r, per in results.items()}
    return [sorted(m.items()) for m in merged], means, errors


def score(
    rewards: Sequence[Reward],
    completions: list[str],
    answers: list[str],
    timeout: float | None = 5.0,
    on_error: OnError = "stop",
    pattern: str | None = None,
) -> tuple[list[float], dict[str, list[float]], int]:
    """The weighted sum of ``rewards`` per completion, each reward's own scores by name, and how many calls failed;
    an ``AnswerReward`` reads answers by the rule ``pattern`` (None: GSM8K's).

    Each reward is called per completion, so a failure names it: with ``on_error="stop"`` an ``InputError`` (one
    line), with "zero" a score of 0 from that reward, counted.
    """
    results, errors = _guarded(rewards, _one, completions, answers, timeout, on_error, 0.0, pattern)
    total = [sum((r.weight * per[i] for r, per in results.items()), 0.0) for i in range(len(completions))]
    return total, {r.name: per for r, per in results.items()}, errors
