"""The zoo's loaders and commands, by what they are handed: each a function of the payload ``make`` returned. A
payload row names the ones it reaches; a new loader of a kind is one entry here, and every payload of that kind
reaching it is one name in its row."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def command(*args: str) -> None:
    """``python cli.py <args>`` as a terminal runs it (``cli.run``: bad input is one ``error:`` line), in the
    forked child, so it costs no interpreter start."""
    import cli

    sys.argv = ["cli.py", *args]
    os.environ["ZOO_VERBOSE"] = ""
    cli.run()


def _load_file(p):
    from zoo.io.weights import load_file

    return load_file(p)


def _load_from_checkpoint(p):
    from zoo.gpt import CausalLMModule

    return CausalLMModule.load_from_checkpoint(p)


def _trainer(p):
    from zoo.io.checkpoint import WeightsOnlyCheckpointIO

    return WeightsOnlyCheckpointIO().load_checkpoint(p)


def _stored_model(p):
    from zoo.io.checkpoint import stored_model

    return stored_model(p)


def _init_weights_net(p):
    from zoo.app.pretrained import zoo_model

    return zoo_model(Path(p))


def _init_weights(p):
    from builders import TINY_NET

    from zoo.gpt import GPT
    from zoo.gpt.formats.hf import load_pretrained

    return load_pretrained(GPT(**TINY_NET), p)


def _load_model(p):
    from zoo.tracking.models import load_model

    return load_model(str(p))


def _stored_config(p):
    """What ``cli.py validate --ckpt_path`` builds before the Trainer: the stored module and data, built."""
    from zoo.app.stored_config import from_checkpoint

    out = from_checkpoint(["validate", f"--ckpt_path={p}"])
    return [part() for part in (out.model, out.data) if part is not None]


# A file handed where a checkpoint or weights file belongs (--ckpt_path, init_weights, load_from_checkpoint).
CHECKPOINT = {
    "load_file": _load_file,
    "load_from_checkpoint": _load_from_checkpoint,
    "trainer": _trainer,
    "stored_model": _stored_model,
    "init_weights_net": _init_weights_net,
    "init_weights": _init_weights,
    "load_model": _load_model,
    "stored_config": _stored_config,
    "cli": lambda p: command("validate", f"--ckpt_path={p}", "--trainer.logger=false"),
}


def _open_safetensors(p):
    from zoo.io.weights import open_safetensors

    with open_safetensors(p) as f:
        return [f.get_tensor(k).shape for k in f.keys()]


def _read_tensors(p):
    from zoo.io.meta_load import read_tensors

    return {k: v.shape for k, v in read_tensors([p]).items()}


def _gpt_folder(p):
    """The payload as the weights of a whole GPT-2 folder (config, tokenizer beside it): ``from_pretrained``."""
    from zoo.gpt import from_pretrained

    return from_pretrained(p.parent)


SAFETENSORS = {
    "load_file": _load_file,
    "open_safetensors": _open_safetensors,
    "read_tensors": _read_tensors,
    "init_weights": _init_weights,
    "from_pretrained": _gpt_folder,
}
