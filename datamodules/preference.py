"""PreferenceDataModule: pairs of replies to one prompt, the chosen and the rejected, for preference tuning (DPO).

Each line of a ``.jsonl`` file (or of each ``.jsonl`` under a folder, in name order) is a pair in one of TRL's
formats: ``{"prompt": str, "chosen": str, "rejected": str}`` (a user turn and two assistant replies);
conversational ``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}``; or implicit-prompt
``{"chosen": [messages], "rejected": [messages]}``, whose prompt is the messages the two share from the start. A
completion is one or more assistant turns. Other keys (ids, scores) are ignored, as TRL ignores them.

Each side (prompt + completion) is rendered whole by ``ChatDataModule``'s renderer (``zoo.io.chat_template``: the
model's own chat template, or the zoo's default format), and learned on its completion's tokens only: the targets
are -100 on the prompt (its earlier assistant turns included) and on the template's headers, so a sequence's
log-probability (``zoo.gpt.tune.losses.sequence_logps``) sums over the reply the model would generate. Where the
template rewrites earlier turns (Qwen3's), a side is the template's rendering of prompt + completion, its one reply
learned after the prompt as it renders it (``zoo.io.chat_template.chat_examples``' last example; the ids TRL's DPO
tokenizes); a completion of several replies is then refused. A side longer than
``block_size + 1`` tokens is never cut (a cut reply would be compared with a whole one): its pair is dropped and
counted.

A batch is a dict of four int64 (B, T) tensors, ``chosen_input_ids``, ``chosen_targets``, ``rejected_input_ids``,
``rejected_targets``, right padded (the pad id; targets -100) to the longest side of the batch, so the two sides
run as one (2B, T) forward. A malformed record (not JSON, a missing key, an unknown role, a non-string content, a
chosen equal to its rejected, a completion that is not assistant turns) is one ``error:`` line naming its file and
line, or, with ``skip_bad_records``, skipped and counted.

Notation: B pairs, T tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import Dataset

from datamodules.arithmetic import ArithmeticTask, GeneratedTask
from datamodules.base import SplitLoaders, check_settings, not_found_message, window
from datamodules.chat import ensure_tokenizer, messages_of, read_records
from datamodules.text import TakesAFolder
from zoo.errors import InputError
from zoo.gpt.losses import IGNORE_INDEX
from zoo.io.chat_template import chat_examples
from zoo.io.tokenizers import Tokenizer

Pair = tuple[list[dict], list[dict], list[dict]]  # prompt, chosen completion, rejected completion
Side = tuple[np.ndarray, np.ndarray]  # ids, labels (unshifted)


def pair_of(record: object) -> Pair:
    """The prompt and the two completions a record holds, checked; a ValueError says what is wrong with it."""
    if not isinstance(record, dict):
        raise ValueError(f"is a JSON {type(record).__name__}, not an object")
    missing = [k for k in ("chosen", "rejected") if k not in record]
    if missing:
        raise ValueError(f"has no {' and no '.join(map(repr, missing))} (found {sorted(record)})")
    chosen, rejected = record["chosen"], record["rejected"]
    if "prompt" not in record:
        if not (isinstance(chosen, list) and isinstance(rejected, list)):
            raise ValueError("has no 'prompt', and its chosen and rejected are not both lists of messages")
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
    else:
        prompt = record["prompt"]
        if all(isinstance(v, str) for v in (prompt, chosen, rejected)):
            prompt = [{"role": "user", "content": prompt}]
            chosen, rejected = [{"role": "assistant", "content": chosen}], [{"role": "assistant", "content": rejected}]
        elif not all(isinstance(v, list) for v in (prompt, chosen, rejected)):
            raise ValueError("has a prompt, chosen and rejected that are not all strings or all lists of messages")
    if chosen == rejected:
        raise ValueError("has a chosen equal to its rejected (nothing to prefer)")
    for name, completion in (("chosen", chosen), ("rejected", rejected)):
        messages_of({"messages": prompt + completion})  # roles, keys and contents checked as chat data's
        if not completion or any(m["role"] != "assistant" for m in completion):
            raise ValueError(f"has a {name} completion that is not one or more assistant turns")
    return prompt, chosen, rejected


class Pairs(Dataset):
    """Each pair's two sides as (ids, labels), unshifted (the collate shifts and pads)."""

    def __init__(self, items: list[tuple[Side, Side]], pad_id: int) -> None:
        self.items, self.pad_id = items, pad_id

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Side, Side]:
        return self.items[i]

    def collate(self, batch: list[tuple[Side, Side]]) -> dict[str, torch.Tensor]:
        t = max(len(ids) for pair in batch for ids, _ in pair) - 1  # both sides to one T: one (2B, T) forward
        out = {}
        for k, side in enumerate(("chosen", "rejected")):
            inputs = torch.full((len(batch), t), self.pad_id, dtype=torch.long)  # (B, T)
            targets = torch.full((len(batch), t), IGNORE_INDEX, dtype=torch.long)  # (B, T)
            for b, pair in enumerate(batch):
                ids, labels = pair[k]
                inputs[b, : len(ids) - 1] = torch.from_numpy(ids[:-1])
                targets[b, : len(ids) - 1] = torch.from_numpy(labels[1:])
            out[f"{side}_input_ids"], out[f"{side}_targets"] = inputs, targets
        return out


