"""The dtype a pretrained load holds its weights in, chosen as transformers 5 chooses it.

``dtype="auto"`` (transformers 5's default, and the zoo's) is the folder's own: ``config.json``'s ``dtype``
(``torch_dtype`` as transformers 4 wrote it), else the first floating tensor of its safetensors files, as
``transformers.modeling_utils._get_dtype`` reads them. ``float32``, ``bfloat16`` and ``float16`` are taken as named.
Any other dtype a file states is refused by name: the zoo's nets are not checked in it.

Through a Lightning ``Trainer`` the weights train and predict in the dtype ``trainer.precision`` states
(``for_precision``): ``*-true`` precisions are their dtype's, mixed ones keep float32 master weights.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

import torch

from zoo.errors import InputError

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SAFETENSORS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}

# The parameters' dtype under each of Lightning's precisions: the ``*-true`` ones cast the module (HalfPrecision,
# DoublePrecision), the mixed ones autocast over float32 weights. Others (transformer-engine, bitsandbytes) are not
# checked: their plugins convert the module as they do.
PRECISION_DTYPES = {
    "32-true": torch.float32,
    "64-true": torch.float64,
    "bf16-true": torch.bfloat16,
    "16-true": torch.float16,
    "bf16-mixed": torch.float32,
    "16-mixed": torch.float32,
}
_TRUE = {torch.float32: "32-true", torch.bfloat16: "bf16-true", torch.float16: "16-true"}


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def stated(config: dict, weights: list[Path], where: str) -> torch.dtype:
    """The dtype a folder's ``config.json`` (``config``) states, else its first floating tensor's (``weights``: its
    safetensors files; float32 where there are none, as ``torch.load``'s files are not opened for it)."""
    value = config.get("dtype") or config.get("torch_dtype")
    if value is None:
        value = next((d for path in weights for d in _header_dtypes(path)), "float32")
    if not isinstance(value, str) or value.removeprefix("torch.") not in DTYPES:
        raise InputError(
            f"{where!r} states dtype {value!r}: the zoo loads {', '.join(DTYPES)}; pass dtype= one of them"
        )
    return DTYPES[value.removeprefix("torch.")]


def _header_dtypes(path: Path) -> list[str]:
    """The dtypes of a safetensors file's floating tensors, in its header's order (nothing else read)."""
    from zoo.io.meta_load import _header
    from zoo.io.weights import open_safetensors

    if path.suffix != ".safetensors":
        return []
    open_safetensors(path)  # refuses a file safetensors would not read (a 2**63 length, a header nested too deep)
    _, header = _header(path)
    return [_SAFETENSORS[e["dtype"]] for k, e in header.items() if k != "__metadata__" and e["dtype"] in _SAFETENSORS]


def resolve(dtype: str | torch.dtype, config: dict, weights: list[Path], where: str) -> torch.dtype:
    """``dtype`` (``auto``, a name of ``DTYPES`` or a torch dtype) as the torch dtype a load holds."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype == "auto":
        return stated(config, weights, where)
    if dtype not in DTYPES:
        raise InputError(f"dtype={dtype!r} is not one the zoo loads: pass auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def for_precision(chosen: Dtype, held: torch.dtype, precision: str | None, where: str) -> torch.dtype:
    """The dtype to load ``where``'s weights in under ``trainer.precision`` ``precision`` (None: no trainer):
    ``held`` (what ``chosen`` resolved to) where the precision keeps it. Where it does not, ``auto`` gives way to the
    precision with one line (a bf16 folder under ``32-true`` or a mixed precision is upcast, as Lightning trains float32
    weights there), and a dtype the config names is refused: the two settings contradict each other."""
    want = PRECISION_DTYPES.get(str(precision))
    if want is None or want == held:
        return held
    keep = _TRUE.get(held)
    if chosen != "auto":
        raise InputError(
            f"model.init_args.init_dtype={chosen} contradicts trainer.precision={precision}, which trains "
            f"{name(want)} weights: set trainer.precision={keep}, or init_dtype auto to load in {name(want)}"
        )
    if os.environ.get("LOCAL_RANK", "0") == "0":  # once, not from every rank DDP launches
        print(
            f"init_weights {where!r} holds {name(held)}: loaded as {name(want)}, the weights "
            f"trainer.precision={precision} trains (trainer.precision={keep} keeps {name(held)})",
            file=sys.stderr,
        )
    return want


def of_source(path: str | Path, chosen: str, default: torch.dtype, config: dict | None = None) -> torch.dtype:
    """``chosen`` resolved for an ``init_weights`` path: a Hugging Face folder's as ``resolve`` reads it (``config``:
    its config.json as already read, else read here), a safetensors file's first floating tensor's, ``default`` (the
    net's own) for other files (checkpoints)."""
    if chosen != "auto":
        return resolve(chosen, {}, [], str(path))
    path = Path(path)
    if config is None and (path / "config.json").is_file():
        from zoo.io.files import read_config

        config = read_config(path / "config.json")
    if config is not None:
        return stated(config, sorted(path.glob("*.safetensors")), str(path))
    if path.suffix == ".safetensors" and path.is_file():
        return stated({}, [path], str(path)) if _header_dtypes(path) else default
    return default


def trained_dtype(module: torch.nn.Module, state_dict: dict) -> torch.dtype | None:
    """The one floating dtype of the stored parameters of ``module`` (a ``*-true`` precision's, as Lightning saved
    them) where it is not the module's as built; None where they are the module's, or of several dtypes."""
    params = dict(module.named_parameters())
    stored = {v.dtype for k, v in state_dict.items() if k in params and v.is_floating_point()}
    built = {p.dtype for p in params.values() if p.is_floating_point()}
    return next(iter(stored)) if len(stored) == 1 and stored != built else None
