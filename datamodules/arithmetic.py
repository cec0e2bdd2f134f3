"""A task the project generates whose answers are checkable: arithmetic with worked replies, answers GSM8K-style.

A problem is ``terms`` whole numbers of 1 to ``digits`` digits joined by operators drawn from ``ops``
(``+``, ``-``, ``*``): "What is 47+8*12?". The reply works it one operation per line in the usual precedence
(every ``*`` first, then ``+`` and ``-``, each left to right) and ends with GSM8K's final-answer line
``#### <answer>``; ``answer_of`` is the extraction rule (the number after the last ``####``). Difficulty grows with
``digits``, ``terms`` and ``*`` in ``ops``: the knobs that place a small model's exact match where a later stage
has room to improve.

``write_task`` writes into a folder, from a seed, with no download:

  - ``sft.jsonl``: ``{"messages": [user question, assistant worked reply]}`` (``ChatDataModule``'s records);
  - ``dpo.jsonl``: TRL's conversational preference pairs ``{"prompt": [user], "chosen": [assistant],
    "rejected": [assistant]}``, chosen the correct working, rejected a plausible slip (one step's result off by 1 or
    10, carried through the later steps) whose final answer is wrong;
  - ``test.jsonl``: GSM8K's ``{"question", "answer"}``, the answer the worked reply ending ``#### <number>``;
  - ``mc.jsonl``: ``{"query", "choices", "label"}``, the test questions, choices the worked reply and three slipped
    ones (distinct wrong answers): which working the model finds likelier;
  - ``pretrain.txt``: sft.jsonl's problems as plain text (question, worked reply, a blank line), no chat format: the
    corpus of a base stage (``TextDataModule``'s ``generate``) that SFT then teaches the chat format.

Held out by construction: a problem is a test problem when the first byte of the SHA-256 of its question is below
``test_share * 256``, so the training files (drawn from the other side) never hold a test question, whatever the
seed or the counts. ``prepare_task`` writes the folder once and rewrites it only when the settings change (they are
kept in ``task.json``); a folder with these files and no ``task.json`` is someone else's data and is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import InputError

TASK_FILES = {"sft": "sft.jsonl", "dpo": "dpo.jsonl", "test": "test.jsonl", "mc": "mc.jsonl"}
PRETRAIN_FILE = "pretrain.txt"
SETTINGS_FILE = "task.json"
ANSWER = re.compile(r"####\s*(-?[\d,]+)")
SLIPS = (-10, -1, 1, 10)  # a digit dropped or carried wrong: off by one in the last or the tens place
MAX_DRAWS = 200  # draws per problem wanted before a too-small problem space is refused
FORMAT = 2  # the files' layout, kept in task.json: a folder written by an older layout is written again


@dataclass(frozen=True)
class ArithmeticTask:
    """The generated task's settings (``data.init_args.generate`` in a config).

    Args:
        digits: the most digits of a number (1 to ``digits``, uniformly many).
        terms: numbers per problem (2 or more).
        ops: the operators drawn from, e.g. "+", "+-", "+-*".
        train: conversations in sft.jsonl (drawn with repeats from the training side).
        pairs: preference pairs in dpo.jsonl (from the training side).
        test: distinct held-out problems in test.jsonl and mc.jsonl.
        test_share: the share of all problems on the held-out side (by the hash of the question).
        seed: the seed of the draws (the held-out side does not depend on it).
    """

    digits: int = 2
    terms: int = 2
    ops: str = "+-"
    train: int = 4000
    pairs: int = 1000
    test: int = 200
    test_share: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [
            (name, rule)
            for name, ok, rule in (
                ("digits", self.digits >= 1, "1 or more"),
                ("terms", self.terms >= 2, "2 or more"),
                ("ops", bool(self.ops) and set(self.ops) <= set("+-*"), 'made of "+", "-" and "*"'),
                ("train", self.train >= 1, "1 or more"),
                ("pairs", self.pairs >= 0, "0 or more"),
                ("test", self.test >= 1, "1 or more"),
                ("test_share", 0 < self.test_share < 1, "in (0, 1)"),
            )
            if not ok
        ]
        if bad:
            name, rule = bad[0]
            raise InputError(f"data.init_args.generate.{name}={getattr(self, name)!r} must be {rule}")


@dataclass(frozen=True)
class Problem:
    numbers: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def question(self) -> str:
        expr = str(self.numbers[0]) + "".join(f"{o}{n}" for o, n in zip(self.ops, self.numbers[1:]))
        return f"What is {expr}?"

    def work(self, slip: tuple[int, int] | None = None) -> tuple[list[str], int]:
        """The worked lines and the answer; ``slip`` (step, delta) adds delta to that step's result."""
        nums, ops, lines = list(self.numbers), list(self.ops), []
        while ops:
            i = ops.index("*") if "*" in ops else 0  # precedence: products first, each kind left to right
            a, op, b = nums[i], ops[i], nums[i + 1]
            c = a * b if op == "*" else a + b if op == "+" else a - b
            if slip is not None and slip[0] == len(lines):
                c += slip[1]
            lines.append(f"{a}{op}{b} = {c}")
            nums[i : i + 2], ops[i : i + 1] = [c], []
        return lines, nums[0]

    def reply(self, slip: tuple[int, int] | None = None) -> str:
        lines, answer = self.work(slip)
        return "\n".join(lines) + f"\n#### {answer}"

    def answer(self) -> int:
        return self.work()[1]

    def wrong_slip(self, rng: random.Random) -> tuple[int, int]:
        """A slip whose final answer is wrong: a random step's, else the last step's (always changes it)."""
        slip = (rng.randrange(len(self.ops)), rng.choice(SLIPS))
        if self.work(slip)[1] == self.answer():  # a slip multiplied by zero later: not a wrong answer
            slip = (len(self.ops) - 1, slip[1])
        return slip


