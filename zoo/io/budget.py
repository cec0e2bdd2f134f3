"""Stored values bounded before use: a size, count or length that a file sets (a checkpoint's or registered model's
stored config, a pretrained folder's ``config.json``, a request's params) is checked here before anything is
allocated or started, and one over its bound is one line naming it, the bound and how to raise it.

Typed is not bounded: ``vocab_size: int`` takes 10**9, and the net then fails its allocation with a long traceback,
or a loop of 10**9 episodes runs for days. The rules, by the setting's name wherever it occurs in the config:

- memory: each net the config describes is built on the meta device (no memory, no initialisation) and the bytes of
  its parameters and buffers counted as they are registered, stopping once past the bound, so a net of any size is
  judged in milliseconds; LoRA adapters add ``r * (in + out)`` per linear or conv layer, and one batch of images
  ``batch_size * channels * side**2`` floats. The bound is this machine's memory (``ZOO_MEMORY_GIB`` replaces it);
- ``LIMITS``: loop counts, generation lengths, generated-data sizes and layer counts, each refused above its bound
  (10**9 episodes is a hang, never a setting);
- ``CAPPED``: worker and thread counts, lowered to the CPUs this process may use with a line (what they compute is
  the same at any count); ``PROCESSES``: env and actor counts, which change what a run does, refused past a
  multiple of them.

``ZOO_BUDGET=off`` lifts every bound, for files the user vouches for (their own checkpoint, trained on a larger
machine). The user's own YAML and flags are not checked: they are theirs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from zoo.errors import InputError

OFF = "ZOO_BUDGET"  # "off": no bounds (the user's own files)
MEMORY = "ZOO_MEMORY_GIB"  # the memory bound in GiB, in place of this machine's
RAISE = f"set {OFF}=off to lift the bounds for a file you trust"

# Loop counts, lengths and sizes, by name: above these a stored value is a hang or a bomb, not a setting. Each is far
# above what the zoo's configs and the public models use (1000 diffusion steps, 32k-token contexts, 128 layers).
LIMITS = {
    "eval_episodes": 10_000,
    "predict_episodes": 10_000,
    "max_new_tokens": 65_536,
    "num_timesteps": 100_000,  # a diffusion schedule's steps, each a sampling step
    "steps": 10_000,  # a sampler's
    "n_layer": 1024,
    "layers": 1024,
    "depth": 1024,
    "num_res_blocks": 1024,
    "mtp_depth": 1024,
    "num_samples": 10_000_000,  # generated data
    "num_train": 10_000_000,
    "num_val": 10_000_000,
    "num_test": 10_000_000,
    "val_samples": 10_000_000,
    "samples_per_epoch": 10_000_000,
    "bpe_vocab_size": 1 << 20,  # merges a tokenizer is trained to
    "r": 65_536,  # a LoRA rank: above the widest layer of any public model
}
CAPPED = frozenset({"num_workers", "tokenize_workers", "num_threads"})
PROCESSES = frozenset({"num_envs", "eval_envs", "num_actors", "async_actors", "envs_per_actor"})
SIDES = frozenset({"image_size", "img_size", "resolution", "sample_size"})
CHANNELS = frozenset({"in_channels", "in_chans"})


class Over(BaseException):
    """Raised by the registration hooks once the count passes the bound (a BaseException: a constructor's own
    ``except Exception`` must not swallow it)."""

    def __init__(self, total: int) -> None:
        self.total = total


def enabled() -> bool:
    return os.environ.get(OFF, "").strip().lower() not in ("off", "0", "false", "no")


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def process_bound() -> int:
    return max(16, 2 * cpus())


def memory_bound() -> int:
    """Bytes a load may take: ``ZOO_MEMORY_GIB``, else this machine's RAM (a GPU's memory is smaller still, but a
    checkpoint is built on the CPU first)."""
    given = os.environ.get(MEMORY)
    if given:
        try:
            return int(float(given) * 2**30)
        except ValueError:
            raise InputError(f"{MEMORY}={given!r} is not a number of GiB: set it to one (16, 0.5)") from None
    return host_memory() or sys.maxsize


def host_memory() -> int | None:
    """Bytes of this machine's RAM; None where it cannot be read."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return None


# -- counts ---------------------------------------------------------------------------------------------------------


def check_counts(values: dict[str, Any], source: str) -> dict[str, int]:
    """``values`` (dotted name -> value, as ``settings`` walks them) within ``LIMITS`` and ``PROCESSES``, else
    ``InputError`` naming the first over; returns the ``CAPPED`` ones that must be lowered, with their new value."""
    if not enabled():
        return {}
    lowered = {}
    for where, value in values.items():
        name = where.rsplit(".", 1)[-1].split("[", 1)[0]
        bound = LIMITS.get(name) or (process_bound() if name in PROCESSES else None)
        if bound is not None and value > bound:
            raise InputError(f"{source}: {where}={value:,} is over the bound of {bound:,}: {RAISE}")
        if name in CAPPED and value > cpus():
            lowered[where] = cpus()
    if lowered and os.environ.get("LOCAL_RANK", "0") == "0":  # once, not from every rank DDP launches
        said = ", ".join(f"{k}={values[k]} to {v}" for k, v in lowered.items())
        print(f"{source}: lowered {said} (the CPUs this process may use; {OFF}=off keeps them)", file=sys.stderr)
    return lowered


