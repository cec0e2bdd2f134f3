"""TaskDataModule: a .jsonl of task records for ``cli.py test`` (or ``validate``) of a GPT; the model scores them
(``zoo.gpt.tasks``).

One kind per file, chosen by ``kind``:

- ``exact_match``: ``{"question": str, "answer": str}`` or ``{"messages": [...], "answer": str}`` (a conversation
  ending in a user turn, with ``chat: true``); the model answers greedily.
- ``multiple_choice``: ``{"query" | "context": str, "choices": [str, ...], "label": int}`` (HellaSwag, ARC and MMLU
  as lm-eval's jsonl has them): each choice scored by its log-likelihood after the context.
- ``bits_per_byte``: ``{"text": str}``.

Prompts are plain text, or with ``chat: true`` the model's chat template applied to the question as a user turn
(with the generation prompt; a multiple-choice choice is then the reply, without ``target_delimiter``). The records
are encoded with the tokenizer of the model under test, once its checkpoint is restored (in the loader). A malformed
record stops the run with one ``error:`` line naming file and line, or is skipped and counted
(``skip_bad_records``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from datamodules.base import check_settings, not_found_message
from zoo.errors import InputError
from zoo.gpt.tasks import check_pattern, encode_pair, encode_plain, reference
from zoo.io.chat_template import ROLES, chat_renderer

Kind = Literal["exact_match", "multiple_choice", "bits_per_byte"]


def _text(record: dict, *keys: str) -> str:
    for key in keys:
        if key in record:
            if not isinstance(record[key], str):
                raise ValueError(f"has a {type(record[key]).__name__} {key!r}, not a string")
            return record[key]
    raise ValueError(f"has no {' or '.join(repr(k) for k in keys)} (found {sorted(record)})")


def _messages(record: dict, chat: bool) -> list[dict]:
    """The prompt as a conversation: a question is one user turn; ``messages`` must end in a user turn."""
    if "messages" not in record:
        return [{"role": "user", "content": _text(record, "question")}]
    if not chat:
        raise ValueError("has 'messages', which need chat: true (--data.init_args.chat=true)")
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("has 'messages' that is not a non-empty list")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"} or not isinstance(m["content"], str):
            raise ValueError(f"message {k} is not an object of exactly 'role' and a string 'content'")
        if m["role"] not in ROLES:
            raise ValueError(f"message {k} has the role {m['role']!r}, not one of {', '.join(ROLES)}")
    if messages[-1]["role"] != "user":
        raise ValueError("has 'messages' ending in a turn that is not the user's (the model answers it)")
    return messages


def _choices(record: dict) -> tuple[list[str], int]:
    choices, label = record.get("choices"), record.get("label")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError("has 'choices' that is not a non-empty list of strings")
    if type(label) is not int or not 0 <= label < len(choices):
        raise ValueError(f"has the label {label!r}, not an index into its {len(choices)} choices")
    return choices, label


class TaskDataModule(LightningDataModule):
    """Task records scored by ``CausalLMModule``'s test (and validation) step; no training split."""

    def __init__(
        self,
        path: str,
        kind: Kind = "multiple_choice",
        chat: bool = False,
        answer_pattern: str | None = None,
        max_new_tokens: int = 256,
        until: list[str] = [],  # noqa: B006 (not mutated; a list default reads best in the CLI)
        target_delimiter: str = " ",
        batch_size: int = 8,
        skip_bad_records: bool = False,
        num_workers: int = 0,
    ) -> None:
        """
        Args:
            path: a .jsonl file of records of one kind.
            kind: exact_match (generated answers), multiple_choice (log-likelihood of each choice) or bits_per_byte.
            chat: render prompts with the model's chat template (a user turn and the generation prompt).
            answer_pattern: exact_match: the answer rule, a regex whose one group at its first match is the answer,
                in the generated text and in the record's answer (``'Answer: (.+)'``); None: GSM8K's
                ``#### <number>``, and in a generated text without one its last number. GRPO reads answers by the
                same rule (``datamodules.PromptDataModule``'s answer_pattern).
            max_new_tokens: exact_match: the most tokens generated per answer.
            until: exact_match: the generated text is cut at the first of these strings (``"Question:"``, say).
            target_delimiter: multiple_choice without chat: put between the context and each choice (lm-eval's).
            batch_size: records per batch (a multiple-choice batch scores all its records' choices in one forward).
            skip_bad_records: skip malformed records, counting them, instead of stopping at the first with its line.
            num_workers: DataLoader worker processes.
        """
        super().__init__()
        self.save_hyperparameters()
        if not Path(path).is_file():
            raise FileNotFoundError(not_found_message("task records file", path, "pass --data.init_args.path"))
        if chat and kind == "bits_per_byte":
            raise InputError("chat: true renders prompts, and bits_per_byte has none: leave chat false")
        check_settings(at_least=1, batch_size=batch_size, max_new_tokens=max_new_tokens)
        check_settings(at_least=0, num_workers=num_workers)
        check_pattern(answer_pattern)
        self.path, self.kind, self.chat, self.answer_pattern = path, kind, chat, answer_pattern
        self.max_new_tokens, self.until, self.target_delimiter = max_new_tokens, list(until), target_delimiter
        self.batch_size, self.skip_bad_records, self.num_workers = batch_size, skip_bad_records, num_workers
        self.tokenizer = None  # the model's, unless set by the caller
        self.skipped = 0

    def _ensure_tokenizer(self):
        if self.tokenizer is None:  # the model under test carries its own, restored from its checkpoint
            module = getattr(getattr(self, "trainer", None), "lightning_module", None)
            self.tokenizer = getattr(module, "tokenizer", None)
        if self.tokenizer is None:
            raise InputError(
                "the model has no tokenizer to encode the task records: test a checkpoint trained on text "
                "(it carries its tokenizer)"
            )
        return self.tokenizer

    # -- records -----------------------------------------------------------------------------------------------

    def items(self) -> list[tuple]:
        """Every good record encoded for its kind, in file order."""
        self.skipped, tokenizer, out = 0, self._ensure_tokenizer(), []
        render = chat_renderer(tokenizer) if self.chat else None
        with open(self.path, "rb") as f:  # bytes: a line that is not UTF-8 is that record's fault, named by line
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise ValueError(f"is a JSON {type(record).__name__}, not an object")
                    out.append(self._encode(record, tokenizer, render))
                except (ValueError, RecursionError) as err:  # JSON's and UTF-8's errors are ValueErrors
                    self._bad(f"{self.path}:{n}", str(err) if isinstance(err, ValueError) else "nested too deep")
        if self.skipped:
            rank_zero_info(f"TaskDataModule: {self.skipped} bad records of {self.path} skipped")
        if not out:
            raise InputError(f"{self.path} holds no {self.kind} records: give a .jsonl with one record per line")
        return out

    def _bad(self, where: str, why: str) -> None:
        if not self.skip_bad_records:
            raise InputError(
                f"{where} {why}: fix the record, or pass --data.init_args.skip_bad_records=true to skip such records"
            )
        self.skipped += 1

    def _encode(self, record: dict, tokenizer, render) -> tuple:
        if self.kind == "bits_per_byte":
            text = _text(record, "text")
            if not text:
                raise ValueError("has an empty 'text' (no bytes to score)")
            return tokenizer.encode(text), len(text.encode("utf-8"))
        if self.kind == "exact_match":
            answer = record.get("answer")
            if not isinstance(answer, str) and type(answer) is not int:
                raise ValueError(f"has the answer {answer!r}, not a string or a whole number")
            if reference(str(answer), self.answer_pattern) is None:
                raise ValueError("has an empty answer")
            messages = _messages(record, self.chat)
            ids = render(messages, True).ids if render else tokenizer.encode(messages[0]["content"])
            return ids or [tokenizer.eos_id], str(answer)
        context = _text(record, "query", "context")
        choices, label = _choices(record)
        if render:  # the choice is the reply after the template's generation prompt, encoded on its own
            ctx = render([{"role": "user", "content": context}], True).ids
            conts = [encode_plain(tokenizer, c) for c in choices]
        else:
            pairs = [encode_pair(tokenizer, context, self.target_delimiter + c) for c in choices]
            ctx, conts = pairs[0][0], [cont for _, cont in pairs]
        return ctx, conts, [len(c) for c in choices], [len(c.encode("utf-8")) for c in choices], label

    # -- batches -----------------------------------------------------------------------------------------------

    def _loader(self) -> DataLoader:
        settings = {"answer_pattern": self.answer_pattern, "until": self.until, "max_new_tokens": self.max_new_tokens}
        batches = functools.partial(collate, kind=self.kind, settings=settings)  # picklable for workers
        records = list(enumerate(self.items()))  # each carries its index: ranks' padded repeats are counted once
        return DataLoader(
            records, batch_size=self.batch_size, shuffle=False, collate_fn=batches, num_workers=self.num_workers
        )

    def scored_file(self, stage: str) -> str:
        """The file ``test`` and ``validate`` score (the report card names it: ``zoo.tracking.report``)."""
        return self.path

    def test_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()