def answer_of(text: str) -> str | None:
    """The extraction rule: the number after the last ``####`` (commas dropped, as GSM8K's), or None."""
    found = ANSWER.findall(text)
    return found[-1].replace(",", "") if found else None


def held_out(question: str, share: float) -> bool:
    """Whether ``question`` is on the held-out side: by its hash, so no seed or count moves it."""
    return hashlib.sha256(question.encode()).digest()[0] < share * 256


def _number(digits: int, rng: random.Random) -> int:
    k = rng.randint(1, digits)  # as many 1-digit as 3-digit numbers: short ones are not drowned out
    return rng.randrange(0 if k == 1 else 10 ** (k - 1), 10**k)


def _draw(task: ArithmeticTask, rng: random.Random) -> Problem:
    numbers = tuple(_number(task.digits, rng) for _ in range(task.terms))
    return Problem(numbers, tuple(rng.choice(task.ops) for _ in range(task.terms - 1)))


def draw(task: ArithmeticTask, n: int, test_side: bool, rng: random.Random, distinct: bool) -> list[Problem]:
    """``n`` problems from one side of the split (distinct ones when asked); refused when the side is too small."""
    out, seen = [], set()
    for _ in range(MAX_DRAWS * n):
        p = _draw(task, rng)
        if held_out(p.question, task.test_share) != test_side or (distinct and p.question in seen):
            continue
        out.append(p)
        seen.add(p.question)
        if len(out) == n:
            return out
    side = "held-out" if test_side else "training"
    raise InputError(
        f"the arithmetic task's {side} side has too few problems for {n} (digits={task.digits}, terms={task.terms}, "
        f"ops={task.ops!r}, test_share={task.test_share}): ask for fewer, or more digits or terms"
    )


