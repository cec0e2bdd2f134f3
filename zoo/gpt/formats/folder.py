"""A Hugging Face model folder, read once into one value: ``Folder.read(path)``.

Its ``config.json`` and ``generation_config.json`` are read when it is built (within ``zoo.io.files.read_config``'s
bounds: a folder that names code of its own, a field of the wrong type or a ``model_type`` the zoo's GPT does not load
is refused), and its weight files listed; its tensor names (the safetensors headers) and its tokenizer (with its chat
template and special tokens) are read the first time they are asked for, once. The application builds one per run and
hands it to the net builder (``zoo.app.pretrained``), the DataModule (its tokenizer) and the module's loader
(``CausalLMModule.use_folder``), as ``zoo.gpt.from_pretrained`` does within itself: no caller opens the folder again.

A ``Folder`` is data: nothing it says is imported or run, and a size it states reaches an allocation only through the
budget checks (``zoo.io.budget``) of whoever builds a net from it.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from zoo.errors import InputError
from zoo.gpt.formats.checks import MODEL_TYPES, REFUSED, refused
from zoo.gpt.generate import Generation
from zoo.io import hf_tokenizer
from zoo.io.files import read_config
from zoo.io.tokenizers import GPT2Tokenizer, Tokenizer


@dataclasses.dataclass(frozen=True, eq=False)
class Folder:
    """A model folder as read: ``path``; ``config``, its ``config.json`` (a ``model_type`` of ``MODEL_TYPES``);
    ``generation_config``, its ``generation_config.json`` checked whole ({} without one); ``shards``, its weight
    files (``*.safetensors``, else ``pytorch_model*.bin``)."""

    path: Path
    config: dict
    generation_config: dict
    shards: tuple[Path, ...]

    @classmethod
    def read(cls, path: str | Path) -> Folder:
        """The folder at ``path``, its configs read here and nowhere else."""
        folder = Path(path)
        if not folder.is_dir():
            raise InputError(f"{str(folder)!r} is not a folder: point at a Hugging Face model folder (config, weights)")
        if not (folder / "config.json").is_file():
            raise InputError(f"{str(folder)!r} has no config.json: not a Hugging Face model folder")
        config = read_config(folder / "config.json", MODEL_TYPES)  # an auto_map beside these: ignored, as transformers
        kind = config.get("model_type")
        if kind in REFUSED:
            raise refused(kind)
        if kind not in MODEL_TYPES:
            raise InputError(
                f"{str(folder / 'config.json')!r} has model_type {kind!r}: the zoo's GPT loads {', '.join(MODEL_TYPES)}"
            )
        shards = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
        return cls(folder, config, read_generation_config(folder), tuple(shards))

    def is_at(self, path: str | Path) -> bool:
        """Whether this is the folder at ``path`` (the same directory, however named)."""
        return Path(path).resolve() == self.path.resolve()

    @functools.cached_property
    def tensor_names(self) -> frozenset[str]:
        """The tensor names of the safetensors files, from their headers (nothing else is read)."""
        from safetensors import safe_open

        names: set[str] = set()
        for shard in self.shards:
            if shard.suffix == ".safetensors":
                with safe_open(str(shard), "pt") as f:
                    names |= set(f.keys())
        return frozenset(names)

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The folder's ``tokenizer.json`` or ``tokenizer.model`` with its special tokens and chat template
        (``zoo.io.hf_tokenizer``); GPT-2's vocab.json and merges.txt without either."""
        if not any((self.path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
            if (self.path / "vocab.json").is_file():
                return GPT2Tokenizer.from_dir(self.path)
        return hf_tokenizer.from_folder(self.path, self.eos_ids, self.config.get("model_type"))

    @property
    def eos_ids(self) -> list[int]:
        """The EOS ids ``generation_config.json`` or ``config.json`` state (an int or a list), first found first."""
        for source in (self.generation_config, self.config):
            eos = source.get("eos_token_id")
            if eos is not None:
                return [eos] if isinstance(eos, int) else list(eos)
        return []

    @property
    def generation(self) -> Generation:
        """predict's decoding as ``generation_config.json`` states it (``generation_from``)."""
        return generation_from(self.generation_config)


def read_generation_config(folder: Path) -> dict:
    """``folder``'s ``generation_config.json`` checked whole (``checked_generation_config``); {} without one."""
    path = folder / "generation_config.json"
    return checked_generation_config(read_config(path), str(path)) if path.is_file() else {}


def generation_from(g: dict) -> Generation:
    """predict's decoding as a generation_config.json ``g`` states it: sampled (its temperature, top_k, top_p) only
    with ``do_sample``, else greedy, as transformers' ``generate`` reads the file; its ``repetition_penalty`` either
    way; greedy without one."""
    penalty = {"repetition_penalty": float(g["repetition_penalty"])} if g.get("repetition_penalty") else {}
    if not g.get("do_sample", False):
        return Generation(temperature=0.0, **_max_new(g), **penalty)
    top_p = g.get("top_p")
    return Generation(
        temperature=float(g.get("temperature", 1.0)),
        top_k=g.get("top_k") or None,
        top_p=None if top_p in (None, 1.0) else float(top_p),
        **_max_new(g),
        **penalty,
    )


def _max_new(g: dict) -> dict:
    return {"max_new_tokens": int(g["max_new_tokens"])} if g.get("max_new_tokens") else {}


# generation_config.json's keys the zoo reads (generation_from; eos_token_id: Folder.eos_ids), and those that change no
# decoded token: ids the tokenizer states, what generate returns beside the tokens, transformers' own bookkeeping.
# max_length bounds prompt + continuation: the zoo's bound is max_new_tokens (and the net's block_size past which the
# context slides), which the file's max_new_tokens sets.
READ_KEYS = {"do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens", "eos_token_id"}
INERT_KEYS = {
    "bos_token_id", "pad_token_id", "decoder_start_token_id", "transformers_version", "_from_model_config",
    "use_cache", "max_length", "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "return_dict_in_generate", "cache_implementation", "cache_config",
}  # fmt: skip
# transformers' decoding settings the zoo does not implement, at the values that leave decoding as the zoo does it.
NEUTRAL = {
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "diversity_penalty": 0.0, "length_penalty": 1.0,
    "early_stopping": False, "num_return_sequences": 1, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0, "min_length": 0, "min_new_tokens": None, "bad_words_ids": None,
    "force_words_ids": None, "constraints": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "min_p": None, "top_h": None, "renormalize_logits": False, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "remove_invalid_values": False, "exponential_decay_length_penalty": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "sequence_bias": None, "token_healing": False,
    "guidance_scale": None, "low_memory": None, "watermarking_config": None, "stop_strings": None,
    "max_time": None, "dola_layers": None, "prompt_lookup_num_tokens": None, "assistant_early_exit": None,
}  # fmt: skip


# What each key the zoo reads holds: "bool", "int" (or null), "number" (or null); eos_token_id: Folder.eos_ids'.
KINDS = {"do_sample": "bool", "max_new_tokens": "int", "top_k": "int"}
KINDS |= {k: "number" for k in ("temperature", "top_p", "repetition_penalty")}


def _of_kind(value: Any, kind: str) -> bool:
    if kind == "bool" or isinstance(value, bool):  # JSON's true is no number here
        return isinstance(value, bool) and kind == "bool"
    return value is None or isinstance(value, int if kind == "int" else (int, float))


def checked_generation_config(g: Any, where: str) -> dict:
    """``g`` (a generation_config.json) when every key in it is read by the zoo, changes no decoded token, or holds
    transformers' default; else one error naming each other key, which the zoo would otherwise silently ignore."""
    if not isinstance(g, dict):
        raise InputError(f"{where!r} is not a JSON object: a generation_config.json maps settings to values")
    bad = [
        f"{k}={v!r}" if k in NEUTRAL else f"{k} (unknown)"
        for k, v in g.items()
        if k not in READ_KEYS | INERT_KEYS and not (k in NEUTRAL and v == NEUTRAL[k])
    ]
    mistyped = [f"{k}={v!r}" for k, v in g.items() if k in KINDS and not _of_kind(v, KINDS[k])]
    if mistyped:
        raise InputError(
            f"{where!r} sets {', '.join(mistyped)}: do_sample takes true or false, top_k and max_new_tokens a whole "
            "number, temperature, top_p and repetition_penalty a number: fix the file"
        )
    if bad:
        raise InputError(
            f"{where!r} sets {', '.join(bad)}: decoding the zoo does not implement (it does greedy or temperature, "
            f"top_k, top_p and repetition_penalty sampling); remove these from the file to decode without them"
        )
    return g
