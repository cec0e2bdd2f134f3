"""The generated arithmetic task: every worked step and answer is right (checked by Python's own arithmetic), the
held-out questions never reach a training file, preference pairs and choices are wrong where they should be, the
files repeat from a seed, and ``ChatDataModule(generate=...)`` writes the task on a fresh clone and trains on it."""

from __future__ import annotations

import json
import re

import pytest

from datamodules import ChatDataModule, PreferenceDataModule, TextDataModule
from datamodules.arithmetic import (
    PRETRAIN_FILE,
    TASK_FILES,
    ArithmeticTask,
    Problem,
    answer_of,
    held_out,
    prepare_task,
    write_task,
)
from zoo.errors import InputError

TASK = ArithmeticTask(digits=2, terms=3, ops="+-*", train=300, pairs=100, test=40, seed=3)
STEP = re.compile(r"(-?\d+)([+\-*])(\d+) = (-?\d+)")


def _value(question: str) -> int:
    expr = re.fullmatch(r"What is ([\d+\-*]+)\?", question).group(1)
    return eval(expr, {"__builtins__": {}})  # the oracle: Python's own precedence, on a string of digits and ops


def _files(folder) -> dict[str, list[dict]]:
    return {k: [json.loads(line) for line in (folder / f).read_text().splitlines()] for k, f in TASK_FILES.items()}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return _files(write_task(tmp_path_factory.mktemp("arith"), TASK))


def _checked_reply(question: str, reply: str) -> int:
    """The reply's answer once each of its steps is checked to be arithmetic that holds."""
    *steps, last = reply.split("\n")
    for line in steps:
        a, op, b, c = STEP.fullmatch(line).groups()
        assert int(c) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op], line
    assert last == f"#### {answer_of(reply)}" and len(steps) == TASK.terms - 1
    return int(answer_of(reply))


def test_every_worked_reply_is_right_and_ends_with_the_answer_python_computes(task):
    for r in task["sft"]:
        user, assistant = r["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert _checked_reply(user["content"], assistant["content"]) == _value(user["content"])
    for r in task["test"]:
        assert _checked_reply(r["question"], r["answer"]) == _value(r["question"])


def test_held_out_questions_are_in_no_training_file_and_are_distinct(task):
    test = [r["question"] for r in task["test"]]
    trained = {r["messages"][0]["content"] for r in task["sft"]} | {r["prompt"][0]["content"] for r in task["dpo"]}
    assert len(set(test)) == len(test) == TASK.test and not set(test) & trained
    assert all(held_out(q, TASK.test_share) for q in test) and not any(held_out(q, TASK.test_share) for q in trained)
    assert [r["query"] for r in task["mc"]] == test


def test_pairs_reject_a_wrong_answer_and_choices_hold_the_answer_once(task):
    for r in task["dpo"]:
        q, chosen, rejected = r["prompt"][0]["content"], r["chosen"][0]["content"], r["rejected"][0]["content"]
        assert int(answer_of(chosen)) == _value(q) != int(answer_of(rejected))
        assert chosen.split("\n")[0].split(" = ")[0] == rejected.split("\n")[0].split(" = ")[0]  # the same working
    for r in task["mc"]:
        answers = [int(answer_of(c)) for c in r["choices"]]
        assert len(set(answers)) == 4 and answers[r["label"]] == _value(r["query"])
        assert len({c.split(" = ")[0] for c in r["choices"]}) == 1  # worked replies, all of the same question


def test_a_slip_that_a_later_product_by_zero_would_cancel_is_moved_to_the_last_step():
    import random

    p = Problem((7, 8, 0), ("*", "*"))  # 7*8 = 56, 56*0 = 0: a slip in the first step leaves the answer right
    rng = random.Random(0)
    assert all(p.work(p.wrong_slip(rng))[1] != p.answer() for _ in range(50))


def test_the_files_repeat_from_a_seed_and_the_extraction_rule_is_gsm8ks(task, tmp_path):
    assert _files(write_task(tmp_path / "again", TASK)) == task
    other = _files(write_task(tmp_path / "other", ArithmeticTask(**{**TASK.__dict__, "seed": 4})))
    assert other["sft"] != task["sft"]
    assert answer_of("12+3 = 15\n#### 1,015") == "1015" and answer_of("#### 2\n#### -7") == "-7"
    assert answer_of("no answer line") is None


def test_prepare_task_rewrites_on_new_settings_and_refuses_a_folder_it_did_not_write(tmp_path):
    small = ArithmeticTask(train=20, pairs=5, test=5)
    folder = prepare_task(tmp_path / "t", small)
    (folder / "sft.jsonl").write_text("kept\n")  # same settings: not written again
    assert prepare_task(folder, small) == folder and (folder / "sft.jsonl").read_text() == "kept\n"
    prepare_task(folder, ArithmeticTask(train=21, pairs=5, test=5))
    assert len((folder / "sft.jsonl").read_text().splitlines()) == 21
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "sft.jsonl").write_text("{}\n")
    with pytest.raises(InputError, match="not a generated task"):
        prepare_task(tmp_path / "mine", small)
    with pytest.raises(InputError, match="too few problems"):
        prepare_task(tmp_path / "tiny", ArithmeticTask(digits=1, terms=2, ops="+", test=50))
    with pytest.raises(InputError, match="generate.terms"):
        ArithmeticTask(terms=1)