def collate(records: list[tuple[int, tuple]], kind: str, settings: dict) -> dict:
    """A batch for ``zoo.gpt.tasks`` of (file index, item) records: ``index`` is each record's place in the file (a
    DistributedSampler repeats records to even out the ranks; the metrics count each index once); a multiple-choice
    batch lists every (context, choice) pair with its record and choice index; ``prompt_ids`` (contexts, prompts,
    texts) are what throughput counts."""
    index, items = torch.tensor([k for k, _ in records]), [item for _, item in records]
    ids = [torch.as_tensor(item[0], dtype=torch.long) for item in items]
    if kind == "bits_per_byte":
        return {"task": kind, "index": index, "prompt_ids": ids, "bytes": torch.tensor([n for _, n in items])}
    if kind == "exact_match":
        return {"task": kind, "index": index, "prompt_ids": ids, "answers": [answer for _, answer in items], **settings}
    where = [(r, c) for r, item in enumerate(items) for c in range(len(item[1]))]
    return {
        "task": kind,
        "index": index,
        "prompt_ids": ids,
        "pairs": [(item[0], cont) for item in items for cont in item[1]],
        "record": torch.tensor([r for r, _ in where]),
        "choice": torch.tensor([c for _, c in where]),
        "chars": torch.tensor([n for item in items for n in item[2]]),
        "bytes": torch.tensor([n for item in items for n in item[3]]),
        "labels": torch.tensor([item[4] for item in items]),
    }
