"""Loading weights that come from outside: weights-only, with errors that name what is wrong.

``load_file`` is the zoo's one reader of checkpoint and weights files, local or remote: a ``.pt``/``.pth``/``.ckpt``
file is read with ``torch.load(weights_only=True)``, which refuses any pickled object that is not a tensor or a
plain container, so a crafted file cannot run code. When a file does not load, ``diagnose`` reads its bytes (never
unpickling them, nor allocating the sizes they declare) to say which it is: truncated, corrupt, not a checkpoint, or a
pickle that would run code.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import pickle
import re
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import torch
from torch import Tensor, nn

from zoo import compat
from zoo.errors import CheckpointError, InputError, TruncatedCheckpointError, UnsafeCheckpointError

REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # an fsspec URL: http(s)://, s3://, memory://, ...


def is_remote(path: str | Path) -> bool:
    return isinstance(path, str) and bool(REMOTE.match(path)) and not path.startswith("file://")


# A registry's names, not files: the application (zoo.tracking) turns them into local files before a module is built.
# Plain URLs stay readable here: reading bytes through fsspec is I/O, like a local file, and needs no registry.
REGISTRY_URIS = ("models:/", "runs:/")


def readable(path: str | Path, key: str = "init_weights") -> str | Path:
    """``path`` as it is when a module can read it itself (a local path or a URL); an ``InputError`` naming ``key``
    for an MLflow URI, which only the application resolves."""
    if isinstance(path, str) and path.startswith(REGISTRY_URIS):
        raise InputError(
            f"{key}={path!r} is an MLflow URI, which a module does not resolve: cli.py resolves it for "
            f"you; from Python, pass the local file zoo.tracking.local_weights({path!r}) returns"
        )
    return path


def load_file(path: str | Path, map_location: str | torch.device | None = "cpu", mmap: bool = False) -> dict:
    """Read a checkpoint or weights file, local or at an fsspec URL (http://, s3://, memory://), weights-only.

    The zoo's one reader of ``.ckpt``/``.pt``/``.pth``/``.bin``/``.safetensors`` files: a pickle that would run
    code is refused (``UnsafeCheckpointError``), and a truncated or foreign file says so, naming it
    (``CheckpointError``). ``mmap`` maps a local file's tensors instead of reading them, so reading only its
    hyperparameters costs little.
    """
    if is_remote(readable(path, "weights file")):
        data = _download(str(path))
        return _read(io.BytesIO(data), str(path), len(data), map_location)
    path = Path(str(path).removeprefix("file://"))
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist: pass the path of a local file")
    return _read(path, str(path), path.stat().st_size, map_location, mmap)


def load_bytes(data: bytes, name: str, map_location: str | torch.device | None = "cpu") -> dict:
    """``load_file`` for bytes already in memory (an archive's member), weights-only; ``name`` names them in errors."""
    return _read(io.BytesIO(data), name, len(data), map_location)


def _read(source: Path | io.BytesIO, name: str, size: int, map_location, mmap: bool = False) -> dict:
    """Load a local file or downloaded bytes weights-only; a failure is diagnosed from the bytes, naming ``name``."""
    device = map_location if isinstance(map_location, str) else "cpu"
    if why := _archive_lies(source):  # before torch reads a record: it would inflate or allocate what they say
        raise _corrupt(name, size, why)
    with _diagnosed(source, name, size):
        if name.endswith(".safetensors"):
            from safetensors.torch import load
            from safetensors.torch import load_file as load_path

            if isinstance(source, Path):
                return load_path(str(source), device=device)
            return {k: v.to(device) for k, v in load(source.getvalue()).items()}
        with quiet_protocol_warning():
            mmap = mmap and isinstance(source, Path) and _is_zip(source)
            return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)


def open_safetensors(path: Path):
    """safetensors' ``safe_open`` handle on a local file: its header read and checked, no tensor read yet (each is
    mapped when asked for, ``zoo.io.meta_load``); a file that does not open is diagnosed as ``load_file`` does."""
    from safetensors import safe_open

    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist: pass the path of a local file")
    with _diagnosed(path, str(path), path.stat().st_size):
        return safe_open(str(path), "pt")


@contextlib.contextmanager
def _diagnosed(source: Path | io.BytesIO, name: str, size: int) -> Iterator[None]:
    """A file that does not load refused with what its bytes say it is (``diagnose``), naming ``name``."""
    try:
        yield
    except Exception as err:
        with source.open("rb") if isinstance(source, Path) else contextlib.nullcontext(source) as f:
            f.seek(0)
            verdict = diagnose(f, name, size)
        if verdict is None:
            raise
        raise verdict from err


@contextlib.contextmanager
def quiet_protocol_warning() -> Iterator[None]:
    """torch warns about a plain pickle's protocol before refusing it; the refusal says what is wrong."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        yield


def _download(url: str) -> bytes:
    """The bytes at an fsspec URL, in memory: nothing is cached on disk (torch.hub's download would keep a copy)."""
    import fsspec

    with fsspec.open(url, "rb") as f:
        return f.read()


def _is_zip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == ZIP_MAGIC


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since 1.6: a zip archive of data.pkl and one record per tensor


def diagnose(f: BinaryIO, name: str, size: int) -> CheckpointError | None:
    """Why the file in ``f`` (``size`` bytes) failed to load, found without unpickling anything and without
    allocating any size the file declares: truncated, corrupt (sizes or offsets past its end, a broken header),
    not a checkpoint, or a pickle that would run code; None when it looks whole (the loader's error then stands)."""
    head = f.read(9)
    f.seek(0)
    if size == 0 or (head[:4] == ZIP_MAGIC and not zipfile.is_zipfile(f)):  # a zip's directory is at its end
        return _truncated(name, size)
    if head[:4] == ZIP_MAGIC:
        try:
            with zipfile.ZipFile(f) as z:
                if why := _zip_past_its_end(z, size):
                    return _corrupt(name, size, why)
                if why := _zip_lies(z):
                    return _corrupt(name, size, why)
                pickled = [n for n in z.namelist() if n.endswith("data.pkl")]
                return _unsafe(io.BytesIO(z.read(pickled[0])), name) if pickled else _not_a_checkpoint(name, size, head)
        except (zipfile.BadZipFile, EOFError, ValueError, OSError) as err:  # a directory that lies about its records
            return _corrupt(name, size, f"its contents do not read ({str(err) or type(err).__name__})")
    if head[:1] == pickle.PROTO and 2 <= head[1] <= pickle.HIGHEST_PROTOCOL:  # a plain or legacy torch pickle
        try:
            return _unsafe(f, name) or _not_a_checkpoint(name, size, head)
        except ValueError as err:  # the opcode stream ends, or breaks, before its STOP
            ended = "exhausted" in str(err) or "not enough data" in str(err)
            return _truncated(name, size) if ended else _not_a_checkpoint(name, size, head)
    if name.endswith(".safetensors") and size >= 8:
        return _safetensors_verdict(f, name, size)
    if head[8:9] == b"{" and isinstance(verdict := _safetensors_verdict(f, name, size), TruncatedCheckpointError):
        return verdict  # a safetensors file by another name, cut short
    return _not_a_checkpoint(name, size, head)


def _zip_past_its_end(z: zipfile.ZipFile, size: int) -> str | None:
    """A record the zip's directory places past the end of the file (``size`` bytes), or None: read before any
    record is, so an absurd declared size is never allocated."""
    for info in z.infolist():
        if info.header_offset + info.compress_size > size or (
            info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size
        ):
            return f"its record {info.filename} declares {info.file_size} bytes at offset {info.header_offset}"
    return None


def _archive_lies(source: Path | io.BytesIO) -> str | None:
    """What a torch zip archive in ``source`` says that its records do not hold (``_zip_lies``), or None; None too
    for a file that is no zip or whose directory does not read (the loader's failure is diagnosed instead)."""
    with source.open("rb") if isinstance(source, Path) else contextlib.nullcontext(source) as f:
        f.seek(0)
        try:
            if f.read(4) != ZIP_MAGIC:
                return None
            f.seek(0)
            with zipfile.ZipFile(f) as z:
                return _zip_lies(z)
        except (zipfile.BadZipFile, EOFError, ValueError, OSError):
            return None
        finally:
            f.seek(0)


# What torch.save writes beside data.pkl and the storage records: its format's version stamps.
TORCH_ZIP_MEMBERS = ("version", "byteorder", ".format_version", ".storage_alignment")


def _zip_lies(z: zipfile.ZipFile) -> str | None:
    """Why the torch archive ``z`` is not what torch.save writes, read from its directory and data.pkl's opcodes
    (nothing unpickled, no record inflated): a member outside the archive's one folder (zip slip), a record
    compressed (torch stores them as they are, so a deflated one is a zip bomb), a storage record whose size is
    not what data.pkl declares for it (torch would fail, or allocate the declared size), a record no storage
    names. None when it is whole, or holds no data.pkl (not torch's format: diagnosed elsewhere)."""
    infos = z.infolist()
    pickles = [i for i in infos if i.filename.endswith("data.pkl")]
    if len(pickles) != 1:
        return f"it holds {len(pickles)} data.pkl records" if pickles else None
    folder = pickles[0].filename[: -len("data.pkl")]
    if folder.count("/") != 1 or folder.startswith(("/", "../")):
        return f"its data.pkl is at {pickles[0].filename!r}, not in one folder as torch.save writes it"
    for info in infos:
        inner = info.filename[len(folder) :]
        if not info.filename.startswith(folder) or ".." in Path(inner).parts or inner.startswith("/"):
            return f"its member {info.filename!r} lies outside the archive's folder {folder!r}"
        if info.compress_type != zipfile.ZIP_STORED:
            return f"its record {info.filename} is compressed (torch.save stores records as they are: a zip bomb?)"
        if not (inner in ("data.pkl", *TORCH_ZIP_MEMBERS) or inner.startswith((".data/", "data/"))):
            return f"it holds a member torch.save does not write ({info.filename!r})"
    try:
        declared = _declared_storages(io.BytesIO(z.read(pickles[0])))
    except ValueError:  # a broken opcode stream: torch's failure is diagnosed from it
        return None
    for key, (kind, numel) in declared.items():
        record = f"{folder}data/{key}"
        itemsize = _storage_itemsize(kind)
        if itemsize is None or type(numel) is not int:
            continue  # not a storage weights-only reads: the unpickler refuses it by name
        held = z.getinfo(record).file_size if record in z.namelist() else None
        if held != numel * itemsize:
            holds = "is missing" if held is None else f"holds {held} bytes"
            wanted = f"{numel} elements of {kind} ({numel * itemsize} bytes)"
            return f"its storage record {record} {holds}, data.pkl declares {wanted}"
    names = {f"{folder}data/{key}" for key in declared}
    extra = sorted(i.filename for i in infos if i.filename.startswith(f"{folder}data/") and i.filename not in names)
    return f"its record {extra[0]} is no storage data.pkl declares" if extra else None


@functools.cache
def _storage_itemsize(kind: str) -> int | None:
    """Bytes per element of a storage class weights-only loads (``torch.FloatStorage``), None for any other name."""
    if not (kind.startswith("torch.") and kind.endswith("Storage") and kind in compat.weights_only_globals()):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy storage classes warn that TypedStorage is deprecated
        dtype = getattr(getattr(torch, kind.removeprefix("torch."), None), "dtype", None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else None


def _declared_storages(f: BinaryIO) -> dict[str, tuple[str, object]]:
    """The storages a torch data.pkl declares, key -> (storage class, element count), from its persistent ids
    (``('storage', torch.FloatStorage, '0', 'cpu', 4)``), found by following its opcodes on a stack of names and
    constants: nothing is unpickled or looked up. Raises ValueError on a broken opcode stream."""
    import pickletools

    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    storages: dict[str, tuple[str, object]] = {}
    for op, arg, _pos in pickletools.genops(f):
        before = op.stack_before
        if op.name == "MARK":
            marks.append(len(stack))
            continue
        if op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[len(memo) if op.name == "MEMOIZE" else arg] = stack[-1] if stack else None
            continue
        items = []
        if pickletools.markobject in before:
            start = marks.pop() if marks else 0
            items, stack[start:] = stack[start:], []
            before = before[: before.index(pickletools.markobject)]
        popped = [stack.pop() if stack else None for _ in before][::-1]
        if op.name in ("GET", "BINGET", "LONG_BINGET"):
            pushed = [memo.get(arg)]
        elif op.name == "GLOBAL":
            pushed = [arg.replace(" ", ".")]
        elif op.name == "STACK_GLOBAL":
            pushed = [f"{popped[0]}.{popped[1]}"]
        elif op.name == "TUPLE":
            pushed = [tuple(items)]
        elif op.name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            pushed = [tuple(popped)]
        elif op.name == "BINPERSID":
            pid = popped[0]
            if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[2], str):
                storages.setdefault(pid[2], (str(pid[1]), pid[4]))
            pushed = [None]
        elif isinstance(arg, (str, int)) and not isinstance(arg, bool) and op.name not in ("PROTO", "FRAME"):
            pushed = [arg]
        else:
            pushed = [None] * len(op.stack_after)
        stack += pushed
    return storages


SAFETENSORS_MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header's length


# Bytes per element of safetensors' dtypes (the sub-byte and other rare ones are left to safetensors' own check).
SAFETENSORS_ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "C64": 8,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}


def _safetensors_verdict(f: BinaryIO, name: str, size: int) -> CheckpointError:
    """What is wrong with a safetensors file, from its header alone (nothing it declares is allocated): an
    absurd header length, a header that is not safetensors' JSON, tensors past the end (truncated), a tensor
    whose shape does not fit its bytes."""
    import json

    header = int.from_bytes(f.read(8), "little")
    if header > SAFETENSORS_MAX_HEADER:
        return _corrupt(
            name,
            size,
            f"its first 8 bytes declare a {header}-byte header, past safetensors' limit of {SAFETENSORS_MAX_HEADER}",
        )
    if 8 + header > size:
        return _truncated(name, size)
    try:
        tensors = {k: e for k, e in json.loads(f.read(header)).items() if k != "__metadata__"}
        spans = {
            k: (*e["data_offsets"], math.prod(e["shape"]) * SAFETENSORS_ITEMSIZE.get(e["dtype"], 0))
            for k, e in tensors.items()
        }
        bad = [k for k, (begin, end, _) in spans.items() if not (type(begin) is type(end) is int and 0 <= begin <= end)]
        if bad:
            raise ValueError(f"tensor {bad[0]!r} has data_offsets {tensors[bad[0]]['data_offsets']}")
    except RecursionError:  # [[[[...]]]]: safetensors' own parser stops at 128 levels, Python's json at its stack
        return _corrupt(name, size, "its header nests its JSON deeper than safetensors' flat table of tensors")
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        return _corrupt(name, size, f"its header is not safetensors' JSON ({type(err).__name__}: {err})")
    if 8 + header + max((end for _, end, _ in spans.values()), default=0) > size:
        return _truncated(name, size)
    for k, (begin, end, nbytes) in spans.items():
        if nbytes and nbytes != end - begin:
            e = tensors[k]
            return _corrupt(
                name,
                size,
                f"its tensor {k!r} ({e['dtype']}, shape {e['shape']}) needs {nbytes} bytes, "
                f"its data_offsets give {end - begin}",
            )
    return _corrupt(name, size, "safetensors does not read it, though its header is whole")


def _truncated(name: str, size: int) -> CheckpointError:
    return TruncatedCheckpointError(
        f"{name} is truncated ({size} bytes): its end is missing, as a copy, download or "
        "save cut short leaves it. Copy or save the checkpoint again."
    )


def _corrupt(name: str, size: int, why: str) -> CheckpointError:
    return CheckpointError(
        f"{name} is corrupt ({size} bytes): {why}. Copy or save the checkpoint again; only load "
        "files you created or trust"
    )


def _not_a_checkpoint(name: str, size: int, head: bytes) -> CheckpointError:
    return CheckpointError(
        f"{name} is not a PyTorch checkpoint ({size} bytes, starting {head[:8]!r}): pass a .ckpt, "
        ".pt, .pth or .safetensors file written by torch.save, Lightning or safetensors"
    )


def _unsafe(f: BinaryIO, name: str) -> UnsafeCheckpointError | None:
    """The refusal of a pickle that names callables outside torch, found opcode by opcode (``pickletools``
    executes nothing); None when it names none. Raises ValueError on a broken opcode stream."""
    import pickletools

    names, strings = [], []
    for _ in range(5):  # torch's legacy format is several pickles: magic number, protocol, system info, data
        for op, arg, _pos in pickletools.genops(f):
            strings += [arg] if isinstance(arg, str) else []
            if op.name in ("GLOBAL", "INST"):
                names.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:  # module and name: the last two strings pushed
                names.append(f"{strings[-2]}.{strings[-1]}")
        if f.read(1) != pickle.PROTO:
            break
        f.seek(-1, io.SEEK_CUR)
    # torch's own weights-only rule, name for name: a prefix such as "torch." admits torch.fx's code loaders
    unsafe = sorted(set(names) - compat.weights_only_globals())
    if not unsafe:
        return None
    return UnsafeCheckpointError(
        f"refused to load {name}: it is a pickle that would execute code when loaded (it calls "
        f"{', '.join(unsafe[:5])}). Only load files you created or trust, in the safetensors or weights-only format."
    )


def extract_state_dict(obj: Mapping, prefix: str = "") -> dict[str, Tensor]:
    """Accept a bare state dict, a Lightning checkpoint, or ``{"model": ...}``.

    With ``prefix`` (``"net."``: a zoo module's net) and keys under it, only those keys, the prefix stripped:
    the module's other state (EMA or target copies, buffers of the objective) is not the net's.
    """
    for key in ("state_dict", "model", "module"):
        if key in obj and isinstance(obj[key], Mapping):
            obj = obj[key]
            break
    if prefix and any(k.startswith(prefix) for k in obj):
        return {k[len(prefix) :]: v for k, v in obj.items() if k.startswith(prefix)}
    return dict(obj)


def shape_mismatches(net: nn.Module, state_dict: Mapping[str, Tensor]) -> list[str]:
    """Keys whose shapes differ, and keys present on only one side, as readable lines."""
    own = net.state_dict()
    lines = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    lines += [f"{k}: missing from checkpoint" for k in own.keys() - state_dict.keys()]
    lines += [f"{k}: not in model" for k in state_dict.keys() - own.keys()]
    return sorted(lines)


def check_compatible(net: nn.Module, state_dict: Mapping[str, Tensor], source: str) -> None:
    """Raise an ``InputError`` (a ValueError: at a terminal, one ``error:`` line) listing every mismatched key if
    ``state_dict`` does not fit ``net``: a tensor left over, a parameter not set, a shape that differs."""
    bad = shape_mismatches(net, state_dict)
    if bad:
        listing = "\n  ".join(bad[:50]) + ("\n  ..." if len(bad) > 50 else "")
        raise InputError(
            f"{source} does not match the configured {type(net).__name__} "
            f"({len(bad)} mismatched keys):\n  {listing}\n"
            "Use the config the checkpoint was trained with, or a checkpoint of this model."
        )


def check_all_used(source: Iterable[str], used: Iterable[str], name: str, derived: tuple[str, ...] = ()) -> None:
    """Refuse in one line, naming them, the tensors of ``source`` (a file's keys) that a conversion did not use:
    ``used`` is what the converter's inverse writes back from the converted net, so a source key missing from it
    was never read. Keys ending in ``derived`` are buffers recomputed from the config (RoPE's inv_freq, a mask)."""
    used = set(used)
    left = sorted(k for k in source if k not in used and not k.endswith(derived))
    if left:
        shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
        raise InputError(
            f"{name} holds {len(left)} tensors the net built from its config has no place for ({shown}): loading "
            f"without them would change the model; its config.json and weights disagree, or the zoo lacks that part"
        )


def load_weights(net: nn.Module, path: str | Path, prefix: str = "") -> nn.Module:
    """Load a local weights file into ``net`` weights-only, after checking every key and shape."""
    state_dict = extract_state_dict(load_file(path), prefix)
    check_compatible(net, state_dict, f"weights file {str(path)!r}")
    net.load_state_dict(state_dict)
    return net


# What a sharded checkpoint's ``.metadata`` pickle may name: torch.distributed.checkpoint's metadata classes
# and the torch/pathlib types they hold (recorded from the files torch 2.14 writes). Anything else, such as a
# ``__reduce__`` naming os.system, is refused before it is looked up, so nothing in the file executes.
DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name
    "torch": {"Size"},  # and every torch dtype, checked below
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
DCP_METADATA_FILE = ".metadata"


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if is_dtype or name in DCP_METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a checkpoint metadata class")


def read_sharded_metadata(path: str | Path):
    """torch.distributed.checkpoint's ``Metadata`` from ``path`` (a sharded checkpoint folder or its ``.metadata``
    file), unpickled with only the metadata classes admitted: a crafted file is refused, and runs nothing."""
    path = Path(path)
    file = path / DCP_METADATA_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{str(file)!r} does not exist: {str(path)!r} is not a sharded checkpoint folder")
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as err:
        raise UnsafeCheckpointError(
            f"refused to read {str(file)!r}: it is not the metadata torch.distributed.checkpoint writes "
            f"(it asks to unpickle other objects, which would execute code from the file). Only load sharded "
            f"checkpoints you created or trust. Detail: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from err
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(
            f"refused to read {str(file)!r}: it holds a {type(metadata).__name__}, not Metadata"
        )
    _check_storage(metadata, file)
    return metadata


def _check_storage(metadata, file: Path) -> None:
    """Refuse metadata that places an entry outside the folder's own data files: a path out of the folder, or
    bytes past a file's end (torch would read another file, or read on to the end, as the entry)."""
    storage_info = compat.dcp_storage_info_type()
    for index, info in (metadata.storage_data or {}).items():
        where = f"{getattr(index, 'fqn', index)!r} in {getattr(info, 'relative_path', info)!r}"
        data = file.parent / str(getattr(info, "relative_path", ""))
        if not (
            isinstance(info, storage_info)
            and isinstance(info.relative_path, str)
            and Path(info.relative_path).name == info.relative_path
            and data.is_file()
        ):
            why = f"places {where}, not a data file of {str(file.parent)!r}"
        elif not (
            type(info.offset) is type(info.length) is int
            and 0 <= info.offset <= info.offset + info.length <= data.stat().st_size
        ):
            why = f"places {where} at bytes {info.offset}+{info.length}, outside its {data.stat().st_size} bytes"
        elif info.transform_descriptors:  # the zoo writes no compressed shards; a decompressor could inflate any size
            why = f"asks for {where} to be read through {list(info.transform_descriptors)}"
        else:
            continue
        raise CheckpointError(f"{str(file)!r} is corrupt: it {why}. Only load sharded checkpoints you created or trust")


def classifier_head(net: nn.Module) -> str:
    """The name of the net's classifier head: its last ``nn.Linear`` (ConvNet ``head``, ResNet ``fc``, torchvision
    ViT ``heads.head``, ConvNeXt ``classifier.2``), the layer whose size is the number of classes."""
    names = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError(f"{type(net).__name__} has no nn.Linear classifier head to resize")
    return names[-1]


def replace_head(net: nn.Module, num_classes: int) -> str:
    """Give ``net`` a fresh head of ``num_classes`` outputs (``net.num_classes`` follows); one line saying so."""
    name = classifier_head(net)
    old = net.get_submodule(name)
    parent, _, attr = name.rpartition(".")
    setattr(net.get_submodule(parent), attr, nn.Linear(old.in_features, num_classes, bias=old.bias is not None))
    net.num_classes = num_classes
    return f"{name}: ({old.out_features}, {old.in_features}) -> ({num_classes}, {old.in_features})"


def load_with_new_head(
    net: nn.Module, state_dict: Mapping[str, Tensor], source: str, heads: list[str] | None = None
) -> list[str]:
    """Load pretrained weights into ``net`` whose head may differ in size (fine-tuning to other classes): the
    tensors of ``heads`` (module names; default the classifier head) whose shapes differ keep ``net``'s fresh
    values, every other key must match. Returns a line per tensor left out ("fc.weight: (1000, 512) in the
    weights, (5, 512) here"), empty when all loaded."""
    prefixes = tuple(f"{h}." for h in (heads or [classifier_head(net)]))
    own = net.state_dict()
    skipped = [
        k
        for k, v in state_dict.items()
        if k.startswith(prefixes) and k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    kept = {k: v for k, v in state_dict.items() if k not in skipped}
    check_compatible(net, {**kept, **{k: own[k] for k in skipped}}, source)
    net.load_state_dict(kept, strict=False)
    return [f"{k}: {tuple(state_dict[k].shape)} in the weights, {tuple(own[k].shape)} here" for k in skipped]
