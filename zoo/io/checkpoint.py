"""Checkpoints read back: weights-only by every path, and a checkpoint meeting a config says where they differ.

Every way in reads the file with ``zoo.io.weights.load_file``: ``Module.load_from_checkpoint`` (local path or
URL; Lightning's own unpickles a remote file with ``weights_only=False``), the Trainer's ``--ckpt_path`` restore
(``WeightsOnlyCheckpointIO``), ``init_weights`` and the importers. ``reconcile`` is what ``cli.py`` does with a
``--ckpt_path`` and a config: the config and command line win, except where a value would change the shape of
the checkpoint's weights (refused, naming the key), and a checkpoint of another module class is refused.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.io import TorchCheckpointIO

from zoo import compat
from zoo.errors import InputError
from zoo.io import build, tripwire, trust
from zoo.io.weights import CheckpointError, is_remote, load_file


class WeightsOnlyLoading:
    """Mixed into every zoo LightningModule: ``load_from_checkpoint`` reads weights-only, local paths and URLs alike."""

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | Path,
        map_location: Any = "cpu",
        hparams_file: str | Path | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> LightningModule:
        """The module a checkpoint (a path, or an fsspec URL such as ``https://...``) holds, rebuilt from its
        hyperparameters (``kwargs`` override them) and loaded on ``map_location``; a file that would run code when
        unpickled, a truncated one and a foreign one are refused, naming the file. Lightning's signature:
        ``weights_only`` is always true here."""
        if hparams_file is not None:
            raise ValueError("hparams_file is not supported: a zoo checkpoint carries its hyperparameters")
        checkpoint = compat.migrate_checkpoint(load_file(checkpoint_path, map_location=map_location))
        module = build_stored(cls, checkpoint, str(checkpoint_path), kwargs)
        with tripwire.guard():
            module.on_load_checkpoint(checkpoint)
            module.load_state_dict(checkpoint["state_dict"], strict=module.strict_loading if strict is None else strict)
        module.skip_init_weights()  # the checkpoint's weights are the trained ones
        tensor = next((t for t in checkpoint.get("state_dict", {}).values() if isinstance(t, torch.Tensor)), None)
        return module if tensor is None else module.to(tensor.device)  # where map_location put the weights

    def skip_init_weights(self) -> None:
        """Weights come from a checkpoint: ``init_weights`` (the pretrained start) is not read again, so a
        fine-tuned checkpoint works without the file it was fine-tuned from."""
        self._init_loaded = True


class WeightsOnlyCheckpointIO(TorchCheckpointIO):
    """The Trainer's checkpoint reader (``--ckpt_path``, ``ckpt_path="best"``) through ``load_file``."""

    def load_checkpoint(self, path: str | Path, map_location: Any = None, weights_only: bool | None = None) -> dict:
        if not is_remote(path) and Path(path).is_dir():
            # A strategy that reads one file; FSDP2Strategy reads folders itself.
            raise InputError(
                f"checkpoint {str(path)!r} is a sharded checkpoint folder (FSDP2), which this run's strategy does not "
                f"read: run with the FSDP2 strategy (--config configs/trainer/fsdp.yaml), or consolidate it into one "
                f"file (python -m zoo.train.parallel {path} consolidated.ckpt) and pass --ckpt_path consolidated.ckpt"
            )
        if not is_remote(path) and not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
        return load_file(path, map_location=map_location)


# -- a checkpoint meeting a config ---------------------------------------------------------------------------

MISSING = "<absent>"


def build_stored(cls: type[LightningModule], checkpoint: dict, source: str, given: dict[str, Any]) -> LightningModule:
    """The module a checkpoint's hyperparameters describe, built by ``zoo.io.build`` (never by the instantiator the
    file names); ``given``: the caller's own arguments, objects or values, which replace the stored ones."""
    stored = {k: v for k, v in (checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {}).items() if k not in given}
    part = build.resolve_model(stored, source, trust.zoo_allowlist(), cls=cls, given=tuple(given))
    return build.build(part, record=True, **given)


def stored_model(ckpt_path: str | Path, allow: trust.Allowlist | None = None) -> tuple[str, dict] | None:
    """The module class path and init arguments a checkpoint written through cli.py records, else None; built by
    ``zoo.io.build``'s rules (``allow``: ``zoo.io.trust``) as plain data, nothing constructed."""
    hparams = dict(load_file(ckpt_path, mmap=True).get("hyper_parameters") or {})
    class_path = hparams.get("_class_path")
    if not class_path:
        return None
    part = build.resolve_model(hparams, str(ckpt_path), allow or trust.zoo_allowlist())
    return class_path, part.plain()["init_args"]


def reconcile(ckpt_path: str | Path, model: dict, allow: trust.Allowlist | None = None) -> list[str]:
    """How the model config ``model`` (``class_path``, ``init_args``: what the config and command line give) meets
    the checkpoint's own: a line per differing value, the given one winning; raises ``CheckpointError`` (one line)
    for another module class, or for values that would change the shape of the checkpoint's weights."""
    # The classes this run's own config names are the user's to vouch for (a checkpoint of their own custom net).
    allow = allow or trust.zoo_allowlist().with_trusted(trust.trusted_class_paths(model))
    stored = stored_model(ckpt_path, allow)
    if stored is None:  # saved from Python, not through cli.py: nothing to compare with
        return []
    class_path, old = stored
    if model["class_path"] != class_path:
        raise CheckpointError(
            f"{ckpt_path} holds a {class_path} checkpoint; this run's model is {model['class_path']}; drop --config "
            f"(the checkpoint brings its own model config) or pass a {model['class_path']} checkpoint"
        )
    was, given = _flat(old), _flat(_plain(model.get("init_args") or {}))
    # None asks cli.py to derive a size (num_classes, vocab_size: zoo.app.sizes): the checkpoint holds the one it
    # was trained with, which is no difference.
    diffs = [
        k
        for k in sorted(was.keys() | given.keys())
        if was.get(k, MISSING) != given.get(k, MISSING) and given.get(k, MISSING) is not None
    ]
    if not diffs:
        return []
    wanted = old
    for k in diffs:  # the checkpoint's values with this run's on top (a None left as the checkpoint derived it)
        wanted = _with(wanted, k, given.get(k, MISSING))
    if _shapes(class_path, wanted, allow) != (trained := _shapes(class_path, old, allow)):
        shaping = [k for k in diffs if _shapes(class_path, _with(old, k, given.get(k, MISSING)), allow) != trained]
        named = "; ".join(
            f"model.init_args.{k}={given.get(k, MISSING)} (trained with {was.get(k, MISSING)})"
            for k in shaping or diffs
        )
        raise CheckpointError(
            f"{ckpt_path}: {named} changes the shape of the checkpoint's weights: drop it (the checkpoint brings "
            "its own value) or pass a checkpoint trained with it"
        )
    return [
        f"model.init_args.{k}: {given.get(k, MISSING)} (this run's config) wins over the checkpoint's "
        f"{was.get(k, MISSING)}"
        for k in diffs
    ]


def _plain(value: Any) -> Any:
    """Plain JSON values, so that a tuple and a list, or a dataclass and its dict, compare equal."""
    return json.loads(json.dumps(value, default=_plain_object))


def _plain_object(o: Any) -> Any:
    if isinstance(o, type):  # a class default (GPT's norm): as a config names it, by its package's export
        return trust.paths_of(o)[1]
    return getattr(o, "__dict__", str(o))


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def _with(d: dict, dotted: str, value: Any) -> dict:
    d = copy.deepcopy(d)
    *parents, last = dotted.split(".")
    at = d
    for p in parents:
        at = at.setdefault(p, {})
    if value == MISSING:
        at.pop(last, None)
    else:
        at[last] = value
    return d


def _shapes(class_path: str, init_args: dict, allow: trust.Allowlist) -> dict[str, tuple] | None:
    """The shapes of the module's state dict as ``init_args`` build it, by ``zoo.io.build``'s rules (on the meta
    device: no memory, no init cost); None when it does not build (the real instantiation then reports why)."""
    for device in ("meta", "cpu"):
        try:
            part = build.resolve_model({"_class_path": class_path, **init_args}, "the checkpoint", allow)
            with torch.device(device):
                module = build.build(part)
            return {k: tuple(v.shape) for k, v in module.state_dict().items()}
        except Exception:
            continue
    return None


def build_module(spec: dict, source: str = "the model", given: dict | None = None) -> LightningModule:
    """The module ``spec`` describes, built by the zoo's own rules (``zoo.io.build``: the allowlist's classes only,
    every key a parameter, every value converted by its annotation), recording the hyperparameters a CLI-built one
    records."""
    if not isinstance(spec, dict) or not isinstance(spec.get("init_args") or {}, dict):
        raise trust.UntrustedConfigError(
            f"refused {source}: its module.json is not a mapping with class_path and init_args"
        )
    part = build.resolve_model(
        {"_class_path": spec.get("class_path"), **(spec.get("init_args") or {})}, source, trust.zoo_allowlist()
    )
    return build.build(part, record=True, **(given or {}))


def module_from(spec: dict, state_dict: dict, source: str = "the model", given: dict | None = None) -> LightningModule:
    """The module ``spec`` describes (``build_module``; ``given``: the caller's own arguments over the stored ones),
    its model state and weights loaded, in eval mode."""
    module = build_module(spec, source, given)
    with tripwire.guard():
        module.on_load_checkpoint({"state_dict": state_dict, **spec.get("checkpoint", {})})  # checks keys, tokenizer
        module.load_state_dict(state_dict)
    return module.eval()


def read_module(spec_file: str | Path, weights: str | Path) -> LightningModule:
    """The module of a model folder's ``module.json`` and ``weights.safetensors``: JSON and tensors only."""
    return module_from(json.loads(Path(spec_file).read_text()), load_file(weights), str(spec_file))
