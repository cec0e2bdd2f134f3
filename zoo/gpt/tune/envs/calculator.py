"""Arithmetic with a calculator tool: the project's arithmetic task at a size where recalled facts fail (4 terms of
2-digit numbers), solved by calling the calculator and answering ``Answer: N``.

The calculator reads arithmetic by its own rules, a recursive-descent parser of integers, ``+ - * /``, unary signs
and parentheses (no ``eval``, no import, nothing else), exact in fractions. Its input is at most
``MAX_EXPRESSION_CHARS`` characters nested at most ``MAX_DEPTH`` deep; every value it makes is kept under
``MAX_DIGITS`` digits (a product past it is refused before it is used again), so no input makes it slow or large. A
division by zero, a character it does not read or a value past the bound is a ``ToolError``: a message to the model.
"""

from __future__ import annotations

import hashlib
import re
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Literal

from zoo.errors import InputError
from zoo.gpt.tune.envs.base import OnToolError, TextEnv, Tool, ToolError, user

MAX_EXPRESSION_CHARS = 200
MAX_DEPTH = 32
MAX_DIGITS = 40  # of a value's numerator and denominator
TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")
ANSWER = re.compile(r"Answer:\s*(-?\d{1,30})\b")


def evaluate(expression: str) -> Fraction:
    """``expression``'s exact value; a ``ToolError`` saying what is wrong with it."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"an expression is a string of at most {MAX_EXPRESSION_CHARS} characters")
    tokens, at = [], 0
    while at < len(expression.rstrip()):
        match = TOKEN.match(expression, at)
        if match is None:
            raise ToolError(f"unexpected character {expression[at:].lstrip()[:1]!r}: use integers, + - * / and ( )")
        tokens.append(int(match[1]) if match[1] else match[2])
        at = match.end()
    parser = _Parser(tokens)
    value = parser.sum(0)
    if parser.at < len(tokens):
        raise ToolError(f"unexpected {tokens[parser.at]!r} after a complete expression")
    return value


class _Parser:
    """expr := term (("+" | "-") term)*; term := factor (("*" | "/") factor)*; factor := ("+" | "-") factor |
    integer | "(" expr ")"."""

    def __init__(self, tokens: list) -> None:
        self.tokens, self.at = tokens, 0

    def peek(self):
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def sum(self, depth: int) -> Fraction:
        value = self.product(depth)
        while self.peek() in ("+", "-"):
            op = self.tokens[self.at]
            self.at += 1
            right = self.product(depth)
            value = bounded(value + right if op == "+" else value - right)
        return value

    def product(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.tokens[self.at]
            self.at += 1
            right = self.factor(depth)
            if op == "/" and right == 0:
                raise ToolError("division by zero")
            value = bounded(value * right if op == "*" else value / right)
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise ToolError(f"nested more than {MAX_DEPTH} deep")
        token = self.peek()
        self.at += 1
        if token in ("+", "-"):
            value = self.factor(depth + 1)
            return -value if token == "-" else value
        if token == "(":
            value = self.sum(depth + 1)
            if self.peek() != ")":
                raise ToolError("a ( without its )")
            self.at += 1
            return value
        if isinstance(token, int):
            return bounded(Fraction(token))
        raise ToolError("the expression ends too soon" if token is None else f"unexpected {token!r}")


def bounded(value: Fraction) -> Fraction:
    if max(abs(value.numerator), value.denominator) >= 10**MAX_DIGITS:
        raise ToolError(f"a value past {MAX_DIGITS} digits")
    return value


def shown(value: Fraction) -> str:
    """An integer as itself; another value as a decimal of 12 significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    with localcontext() as context:
        context.prec = 12
        return str(Decimal(value.numerator) / Decimal(value.denominator))


class Calculator(Tool):
    name = "calculator"
    description = "Evaluate arithmetic: integers, + - * / and parentheses."
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}

    def __call__(self, expression: str) -> str:
        return shown(evaluate(expression))


class CalculatorEnv(TextEnv):
    """``zoo/Calculator-v0``: ``What is 37 + 12 * 45 - 81?``; a reply of ``Answer: N`` ends the episode, reward 1
    when N is the value (``*`` before ``+`` and ``-``), else 0; a reply with neither an answer nor a tool call ends
    it with 0. The calculator is the one tool. ``split`` keeps the held-out problems (the share ``test_share`` of all,
    by the hash of the question, whatever the seed) out of training."""

    toolbox = (Calculator(),)

    def __init__(
        self,
        digits: int = 2,
        terms: int = 4,
        ops: str = "+-*",
        split: Literal["train", "test", "all"] = "train",
        test_share: float = 0.1,
        max_turns: int = 4,
        tool_timeout: float = 1.0,
        max_tool_chars: int = 2000,
        on_tool_error: OnToolError = "end",
        step_latency: float = 0.0,
    ) -> None:
        """
        Args:
            digits: digits of every number (10 to 99 for 2).
            terms: numbers per problem.
            ops: the operators drawn from, made of + - *.
            split: draw from the training problems, the held-out ones, or all.
            test_share: the share of problems held out (by the hash of the question).
            max_turns, tool_timeout, max_tool_chars, on_tool_error, step_latency: as TextEnv's.
        """
        super().__init__(max_turns, tool_timeout, max_tool_chars, on_tool_error, step_latency)
        if not (1 <= digits <= 6 and 2 <= terms <= 12 and ops and set(ops) <= set("+-*")):
            raise InputError("digits is 1 to 6, terms 2 to 12, ops made of + - *")
        if split not in ("train", "test", "all") or not 0 < test_share < 1:
            raise InputError(f"split={split!r} is train, test or all, and test_share is between 0 and 1")
        self.digits, self.terms, self.ops, self.split, self.test_share = digits, terms, ops, split, test_share
        self.expression, self.answer = "", 0

    def held_out(self, expression: str) -> bool:
        digest = int.from_bytes(hashlib.sha256(expression.encode()).digest()[:8], "big")
        return digest < self.test_share * 2**64

    def draw(self) -> str:
        low, high = 10 ** (self.digits - 1), 10**self.digits
        numbers = self.np_random.integers(low, high, size=self.terms)
        ops = self.np_random.choice(list(self.ops), size=self.terms - 1)
        return " ".join([str(numbers[0]), *(f"{op} {n}" for op, n in zip(ops, numbers[1:]))])

    def observe_start(self) -> list[dict]:
        while True:
            self.expression = self.draw()
            if self.split == "all" or self.held_out(self.expression) == (self.split == "test"):
                break
        self.answer = int(evaluate(self.expression))
        return user(f"What is {self.expression}?")

    def respond(self, text: str) -> tuple[list[dict], float, bool]:
        found = ANSWER.search(text)
        self.success = found is not None and int(found[1]) == self.answer
        return [], float(self.success), True
