"""A load that never holds the weights twice: the net is built on the meta device (no memory, no random
initialisation), a file's tensors are read only when a converter asks for them, and each converted tensor becomes
the net's own by assignment.

    with torch.device("meta"):
        net = GPT(**kwargs)
    net.init_buffers()                          # what is computed, not loaded (RoPE's tables)
    source = read_tensors(shards)               # names -> tensors; nothing read yet
    assign_weights(net, convert(source), name)  # each tensor checked and given to the net, one at a time

Each tensor is read into memory of its own when a converter asks for it, and nothing here keeps it: one used as read
becomes the net's as it is, and a converter that fuses a few (Llama's q, k and v into one matrix) holds them only
until the fused one is made. The peak is the weights' size plus the largest such group (``bench/pretrained_memory.py``
measures it). The net's memory is its own: it does not change, nor fault, if the file changes afterwards.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from zoo.errors import CheckpointError, InputError
from zoo.io.weights import extract_state_dict, is_remote, load_file, open_safetensors


class TensorFiles(Mapping[str, Tensor]):
    """The tensors of safetensors files by name, each read from its file into memory of its own when asked for, and
    held by nobody here; a name in two files is the later file's, as updating a dict with each file gives.

    safetensors' own reader maps the whole file for as long as its handle lives, and every page read through it stays
    resident until then: a load that copies each tensor out peaks at twice the weights. So safetensors checks each
    file (``open_safetensors``: the header, and that the tensors tile the data) and the bytes are read here, at the
    offsets that header gives, straight into the tensor the net will keep."""

    def __init__(self, paths: list[Path]) -> None:
        self._where: dict[str, tuple[Path, int, dict]] = {}
        for path in map(Path, paths):
            open_safetensors(path)  # refuses a file safetensors would not read, with a diagnosis
            start, header = _header(path)
            self._where.update((k, (path, start, e)) for k, e in header.items() if k != "__metadata__")

    def __getitem__(self, key: str) -> Tensor:
        path, start, entry = self._where[key]
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None or sys.byteorder != "little":  # safetensors reads what this reader does not (bytes as stored)
            return open_safetensors(path).get_tensor(key).clone()  # the handle, and its mapping, dropped at once
        out = torch.empty(entry["shape"], dtype=dtype)
        begin, end = entry["data_offsets"]
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy()).cast("B")
        if view.nbytes != end - begin:
            raise CheckpointError(
                f"{str(path)!r} is corrupt: its tensor {key!r} has {end - begin} bytes for {view.nbytes}"
            )
        with open(path, "rb", buffering=0) as f:
            f.seek(start + begin)
            while view.nbytes:
                n = f.readinto(view)
                if not n:
                    raise CheckpointError(f"{str(path)!r} ended inside its tensor {key!r}: copy the file again")
                view = view[n:]
        return out

    def __contains__(self, key: object) -> bool:  # Mapping's own would read the tensor
        return key in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


# safetensors' dtype names (its format's specification) for the dtypes this reader reads itself.
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _header(path: Path) -> tuple[int, dict]:
    """Where a safetensors file's data starts, and its header: 8 bytes of little-endian length, then that many of
    JSON (name -> dtype, shape, data_offsets from the data's start), as the format states it."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return 8 + n, json.loads(f.read(n))


class Renamed(Mapping[str, Tensor]):
    """The tensors of ``source`` under other names (``names``: new -> source's), read from it only when asked for."""

    def __init__(self, source: Mapping[str, Tensor], names: dict[str, str]) -> None:
        self._source, self._names = source, names

    def __getitem__(self, key: str) -> Tensor:
        return self._source[self._names[key]]

    def __contains__(self, key: object) -> bool:
        return key in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def under(source: Mapping[str, Tensor], prefix: str) -> Renamed:
    """The tensors of ``source`` whose names start with ``prefix`` (a layer's), named without it; none read."""
    return Renamed(source, {k[len(prefix) :]: k for k in source if k.startswith(prefix)})


def read_tensors(paths: list[str | Path]) -> Mapping[str, Tensor]:
    """Every tensor of the weights files ``paths`` by name: local safetensors files read as asked (``TensorFiles``),
    other files (``pytorch_model.bin``, a URL) whole, weights-only (``load_file``)."""
    if all(str(p).endswith(".safetensors") and not is_remote(p) for p in paths):
        return TensorFiles([Path(str(p).removeprefix("file://")) for p in paths])
    tensors: dict[str, Tensor] = {}
    for path in paths:
        tensors.update(extract_state_dict(load_file(path)))
    return tensors


def on_meta(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` as meta tensors of the same shapes and dtypes: what an inverse conversion needs to name the keys it
    writes, without allocating (GPT-2's transposes) or reading anything."""
    return {k: torch.empty_like(v, device="meta") for k, v in tensors.items()}


def assign_weights(net: nn.Module, sd: dict[str, Tensor], name: str) -> nn.Module:
    """Give ``net`` the tensors of ``sd`` (keyed as its state dict), emptying ``sd`` as it goes.

    A parameter or buffer on the meta device becomes the tensor itself (``sd``'s tensors are the net's to keep, as
    ``read_tensors`` and the converters make them), cast to the dtype the net was built with, and copied only where
    it is not memory of its own (a view into a larger tensor, a tensor already given to another parameter);
    parameters the net shares (a tied head) stay one, set from their first name (the converter checks the others
    equal). One already in memory is copied into, as ``load_state_dict`` does. A shape that differs, or anything left
    on the meta device afterwards (a tensor no one set, a buffer not rebuilt), is refused by name: a net is never
    returned with a part missing."""
    given: dict[int, Tensor] = {}  # id of a meta tensor -> what replaced it
    storages: set[int] = set()  # the memory already given away
    for key, target in net.state_dict(keep_vars=True).items():
        value = sd.pop(key)
        if value.shape != target.shape:
            raise InputError(f"{name}: {key} has shape {tuple(value.shape)}, the net's is {tuple(target.shape)}")
        if not target.is_meta:
            with torch.no_grad():
                target.copy_(value)
            continue
        if id(target) not in given:
            owned = _own(value, target.dtype, storages)
            is_param = isinstance(target, nn.Parameter)
            given[id(target)] = nn.Parameter(owned, target.requires_grad) if is_param else owned
        owner, _, attr = key.rpartition(".")
        setattr(net.get_submodule(owner), attr, given[id(target)])
    tensors = itertools.chain(net.named_parameters(remove_duplicate=False), net.named_buffers(remove_duplicate=False))
    left = [k for k, t in tensors if t.is_meta]
    if left:
        shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
        raise InputError(f"{name} left {len(left)} tensors of the net unset ({shown}): nothing loaded or computed them")
    return net


def _own(value: Tensor, dtype: torch.dtype, storages: set[int]) -> Tensor:
    """``value`` in ``dtype``, in memory no other tensor of the net holds: itself where it is exactly its storage
    (what ``TensorFiles`` reads, or a fused tensor a converter made), else a copy."""
    storage = value.untyped_storage()
    mine = (
        storage.data_ptr() not in storages
        and value.storage_offset() == 0
        and storage.nbytes() == value.numel() * value.element_size()
        and value.is_contiguous()
        and value.dtype == dtype
    )
    out = value if mine else torch.empty(value.shape, dtype=dtype, device=value.device).copy_(value)
    storages.add(out.untyped_storage().data_ptr())
    return out
