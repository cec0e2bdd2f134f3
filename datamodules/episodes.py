"""EpisodeDataModule: a text environment's seeds, for multi-turn RL on a GPT (``zoo.gpt.GRPOModule``) and its test.

The environment is named by ``env_id``, a registered gymnasium id (``zoo.gpt.tune.episodes.EnvSource``: never
``module:Env``, so a config or a checkpoint names no code), with ``env_kwargs`` for ``gymnasium.make``. What the
data holds is seeds: each batch is ``{"env_seeds": [int, ...], "env": EnvSource}``, and the module plays its
``group_size`` episodes of each seed (training), or one greedy episode of each (validation, test). The three splits
are disjoint runs of seeds: training ``0 .. train_seeds - 1`` (shuffled per epoch), validation from ``val_seed``,
test from ``test_seed``, so ``cli.py test`` scores episodes never trained or selected on.

The tokenizer (the model's, as ``PromptDataModule``'s) sizes the net and renders the conversations.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from lightning.pytorch import LightningDataModule

from datamodules.base import SplitLoaders, check_settings
from datamodules.chat import ensure_tokenizer
from zoo.errors import InputError
from zoo.gpt.tune.episodes import EnvSource
from zoo.io.tokenizers import Tokenizer


def collate(seeds: list[int], env: EnvSource) -> dict:
    return {"env_seeds": [int(s) for s in seeds], "env": env}


class EpisodeDataModule(SplitLoaders, LightningDataModule):
    """Seeds of a text environment in three disjoint splits; ``self.tokenizer`` is set on first use."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        tokenizer: Literal["pretrained", "bytes", "gpt2"] = "bytes",
        pretrained_dir: str | None = None,
        gpt2_dir: str | None = None,
        train_seeds: int = 10_000,
        val_seeds: int = 32,
        test_seeds: int = 200,
        val_seed: int = 1_000_000,
        test_seed: int = 2_000_000,
        batch_size: int = 4,
        val_batch_size: int = 32,
        seed: int = 0,
        num_workers: int = 0,
        tools: list[str] | None = None,
    ) -> None:
        """
        Args:
            env_id: the text environment, a registered gymnasium id (``zoo/GuessNumber-v0``).
            env_kwargs: keyword arguments of ``gymnasium.make`` for it (its own settings).
            tokenizer: pretrained (a model folder's own, from pretrained_dir), bytes or gpt2 (from gpt2_dir): the
                tokenizer of the model being tuned.
            pretrained_dir: the Hugging Face model folder whose tokenizer and chat template render the episodes.
            gpt2_dir: folder with GPT-2's vocab.json and merges.txt (tokenizer=gpt2).
            train_seeds: seeds 0 .. train_seeds - 1 are trained on.
            val_seeds: seeds from val_seed validated on (one greedy episode each).
            test_seeds: seeds from test_seed that ``cli.py test`` scores (one greedy episode each).
            val_seed: the first validation seed (past the training seeds).
            test_seed: the first test seed (past the validation seeds).
            batch_size: seeds per training step (each played group_size times).
            val_batch_size: seeds per validation or test batch.
            seed: seed of the per-epoch shuffle of the training seeds.
            num_workers: DataLoader worker processes.
            tools: functions the environment runs too, beside its own, by dotted path (mypkg.tools.lookup), each
                with a docstring describing it and its typed arguments (``zoo.gpt.tune.envs.tools``). Code: from
                your config only; a checkpoint's or registered model's are dropped, so state them again to test it.
        """
        super().__init__()
        self.save_hyperparameters()
        # the id's form checked now; the registry and the tools at setup
        self.env = EnvSource(env_id, dict(env_kwargs or {}), list(tools) if tools else None)
        check_settings(at_least=1, train_seeds=train_seeds, val_seeds=val_seeds, test_seeds=test_seeds)
        check_settings(at_least=1, batch_size=batch_size, val_batch_size=val_batch_size)
        check_settings(at_least=0, num_workers=num_workers, val_seed=val_seed, test_seed=test_seed)
        splits = sorted([(0, train_seeds, "train"), (val_seed, val_seeds, "val"), (test_seed, test_seeds, "test")])
        for (a, n, first), (b, _, second) in zip(splits, splits[1:]):
            if a + n > b:
                raise InputError(
                    f"the {first} seeds {a}..{a + n - 1} reach the {second} seeds from {b}: held-out seeds must "
                    f"never be trained on; move --data.init_args.val_seed / test_seed past them"
                )
        if tokenizer == "gpt2" and gpt2_dir is None:
            raise InputError("tokenizer='gpt2' needs gpt2_dir=<folder with GPT-2's vocab.json and merges.txt>")
        self.kind, self.pretrained_dir, self.gpt2_dir = tokenizer, pretrained_dir, gpt2_dir
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.seed, self.num_workers = seed, num_workers
        self.tokenizer: Tokenizer | None = None
        self.train_set: list[int] | None = None
        self.val_set: list[int] | None = None
        self.test_set: list[int] | None = None

    @property
    def vocab_size(self) -> int:
        """For sizing a model from the data config."""
        return ensure_tokenizer(self).vocab_size

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.env.spec()  # a registered id, or one line naming the registered ones
        if self.env.tools:  # importable functions with a spec, or one line naming the one that is not
            from zoo.gpt.tune.envs.tools import resolve_tools

            resolve_tools(self.env.tools)
        ensure_tokenizer(self)  # the module takes it at its setup: a net from init_weights sized nothing by the data
        h = self.hparams
        self.train_set = list(range(h.train_seeds))
        self.val_set = list(range(h.val_seed, h.val_seed + h.val_seeds))
        self.test_set = list(range(h.test_seed, h.test_seed + h.test_seeds))

    def collate_for(self, dataset):
        return functools.partial(collate, env=self.env)  # picklable for workers

    def test_dataloader(self):
        return self._loader(self.test_set, "test")

    def scored_file(self, fn: str) -> str:
        """What an evaluation scored (``zoo.app.hooks.evaluated_data``): the env and its seeds."""
        h = self.hparams
        first, count = (h.test_seed, h.test_seeds) if fn == "test" else (h.val_seed, h.val_seeds)
        return f"{h.env_id} seeds {first}..{first + count - 1}"