def settings(value: Any, where: str = "") -> Iterator[tuple[str, int]]:
    """Every whole number in a config (a ``zoo.io.build.Part`` tree, or dicts and lists), by dotted name."""
    args = getattr(value, "args", None) if not isinstance(value, dict) else value
    if isinstance(args, dict):
        for key, v in args.items():
            yield from settings(v, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from settings(v, f"{where}[{i}]")
    elif type(value) is int:
        yield where, value


# -- memory ---------------------------------------------------------------------------------------------------------


def check_memory(nets: list[tuple[str, Any]], values: dict[str, int], source: str) -> None:
    """The nets ``nets`` (name -> how to build one) built on the meta device, their bytes with one batch of
    ``values``' images and LoRA adapters against ``memory_bound()``, else ``InputError`` naming the largest sizes."""
    if not enabled():
        return
    bound = memory_bound()
    need, built = 0, []
    for _, make in nets:
        size, net = meta_bytes(make, bound - need)
        need += size
        built += [net] if net is not None else []
    need += lora_bytes(built, values) + batch_bytes(values)
    if need > bound:
        named = [k for k, v in sorted(values.items(), key=lambda kv: -kv[1]) if not k.endswith("seed")][:3]
        shown = ", ".join(f"{k}={values[k]:,}" for k in named)
        raise InputError(
            f"{source}: the net it describes ({shown}) needs about {need / 2**30:,.1f} GiB, over the bound of "
            f"{bound / 2**30:,.1f} GiB ({_whose()}): set {MEMORY}=<GiB> to raise it, or {OFF}=off for "
            "a file you trust"
        )


def _whose() -> str:
    return f"{MEMORY}" if os.environ.get(MEMORY) else "this machine's memory"


def meta_bytes(make: Any, bound: int) -> tuple[int, nn.Module | None]:
    """Bytes of the parameters and buffers ``make()`` registers when built on the meta device, counted as they are
    and stopped past ``bound``; and the net (None when stopped). A constructor that cannot run on the meta device
    counts what it registered before it failed: the real build follows anyway."""
    total = 0

    def count(module: nn.Module, name: str, tensor: Any) -> None:
        nonlocal total
        if isinstance(tensor, torch.Tensor):
            total += tensor.numel() * tensor.element_size()
            if total > bound:
                raise Over(total)

    from torch.nn.modules import module as torch_module

    hooks = [
        torch_module.register_module_parameter_registration_hook(count),
        torch_module.register_module_buffer_registration_hook(count),
    ]
    try:
        with torch.device("meta"):
            net = make()
        return total, net
    except Over as over:
        return over.total, None
    except Exception:  # an estimate only: the build itself reports what is wrong
        return total, None
    finally:
        for hook in hooks:
            hook.remove()


def lora_bytes(nets: list[nn.Module], values: dict[str, int]) -> int:
    """LoRA's A (r, in) and B (out, r) on every linear and conv layer of ``nets`` (what an empty ``targets`` adapts,
    and more than any other), in float32."""
    r = max((v for k, v in values.items() if k.endswith("lora.r")), default=0)
    layers = (m for net in nets for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)))
    return sum(r * (m.weight.shape[0] + m.weight[0].numel()) * 4 for m in layers)


def batch_bytes(values: dict[str, int]) -> int:
    """One batch of images as float32: ``batch_size * channels * side**2``, from the largest of each the config
    names (channels 3 and batch 1 where it names none)."""
    side = _largest(values, SIDES, 0)
    return _largest(values, {"batch_size"}, 1) * _largest(values, CHANNELS, 3) * side * side * 4


def _largest(values: dict[str, int], names: frozenset[str] | set[str], default: int) -> int:
    return max((v for k, v in values.items() if k.rsplit(".", 1)[-1] in names), default=default)


# -- the way in -----------------------------------------------------------------------------------------------------


def check(config: Any, source: str, nets: list[tuple[str, Any]] = (), own: tuple[str, ...] = ()) -> None:
    """Every bound on a stored ``config`` (a ``zoo.io.build.Part`` tree, or a dict of settings), before anything it
    describes is built: counts (``CAPPED`` ones lowered in place), then the memory of ``nets`` ((name, a function
    building one: ``zoo.io.build.check`` gives a Part tree's) with one batch. One ``InputError`` line if over.
    ``own``: the settings (dotted, as ``settings`` names them) the user gave on top: their counts are theirs."""
    values = dict(settings(config))
    stored = {k: v for k, v in values.items() if not any(k == o or k.startswith(f"{o}.") for o in own)}
    for where, value in check_counts(stored, source).items():
        if "[" not in where:  # a count inside a list is not a worker count
            _set(config, where, value)
            values[where] = value
    check_memory(list(nets), values, source)


def check_kwargs(cls: type[nn.Module], kwargs: dict[str, Any], source: str, dtype: torch.dtype = torch.float32) -> None:
    """``check`` on the arguments a family's converter made for ``cls`` from a folder's ``config.json``, its floating
    parameters and buffers counted at the ``dtype`` the load holds them in."""
    check(dict(kwargs), str(source), nets=[(cls.__name__, lambda: _in_dtype(lambda: cls(**kwargs), dtype))])


def _in_dtype(make: Any, dtype: torch.dtype) -> nn.Module:
    """``make()`` with ``dtype`` as torch's default dtype, so that ``meta_bytes`` counts floating tensors at its size
    as they are registered (a float32 buffer a class asks for by name stays float32)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make()
    finally:
        torch.set_default_dtype(old)


def _set(config: Any, where: str, value: int) -> None:
    """``config``'s setting at the dotted ``where`` (as ``settings`` names it) set to ``value``."""
    keys = where.split(".")
    for key in keys[:-1]:
        config = config[key] if isinstance(config, dict) else config.args[key]
    (config if isinstance(config, dict) else config.args)[keys[-1]] = value
