"""ChatDataModule: conversations for supervised fine-tuning, with the loss on the assistant's tokens only.

Each line of a ``.jsonl`` file (or of each ``.jsonl`` under a folder, in name order) is a conversation:
``{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}`` (OpenAI's and Hugging Face's
format), or a pair ``{"prompt": ..., "completion": ...}`` (strings: a user turn and the assistant's reply; or lists of
messages, as TRL's conversational pairs). It is rendered by ``zoo.io.chat_template``: an imported tokenizer's own
chat template (ids equal to transformers' ``apply_chat_template``), or the zoo's default format for bytes and GPT-2's
tokenizer. A record with ``"tools"`` (OpenAI function specs: a text environment's episodes,
``zoo.gpt.tune.envs.scripted.write_episodes``) may hold ``tool`` messages and assistant ``tool_calls``, and is
rendered with its tools; tool results are context like the user's turns. Every assistant turn is learned
(multi-turn); system, user and tool turns and the template's headers are context, their targets the ignore index
-100. A conversation whose template rewrites earlier turns as later ones
arrive (Qwen3's) becomes one sequence per assistant turn, each the template's rendering up to and including that
reply, the reply learned after the prompt it answers (``zoo.io.chat_template.chat_examples``).

A sequence longer than ``block_size + 1`` tokens keeps its first turns up to the end of the last assistant
turn that fits (a cut never falls inside a turn or a token), and one whose first reply does not fit is dropped;
the counts are reported. There is no packing: a batch is its conversations padded on the right to the longest, so
no position attends across conversations and the validation loss (``CausalLMModule``'s, token-weighted) is the mean
over assistant tokens. Batches are ``(input_ids, targets)`` int64 (B, T) as ``TextDataModule``'s, so the module is
the same: ``targets[:, t]`` is ``input_ids[:, t + 1]`` where that token is the assistant's, else -100; padding is
the tokenizer's pad id (EOS when it has none), never attended to by a real token under the causal mask.

A malformed record (not JSON, an unknown role, a non-string content, no assistant turn, a key other than role and
content, one the template refuses) is one ``error:`` line naming its file and line, or, with
``skip_bad_records``, skipped and counted. The validation split is ``val_path``, else the last ``val_fraction`` of
the records.

With ``generate`` (``datamodules.arithmetic.ArithmeticTask``), ``path`` is a folder the project's arithmetic task is
written into when it is not there yet (``prepare_data``, so a config runs from a fresh clone), and its ``sft.jsonl``
is trained on; the held-out questions (``test.jsonl``, ``mc.jsonl``) are never in it.

Notation: B batch, T tokens (the longest conversation of the batch, at most ``block_size``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import Dataset

from datamodules.arithmetic import ArithmeticTask, GeneratedTask
from datamodules.base import SplitLoaders, check_settings, not_found_message, window
from datamodules.text import TakesAFolder, fixed_tokenizer
from zoo.errors import InputError
from zoo.gpt.losses import IGNORE_INDEX
from zoo.io.chat_template import chat_examples, checked_messages
from zoo.io.tokenizers import Tokenizer
from zoo.io.tool_calls import checked_tools

T = TypeVar("T")
EPISODES_FILE, EPISODES_SETTINGS = "episodes.jsonl", "episodes.json"
MAX_EPISODES = 1_000_000


@dataclasses.dataclass(frozen=True)
class Episodes:
    """Scripted episodes of a text environment to train on (``data.init_args.episodes`` in a config), written by
    ``zoo.gpt.tune.envs.scripted.write_episodes``.

    Args:
        env_id: a registered id of the zoo's text environments (zoo/Calculator-v0, zoo/GuessNumber-v0,
            zoo/FrozenLakeText-v0).
        n: episodes written.
        seed: the seed of the first episode (the next ones continue the environment's generator).
        player: the scripted player (the environment's best when None; zoo/GuessNumber-v0's random or linear
            are worse ones).
        env_kwargs: the environment's settings (e.g. {"is_slippery": false}).
        tool_calls: store each reply's calls as OpenAI tool_calls (an imported template then renders them in its
            own syntax); else as the text the zoo's syntax writes.
        tools: functions of yours the environment offers beside its own, by dotted path (as
            EpisodeDataModule's tools, so SFT's prompts list what RL's will); from your config only, never stored.
    """

    env_id: str
    n: int = 1000
    seed: int = 0
    player: str | None = None
    env_kwargs: dict = dataclasses.field(default_factory=dict)
    tool_calls: bool = False
    tools: list[str] | None = None

    def __post_init__(self) -> None:
        if "tools" in self.env_kwargs:  # code is named where a stored config's is dropped (zoo.io.build), not here
            raise InputError("episodes.env_kwargs.tools: name your tools as episodes.tools, a list of dotted paths")


def prepare_episodes(folder: str | Path, episodes: Episodes) -> Path:
    """``folder/episodes.jsonl`` holding ``episodes``: written when missing or made with other settings; one that
    this did not write (no ``episodes.json`` beside it) is refused, as it is someone's data."""
    from zoo.gpt.tune.envs.scripted import write_episodes

    folder, settings = Path(folder), dataclasses.asdict(episodes)
    path, stored = folder / EPISODES_FILE, folder / EPISODES_SETTINGS
    if not 1 <= episodes.n <= MAX_EPISODES:
        raise InputError(f"episodes.n={episodes.n}: give 1 to {MAX_EPISODES}")
    if stored.is_file() and path.is_file() and json.loads(stored.read_text()) == settings:
        return path
    if path.exists() and not stored.is_file():
        raise InputError(
            f"{path} exists but was not written from episodes settings ({EPISODES_SETTINGS}): pass another "
            f"--data.init_args.path, or leave out --data.init_args.episodes to train on it"
        )
    e = episodes  # tools given by name, so that no stored env_kwargs ever takes their place
    write_episodes(path, e.env_id, e.n, e.seed, e.player, e.tool_calls, tools=e.tools, **e.env_kwargs)
    stored.write_text(json.dumps(settings))
    return path


def messages_of(record: object) -> list[dict]:
    """The conversation a record holds, checked; a ValueError says what is wrong with it."""
    if not isinstance(record, dict):
        raise ValueError(f"is a JSON {type(record).__name__}, not an object")
    if "messages" in record:
        messages = record["messages"]
    elif "prompt" in record and "completion" in record:
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        elif isinstance(prompt, list) and isinstance(completion, list):
            messages = prompt + completion
        else:
            raise ValueError("has a prompt and a completion that are not both strings or both lists of messages")
    else:
        raise ValueError(f"has neither 'messages' nor 'prompt' and 'completion' (found {sorted(record)})")
    checked_messages(messages)  # an InputError is a ValueError
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("has no assistant turn (nothing to learn)")
    return messages


def conversation_of(record: object) -> tuple[list[dict], list[dict] | None]:
    """``messages_of(record)`` and its ``tools``: a record with a ``tools`` list (OpenAI function specs, as a text
    environment's episodes carry them) may hold ``tool`` messages and assistant ``tool_calls``, rendered with those
    tools (``zoo.io.tool_calls``); a ValueError says what is wrong."""
    if not isinstance(record, dict) or "tools" not in record:
        return messages_of(record), None
    if "messages" not in record:
        raise ValueError("has 'tools' but no 'messages' (a conversation with tools is a list of messages)")
    tools, messages = checked_tools(record["tools"]), record["messages"]
    checked_messages(messages, tools=True)
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("has no assistant turn (nothing to learn)")
    return messages, tools


def read_records(path: str, parse: Callable[[object], T], bad: Callable[[str, str], None]) -> list[tuple[str, T]]:
    """``(where, parse(record))`` of every good JSON line of ``path`` (a .jsonl file, or a folder's, in name order);
    ``bad(where, why)`` is told of each line that is not JSON or that ``parse`` refuses with a ValueError."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.jsonl") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no .jsonl files under {path!r}")
    out = []
    for file in files:
        with open(file, "rb") as f:  # bytes: a line that is not UTF-8 is that record's fault, named by line
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append((f"{file}:{n}", parse(json.loads(line))))
                except (ValueError, RecursionError) as err:  # JSON's and UTF-8's errors are ValueErrors
                    bad(f"{file}:{n}", str(err) if isinstance(err, ValueError) else "nested too deep")
    return out


def ensure_tokenizer(dm: LightningDataModule) -> Tokenizer:
    """``dm.tokenizer``: a checkpoint's model's own when a trainer holds one, else the one ``dm``'s settings name."""
    if dm.tokenizer is None:
        module = getattr(getattr(dm, "trainer", None), "lightning_module", None)
        dm.tokenizer = getattr(module, "tokenizer", None)
    if dm.tokenizer is None:
        dm.tokenizer = fixed_tokenizer(dm.kind, dm.gpt2_dir, dm.pretrained_dir)
    return dm.tokenizer


class Conversations(Dataset):
    """Each conversation's ids and targets, unshifted (the collate shifts and pads)."""

    def __init__(self, items: list[tuple[np.ndarray, np.ndarray]], pad_id: int) -> None:
        self.items, self.pad_id = items, pad_id

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.items[i]

    def collate(self, batch: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor]:
        t = max(len(ids) for ids, _ in batch) - 1
        inputs = torch.full((len(batch), t), self.pad_id, dtype=torch.long)  # (B, T)
        targets = torch.full((len(batch), t), IGNORE_INDEX, dtype=torch.long)  # (B, T)
        for b, (ids, labels) in enumerate(batch):
            inputs[b, : len(ids) - 1] = torch.from_numpy(ids[:-1])
            targets[b, : len(ids) - 1] = torch.from_numpy(labels[1:])
        return inputs, targets


class ChatDataModule(TakesAFolder, GeneratedTask, SplitLoaders, LightningDataModule):
    """Conversations rendered with the model's chat template; ``self.tokenizer`` is set by ``setup``."""

    task_file = "sft"

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
        episodes: Episodes | None = None,
    ) -> None:
        """
        Args:
            path: a .jsonl file of conversations (``messages``, or ``prompt`` and ``completion``), or a folder of them.
            val_path: a .jsonl file or folder of conversations to validate on; None: the last val_fraction of path's.
            val_fraction: the share of path's records (the last ones) held out for validation when val_path is None.
            tokenizer: pretrained (a model folder's own with its chat template, from pretrained_dir: the folder the
                model's ``init_weights`` names), bytes or gpt2 (from gpt2_dir; both in the zoo's default format).
            pretrained_dir: the Hugging Face model folder whose tokenizer and chat template render the conversations;
                left out, ``cli.py`` takes the model's ``init_weights`` folder (give it only without one).
            gpt2_dir: folder with GPT-2's vocab.json and merges.txt (tokenizer=gpt2).
            block_size: the most tokens a conversation is trained on (T): longer ones keep their first whole turns.
                None: the net's context (``cli.py`` sets it from the net's ``block_size``).
            batch_size: conversations per batch.
            skip_bad_records: skip malformed records, counting them, instead of stopping at the first with its line.
            num_workers: DataLoader worker processes.
            seed: seed of the per-epoch shuffle of the training conversations.
            generate: write the project's arithmetic task with these settings into the folder ``path`` when it is
                not there (``datamodules.arithmetic``) and train on its sft.jsonl; None: path is the user's data.
            episodes: write a text environment's scripted episodes with these settings into the folder ``path``
                (episodes.jsonl) when they are not there and train on them; None: path is the user's data.
        """
        super().__init__()
        self.save_hyperparameters()
        if generate is not None and episodes is not None:
            raise InputError("give --data.init_args.generate or --data.init_args.episodes, not both")
        for name, given in (("path", None if generate or episodes else path), ("val_path", val_path)):
            if given is not None and not Path(given).exists():
                raise FileNotFoundError(
                    not_found_message("conversations file or folder", given, f"pass --data.init_args.{name}")
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
        self.episodes = episodes
        if episodes is not None:
            from zoo.gpt.tune.envs import check_env_id

            check_env_id(episodes.env_id, "--data.init_args.episodes.env_id")
        self.tokenizer: Tokenizer | None = None
        self.train_set: Conversations | None = None
        self.val_set: Conversations | None = None
        self.skipped = self.dropped = self.per_turn = self.cut = 0

    def _ensure_tokenizer(self) -> Tokenizer:
        return ensure_tokenizer(self)

    def prepare_data(self) -> None:
        if self.episodes is not None:  # once per node, before setup on every rank
            prepare_episodes(self.path, self.episodes)
        super().prepare_data()

    def _train_path(self) -> str:
        if self.episodes is not None:
            return str(prepare_episodes(self.path, self.episodes))
        return super()._train_path()

    @property
    def vocab_size(self) -> int:
        """For sizing a model from the data config."""
        return self._ensure_tokenizer().vocab_size

    # -- records ----------------------------------------------------------------------------------------------

    def _records(self, path: str) -> list[tuple[str, tuple[list[dict], list[dict] | None]]]:
        """``(where, (messages, tools))`` of every good record of ``path`` (a file or folder), in order."""
        return read_records(path, conversation_of, self._bad)

    def _bad(self, where: str, why: str) -> None:
        if not self.skip_bad_records:
            raise InputError(
                f"{where} {why}: fix the record, or pass --data.init_args.skip_bad_records=true to skip such records"
            )
        self.skipped += 1

    def _encode(self, records: list[tuple[str, tuple[list[dict], list[dict] | None]]]) -> Conversations:
        """Each conversation rendered, cut after its last assistant turn that fits in block_size + 1 tokens."""
        tokenizer = self._ensure_tokenizer()
        examples, items = chat_examples(tokenizer), []
        for where, (messages, tools) in records:
            try:
                rendered = examples(messages, tools)
            except InputError as err:  # the template refused this conversation (raise_exception, say)
                self._bad(where, f"cannot be rendered: {err}")
                continue
            self.per_turn += len(rendered) > 1
            for example in rendered:
                fits = [end for end in example.turn_ends if end <= self.block_size + 1]
                if not fits:
                    self.dropped += 1
                    continue
                self.cut += len(fits) < len(example.turn_ends)
                ids = np.asarray(example.ids[: fits[-1]], dtype=np.int64)
                labels = np.where(np.asarray(example.mask[: fits[-1]]), ids, IGNORE_INDEX)
                items.append((ids, labels))
        pad = getattr(tokenizer, "pad_id", None)
        return Conversations(items, tokenizer.eos_id if pad is None else pad)

    # -- Lightning hooks ---------------------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.skipped = self.dropped = self.per_turn = self.cut = 0
        records = self._records(self._train_path())
        if self.val_path is not None:
            train, val = records, self._records(self.val_path)
        else:
            split = len(records) - int(len(records) * self.val_fraction)
            train, val = records[:split], records[split:]
        self.train_set, self.val_set = self._encode(train), self._encode(val)
        rank_zero_info(
            f"ChatDataModule: {len(self.train_set)} training and {len(self.val_set)} validation sequences "
            f"({self.per_turn} conversations split one per reply: their template rewrites earlier turns); "
            f"{self.dropped} dropped (first reply past block_size={self.block_size}), {self.cut} cut after their last "
            f"reply that fits (the later replies not learnt), {self.skipped} bad records skipped"
        )
        wants_val = self.val_path is not None or self.val_fraction > 0
        if not len(self.train_set) or (wants_val and not len(self.val_set)):
            raise InputError(
                f"{self.path!r} leaves {len(self.train_set)} training and {len(self.val_set)} validation conversations "
                f"(block_size={self.block_size}, val_fraction={self.val_fraction}): give more records, a larger "
                f"--data.init_args.block_size (the net's --model.init_args.net.init_args.block_size at least as "
                f"large), or --data.init_args.val_fraction 0 to train without validation"
            )