def _choices(p: Problem, rng: random.Random) -> tuple[list[str], int]:
    """The worked reply and three slipped ones with distinct wrong answers, shuffled; the right one's index.

    Whole replies, not bare numbers: the model answers by working, so a bare number after the generation prompt is
    a reply it never writes, and its log-likelihood would say nothing about the arithmetic."""
    right, wrong = p.answer(), {}
    slips = [(step, d) for step in range(len(p.ops)) for d in SLIPS]
    rng.shuffle(slips)
    for slip in slips:
        value = p.work(slip)[1]
        if value != right and value not in wrong:
            wrong[value] = p.reply(slip)
        if len(wrong) == 3:
            break
    choices = [p.reply(), *[wrong[v] for v in sorted(wrong)]]
    rng.shuffle(choices)
    return choices, choices.index(p.reply())


def records(task: ArithmeticTask) -> dict[str, list[dict]]:
    """Each file's records, from ``task.seed`` alone."""
    rng = random.Random(task.seed)
    train = draw(task, task.train, False, rng, distinct=False)
    pairs = draw(task, task.pairs, False, rng, distinct=False) if task.pairs else []
    test = draw(task, task.test, True, rng, distinct=True)

    def user(p: Problem) -> dict:
        return {"role": "user", "content": p.question}

    def said(reply: str) -> list[dict]:
        return [{"role": "assistant", "content": reply}]

    mc = []
    for p in test:
        choices, label = _choices(p, rng)
        mc.append({"query": p.question, "choices": choices, "label": label})
    return {
        "sft": [{"messages": [user(p), *said(p.reply())]} for p in train],
        "dpo": [
            {"prompt": [user(p)], "chosen": said(p.reply()), "rejected": said(p.reply(p.wrong_slip(rng)))}
            for p in pairs
        ],
        "test": [{"question": p.question, "answer": p.reply()} for p in test],
        "mc": mc,
    }


def pretrain_text(sft: list[dict]) -> str:
    """The conversations' text with no chat format: each question, its worked reply and a blank line."""
    return "".join("\n".join(m["content"] for m in r["messages"]) + "\n\n" for r in sft)


def _settings(task: ArithmeticTask) -> dict:
    return dataclasses.asdict(task) | {"format": FORMAT}


def write_task(folder: str | Path, task: ArithmeticTask) -> Path:
    """The task's files and ``task.json`` written into ``folder``; returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = records(task)
    texts = {name: "".join(json.dumps(r) + "\n" for r in rows[name]) for name in rows}
    files = {TASK_FILES[name]: text for name, text in texts.items()} | {PRETRAIN_FILE: pretrain_text(rows["sft"])}
    for name, text in files.items():
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(folder / name)  # whole files only: a reader never sees half of one
    (folder / SETTINGS_FILE).write_text(json.dumps(_settings(task), sort_keys=True) + "\n")
    return folder


class GeneratedTask:
    """Mixed into a DataModule of the task (``path``, ``generate``): with ``generate``, ``path`` is the folder the
    task is written into (once per node, in ``prepare_data``) and the module trains on its ``task_file``."""

    task_file: str  # a key of TASK_FILES

    def prepare_data(self) -> None:
        if self.generate is not None:  # once per node, before setup on every rank
            prepare_task(self.path, self.generate)

    def _train_path(self) -> str:
        if self.generate is None:
            return self.path
        return str(prepare_task(self.path, self.generate) / TASK_FILES[self.task_file])  # written already: checked


def prepare_task(folder: str | Path, task: ArithmeticTask) -> Path:
    """``folder`` holding ``task``'s files: written when missing or made with other settings; a folder with such
    files that this did not write is refused (it is someone's data). What every datamodule of the task calls."""
    folder = Path(folder)
    settings = folder / SETTINGS_FILE
    if settings.is_file():
        same = json.loads(settings.read_text()) == _settings(task)
        # A folder written before pretrain.txt existed is written again.
        if same and all((folder / f).is_file() for f in [*TASK_FILES.values(), PRETRAIN_FILE]):
            return folder
    elif any((folder / f).exists() for f in TASK_FILES.values()):
        raise InputError(
            f"{folder} holds task files but no {SETTINGS_FILE}: it is not a generated task; pass another "
            f"--data.init_args.path for the generated one, or leave out --data.init_args.generate to train on it"
        )
    return write_task(folder, task)