def test_chat_data_generates_the_task_where_missing_and_trains_on_its_sft_file(tmp_path):
    dm = ChatDataModule(str(tmp_path / "fresh"), tokenizer="bytes", val_fraction=0.1, generate=TASK)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) == TASK.train and (tmp_path / "fresh" / "test.jsonl").is_file()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape[0] == dm.batch_size and (y >= 0).any()


def test_the_base_and_dpo_stages_generate_the_same_folder_and_read_its_plain_text_and_pairs(tmp_path):
    """TextDataModule trains on pretrain.txt (the sft problems as plain text: no chat format, no test question),
    PreferenceDataModule on dpo.jsonl; either writes the task on a fresh clone, and an old folder without
    pretrain.txt is written again."""
    folder = tmp_path / "fresh"
    text = TextDataModule(str(folder), block_size=32, batch_size=4, samples_per_epoch=8, generate=TASK)
    text.prepare_data()
    text.setup("fit")
    plain = (folder / PRETRAIN_FILE).read_text()
    sft = [json.loads(line)["messages"] for line in (folder / TASK_FILES["sft"]).read_text().splitlines()]
    assert plain == "".join(f"{user['content']}\n{reply['content']}\n\n" for user, reply in sft)
    assert "<|" not in plain and not any(held_out(q, TASK.test_share) for q in re.findall(r"What is .*\?", plain))
    assert len(text.train_set.tokens) + len(text.val_set.tokens) == len(plain.encode()) + 1  # bytes and one EOS
    pairs = PreferenceDataModule(str(folder), tokenizer="bytes", block_size=128, val_fraction=0.1, generate=TASK)
    pairs.prepare_data()
    pairs.setup("fit")
    assert len(pairs.train_set) + len(pairs.val_set) == TASK.pairs
    (folder / PRETRAIN_FILE).unlink()
    assert (prepare_task(folder, TASK) / PRETRAIN_FILE).read_text() == plain


def test_a_folder_of_an_older_layout_is_written_again(tmp_path):
    small = ArithmeticTask(train=10, pairs=2, test=3)
    folder = prepare_task(tmp_path / "task", small)
    settings = json.loads((folder / "task.json").read_text())
    (folder / "task.json").write_text(json.dumps({k: v for k, v in settings.items() if k != "format"}))
    (folder / "mc.jsonl").write_text("old\n")
    prepare_task(folder, small)
    assert (folder / "mc.jsonl").read_text() != "old\n" and json.loads((folder / "task.json").read_text()) == settings
