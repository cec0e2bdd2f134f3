"""PromptDataModule: prompts with checkable answers, for reinforcement learning on a GPT (``zoo.gpt.GRPOModule``).

Each line of a ``.jsonl`` file (or of each ``.jsonl`` under a folder, in name order) is one prompt with its answer:

- GSM8K's ``{"question": str, "answer": str}`` (the arithmetic task's test.jsonl; the answer may be a worked
  solution ending ``#### <n>``: the rewards compare what follows its last ``####``);
- ``{"messages": [...], "answer": str}``, a conversation ending in a user turn;
- a chat record ``{"messages": [..., user, assistant]}`` with no ``answer``: the last assistant turn is the answer
  and the turns before it the prompt (the arithmetic task's sft.jsonl).

The answers are read by ``answer_pattern``, ``cli.py test``'s answer rule (``zoo.gpt.tasks``): a regex whose one
group at its first match is the answer, in the completions and the references alike (by default GSM8K's
``#### <n>``); each batch carries it to the rewards and the accuracies. An ``answer`` is what the rule reads in it,
else itself; a reply (a chat record's last assistant turn) is never the answer itself, so a reply the rule cannot
read is a bad record: one ``error:`` line naming file and line, never a reward of 0 for every completion of it.

The prompt is rendered with the tokenizer's chat template and its generation prompt (``zoo.io.chat_template``, as
``TaskDataModule`` with ``chat: true``), so the policy answers as it was fine-tuned to. A batch is a dict:
``prompt_ids`` (a list of 1-D int64 tensors, unpadded: the rollout pads them) and ``answers`` (strings). The
training order is an epoch-seeded shuffle, and under DDP Lightning's distributed sampler gives each rank other
prompts, so each group of G completions is whole on its rank.

With ``generate`` (``datamodules.arithmetic.ArithmeticTask``), ``path`` is the folder the arithmetic task is written
into: its sft.jsonl questions are trained on and their last ``val_fraction`` validates (the conversations
``ChatDataModule`` held out at the same fraction), so the held-out test.jsonl is left for ``cli.py test``: a checkpoint
chosen by validation is never chosen on the problems that score it. A malformed record is one
``error:`` line naming its file and line, or, with ``skip_bad_records``, skipped and counted; a prompt longer than
``max_prompt_tokens`` is dropped and counted.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info

from datamodules.arithmetic import ArithmeticTask, GeneratedTask
from datamodules.base import SplitLoaders, check_settings, not_found_message
from datamodules.chat import ensure_tokenizer, messages_of, read_records
from datamodules.tasks import _messages
from datamodules.text import TakesAFolder
from zoo.errors import InputError
from zoo.gpt.tasks import check_pattern, read_answer, reference
from zoo.io.chat_template import chat_renderer
from zoo.io.tokenizers import Tokenizer

Prompt = tuple[list[dict], str]  # the conversation to answer, the reference answer


def prompt_of(record: object, pattern: str | None = None) -> Prompt:
    """The prompt and answer a record holds, checked, the answer readable by the rule ``pattern``; a ValueError says
    what is wrong with it."""
    if not isinstance(record, dict):
        raise ValueError(f"is a JSON {type(record).__name__}, not an object")
    if "answer" not in record and "messages" in record:
        messages = messages_of(record)
        if messages[-1]["role"] != "assistant":
            raise ValueError("has no 'answer' and does not end in an assistant turn (the answer)")
        reply = messages[-1]["content"]
        if read_answer(reply, pattern) is None:
            rule = pattern or "#### <number>"
            raise ValueError(
                f"has a reply in which the answer rule {rule!r} reads no answer (it ends {reply[-40:]!r}): set "
                "--data.init_args.answer_pattern to a regex whose one group is the answer, e.g. 'Answer: (.+)'"
            )
        return messages[:-1], reply
    answer = record.get("answer")
    if type(answer) is int:
        answer = str(answer)
    if not isinstance(answer, str):
        raise ValueError(f"has the answer {answer!r}, not a string or a whole number")
    if reference(answer, pattern) is None:
        raise ValueError("has an empty answer")
    return _messages(record, chat=True), answer


def collate(items: list[tuple[list[int], str]], answer_pattern: str | None = None) -> dict:
    """A batch: the prompts' ids, their answers and the answer rule that reads them."""
    return {
        "prompt_ids": [torch.tensor(ids, dtype=torch.long) for ids, _ in items],
        "answers": [a for _, a in items],
        "answer_pattern": answer_pattern,
    }