class PreferenceDataModule(TakesAFolder, GeneratedTask, SplitLoaders, LightningDataModule):
    """Preference pairs rendered with the model's chat template; ``self.tokenizer`` is set by ``setup``."""

    task_file = "dpo"

    def __init__(
        self,
        path: str,
        val_path: str | None = None,
        val_fraction: float = 0.1,
        tokenizer: Literal["pretrained", "bytes", "gpt2"] = "pretrained",
        pretrained_dir: str | None = None,
        gpt2_dir: str | None = None,
        block_size: int | None = None,
        batch_size: int = 8,
        skip_bad_records: bool = False,
        num_workers: int = 0,
        seed: int = 0,
        generate: ArithmeticTask | None = None,
    ) -> None:
        """
        Args:
            path: a .jsonl file of preference pairs (``prompt``, ``chosen``, ``rejected``; or ``chosen`` and
                ``rejected`` conversations sharing their prompt), or a folder of them.
            val_path: a .jsonl file or folder of pairs to validate on; None: the last val_fraction of path's.
            val_fraction: the share of path's pairs (the last ones) held out for validation when val_path is None.
            tokenizer: pretrained (a model folder's own with its chat template, from pretrained_dir: the folder the
                model's ``init_weights`` names), bytes or gpt2 (from gpt2_dir; both in the zoo's default format).
            pretrained_dir: the Hugging Face model folder whose tokenizer and chat template render the pairs; left
                out, ``cli.py`` takes the model's ``init_weights`` folder (give it only without one).
            gpt2_dir: folder with GPT-2's vocab.json and merges.txt (tokenizer=gpt2).
            block_size: the most tokens a side is trained on (T): a pair with a longer side is dropped. None: the
                net's context (``cli.py`` sets it from the net's ``block_size``).
            batch_size: pairs per batch (each a chosen and a rejected sequence).
            skip_bad_records: skip malformed records, counting them, instead of stopping at the first with its line.
            num_workers: DataLoader worker processes.
            seed: seed of the per-epoch shuffle of the training pairs.
            generate: write the project's arithmetic task with these settings into the folder ``path`` when it is
                not there (``datamodules.arithmetic``) and train on its dpo.jsonl; None: path is the user's data.
        """
        super().__init__()
        self.save_hyperparameters()
        for name, given in (("path", None if generate else path), ("val_path", val_path)):
            if given is not None and not Path(given).exists():
                raise FileNotFoundError(
                    not_found_message("preference pairs file or folder", given, f"pass --data.init_args.{name}")
                )
        if tokenizer == "gpt2" and gpt2_dir is None:
            raise InputError("tokenizer='gpt2' needs gpt2_dir=<folder with GPT-2's vocab.json and merges.txt>")
        check_settings(fraction=True, val_fraction=val_fraction)
        check_settings(at_least=1, block_size=block_size, batch_size=batch_size)
        check_settings(at_least=0, num_workers=num_workers)
        self.path, self.val_path, self.val_fraction = path, val_path, val_fraction
        self.kind, self.pretrained_dir, self.gpt2_dir = tokenizer, pretrained_dir, gpt2_dir
        self.block_size, self.batch_size, self.skip_bad_records = window(block_size), batch_size, skip_bad_records
        self.num_workers, self.seed, self.generate = num_workers, seed, generate
        self.tokenizer: Tokenizer | None = None
        self.train_set: Pairs | None = None
        self.val_set: Pairs | None = None
        self.skipped = self.dropped = 0

    @property
    def vocab_size(self) -> int:
        """For sizing a model from the data config."""
        return ensure_tokenizer(self).vocab_size

    # -- records ----------------------------------------------------------------------------------------------

    def _bad(self, where: str, why: str) -> None:
        if not self.skip_bad_records:
            raise InputError(
                f"{where} {why}: fix the record, or pass --data.init_args.skip_bad_records=true to skip such records"
            )
        self.skipped += 1

    def _side(self, examples, prompt: list[dict], completion: list[dict]) -> Side | None:
        """One side's ids and labels (its completion's assistant tokens); None when it does not fit."""
        *earlier, rendered = examples(prompt + completion)
        if earlier:  # the template rewrites earlier turns: the last example is the reply after the prompt it answers
            if len(completion) != 1:
                raise InputError(
                    "the chat template rewrites earlier turns, so a completion of several replies is no one sequence: "
                    "give each pair a completion of one reply"
                )
            if len(rendered.ids) > self.block_size + 1:
                return None
            ids = np.asarray(rendered.ids, dtype=np.int64)
            return ids, np.where(np.asarray(rendered.mask), ids, IGNORE_INDEX)
        if len(rendered.ids) > self.block_size + 1:
            return None
        asked = sum(m["role"] == "assistant" for m in prompt)  # the prompt's own replies are context
        if len(rendered.turn_ends) != asked + len(completion):
            raise InputError("the chat template ends a reply inside a token, so the prompt's end cannot be located")
        start = rendered.turn_ends[asked - 1] if asked else 0
        ids = np.asarray(rendered.ids, dtype=np.int64)
        learned = np.asarray(rendered.mask) & (np.arange(len(ids)) >= start)
        return ids, np.where(learned, ids, IGNORE_INDEX)

    def _encode(self, records: list[tuple[str, Pair]]) -> Pairs:
        tokenizer = ensure_tokenizer(self)
        examples, items = chat_examples(tokenizer), []
        for where, (prompt, chosen, rejected) in records:
            try:
                sides = self._side(examples, prompt, chosen), self._side(examples, prompt, rejected)
            except InputError as err:  # the template refused this conversation (raise_exception, say)
                self._bad(where, f"cannot be rendered: {err}")
                continue
            if None in sides:
                self.dropped += 1
                continue
            items.append(sides)
        pad = getattr(tokenizer, "pad_id", None)
        return Pairs(items, tokenizer.eos_id if pad is None else pad)

    # -- Lightning hooks ---------------------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.skipped = self.dropped = 0
        records = read_records(self._train_path(), pair_of, self._bad)
        if self.val_path is not None:
            train, val = records, read_records(self.val_path, pair_of, self._bad)
        else:
            split = len(records) - int(len(records) * self.val_fraction)
            train, val = records[:split], records[split:]
        self.train_set, self.val_set = self._encode(train), self._encode(val)
        rank_zero_info(
            f"PreferenceDataModule: {len(self.train_set)} training and {len(self.val_set)} validation pairs; "
            f"{self.dropped} dropped (a side past block_size={self.block_size}), {self.skipped} bad records skipped"
        )
        wants_val = self.val_path is not None or self.val_fraction > 0
        if not len(self.train_set) or (wants_val and not len(self.val_set)):
            raise InputError(
                f"{self.path!r} leaves {len(self.train_set)} training and {len(self.val_set)} validation pairs "
                f"(block_size={self.block_size}, val_fraction={self.val_fraction}): give more records, a larger "
                f"--data.init_args.block_size (the net's --model.init_args.net.init_args.block_size at least as "
                f"large), or --data.init_args.val_fraction 0 to train without validation"
            )