class PromptDataModule(TakesAFolder, GeneratedTask, SplitLoaders, LightningDataModule):
    """Prompts with answers rendered with the model's chat template; ``self.tokenizer`` is set by ``setup``."""

    task_file = "sft"

    def __init__(
        self,
        path: str,
        val_path: str | None = None,
        val_fraction: float = 0.1,
        tokenizer: Literal["pretrained", "bytes", "gpt2"] = "pretrained",
        pretrained_dir: str | None = None,
        gpt2_dir: str | None = None,
        answer_pattern: str | None = None,
        max_prompt_tokens: int = 256,
        batch_size: int = 8,
        val_batch_size: int = 32,
        skip_bad_records: bool = False,
        num_workers: int = 0,
        seed: int = 0,
        generate: ArithmeticTask | None = None,
    ) -> None:
        """
        Args:
            path: a .jsonl file of prompts with answers, or a folder of them (the task's folder with ``generate``).
            val_path: prompts to validate on; None: the last val_fraction of path's (of sft.jsonl's with
                ``generate``).
            val_fraction: the share of path's records (the last ones) held out when there is no val_path.
            tokenizer: pretrained (a model folder's own, from pretrained_dir), bytes or gpt2 (from gpt2_dir): the
                tokenizer of the model being tuned.
            pretrained_dir: the Hugging Face model folder whose tokenizer and chat template render the prompts; left
                out, ``cli.py`` takes the model's ``init_weights`` folder (give it only without one).
            gpt2_dir: folder with GPT-2's vocab.json and merges.txt (tokenizer=gpt2).
            answer_pattern: the answer rule (``cli.py test``'s): a regex whose one group, at its first match, is the
                answer in a completion and in a reference (``'Answer: (.+)'``); None: GSM8K's ``#### <number>``.
            max_prompt_tokens: prompts longer than this are dropped (counted).
            batch_size: prompts per training batch (each sampled group_size times).
            val_batch_size: prompts per validation batch (answered greedily).
            skip_bad_records: skip malformed records (and replies whose answer the rule cannot read), counting them,
                instead of stopping at the first with its line.
            num_workers: DataLoader worker processes.
            seed: seed of the per-epoch shuffle of the training prompts.
            generate: write the project's arithmetic task with these settings into the folder ``path`` when it is
                not there (``datamodules.arithmetic``): train and validate on its sft.jsonl questions.
        """
        super().__init__()
        self.save_hyperparameters()
        for name, given in (("path", None if generate else path), ("val_path", val_path)):
            if given is not None and not Path(given).exists():
                hint = f"pass --data.init_args.{name}"
                raise FileNotFoundError(not_found_message("prompts file or folder", given, hint))
        if tokenizer == "gpt2" and gpt2_dir is None:
            raise InputError("tokenizer='gpt2' needs gpt2_dir=<folder with GPT-2's vocab.json and merges.txt>")
        check_pattern(answer_pattern)
        check_settings(fraction=True, val_fraction=val_fraction)
        check_settings(at_least=1, max_prompt_tokens=max_prompt_tokens, batch_size=batch_size)
        check_settings(at_least=1, val_batch_size=val_batch_size)
        check_settings(at_least=0, num_workers=num_workers)
        self.path, self.val_path, self.val_fraction = path, val_path, val_fraction
        self.kind, self.pretrained_dir, self.gpt2_dir = tokenizer, pretrained_dir, gpt2_dir
        self.max_prompt_tokens, self.batch_size, self.val_batch_size = max_prompt_tokens, batch_size, val_batch_size
        self.skip_bad_records, self.num_workers = skip_bad_records, num_workers
        self.seed, self.generate, self.answer_pattern = seed, generate, answer_pattern
        self.tokenizer: Tokenizer | None = None
        self.train_set: list | None = None
        self.val_set: list | None = None
        self.skipped = self.dropped = 0

    @property
    def vocab_size(self) -> int:
        """For sizing a model from the data config."""
        return ensure_tokenizer(self).vocab_size

    def _bad(self, where: str, why: str) -> None:
        if not self.skip_bad_records:
            raise InputError(
                f"{where} {why}: fix the record, or pass --data.init_args.skip_bad_records=true to skip such records"
            )
        self.skipped += 1

    def _encode(self, records: list[tuple[str, Prompt]]) -> list[tuple[list[int], str]]:
        render, items = chat_renderer(ensure_tokenizer(self)), []
        for where, (messages, answer) in records:
            try:
                ids = render(messages, True).ids
            except InputError as err:
                self._bad(where, f"cannot be rendered: {err}")
                continue
            if len(ids) > self.max_prompt_tokens:
                self.dropped += 1
                continue
            items.append((ids, answer))
        return items

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.skipped = self.dropped = 0
        train_path, val_path = self._train_path(), self.val_path
        parse = functools.partial(prompt_of, pattern=self.answer_pattern)
        records = read_records(train_path, parse, self._bad)
        if val_path is not None:
            train, val = records, read_records(val_path, parse, self._bad)
        else:
            split = len(records) - int(len(records) * self.val_fraction)
            train, val = records[:split], records[split:]
        self.train_set, self.val_set = self._encode(train), self._encode(val)
        rank_zero_info(
            f"PromptDataModule: {len(self.train_set)} training and {len(self.val_set)} validation prompts; "
            f"{self.dropped} dropped (longer than max_prompt_tokens={self.max_prompt_tokens}), {self.skipped} bad "
            "records skipped"
        )
        if not self.train_set:
            raise InputError(
                f"{self.path!r} leaves no training prompts: give more records or a larger max_prompt_tokens"
            )

    def collate_for(self, dataset):
        return functools.partial(collate, answer_pattern=self.answer_pattern)  # picklable for workers
