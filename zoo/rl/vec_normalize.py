"""Stable-Baselines3's ``VecNormalize`` statistics (``vec_normalize.pkl``, its ``save``) read as data: the pickle's
opcodes walked with the standard library (``pickletools.genops``), nothing imported, called or built.

Unpickling runs whatever the file names, so the file is never unpickled. The walk keeps a stack of plain values
(numbers, strings, bytes, lists, dicts, tuples) and, for what a real unpickler would build, an inert record of the
name and its arguments (``Call``); a name outside the few that ``VecNormalize.save`` writes (SB3's two classes,
gymnasium's spaces, NumPy's arrays, dtypes, scalars and random generators) is refused by name, as is an opcode it
never writes. The numbers come from NumPy's array payloads (``_reconstruct``'s state: shape, dtype, raw bytes), their
sizes checked against the bytes before any array exists.

What the agent needs is then taken from the record: ``obs_rms`` (mean, var, count), ``clip_obs``, ``epsilon``,
``norm_obs``, ``norm_reward`` with ``ret_rms``, ``clip_reward`` and ``gamma``; a field no SB3 version writes is refused
by name, so a future one that changes the normalisation is not ignored.
"""

from __future__ import annotations

import math
import pickletools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zoo.errors import InputError

MAX_BYTES = 256 * 2**20  # a Box of 84x84x4 observations writes under 2 MB (mean, var, the last observations)

_ARRAY = ("_reconstruct", "_frombuffer")
_NUMPY = ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric")
_RANDOM = (
    {  # a space's random generator, pickled with it once seeded (never used here)
        ("numpy.random._pickle", name) for name in ("__generator_ctor", "__bit_generator_ctor", "__randomstate_ctor")
    }
    | {(f"numpy.random._{m.lower()}", m) for m in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")}
    | {("numpy.random.bit_generator", n) for n in ("SeedSequence", "__pyx_unpickle_SeedSequence")}
)
NAMES = (
    {(m, n) for m in _NUMPY for n in (*_ARRAY, "scalar")}
    | {("numpy", "ndarray"), ("numpy", "dtype")}
    | {
        ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize"),
        ("stable_baselines3.common.running_mean_std", "RunningMeanStd"),
        ("gymnasium.spaces.box", "Box"),
        ("gymnasium.spaces.discrete", "Discrete"),
        ("gymnasium.spaces.multi_discrete", "MultiDiscrete"),
        ("gymnasium.spaces.multi_binary", "MultiBinary"),
    }
    | _RANDOM
)
# VecNormalize's attributes as its save writes them (VecEnv's, then its own), across SB3 versions.
FIELDS = {
    "num_envs", "observation_space", "action_space", "render_mode", "reset_infos", "_seeds", "_options", "metadata",
    "norm_obs", "norm_obs_keys", "obs_rms", "ret_rms", "clip_obs", "clip_reward", "gamma", "epsilon", "training",
    "norm_reward", "old_reward", "old_obs", "obs_spaces",
}  # fmt: skip
DTYPES = {"f4", "f8", "f2", "b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"}


@dataclass
class Call:
    """What an unpickler would build by calling ``name`` on ``args`` and setting ``state``: recorded, never done."""

    name: tuple[str, str]
    args: tuple = ()
    state: Any = None


@dataclass
class VecNormalizeStats:
    """The observation (and return) statistics and settings of a saved ``VecNormalize``."""

    obs_mean: np.ndarray
    obs_var: np.ndarray
    obs_count: float
    clip_obs: float
    epsilon: float
    norm_obs: bool
    norm_reward: bool
    clip_reward: float
    gamma: float
    ret: tuple[float, float, float] = field(default=(0.0, 1.0, 1e-4))  # the discounted return's mean, var, count


def refuse(path: str, why: str) -> InputError:
    return InputError(f"{path} is not a VecNormalize statistics file the zoo reads: {why}")


# -- the walk -----------------------------------------------------------------------------------------------------

_PUSH = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_VALUES = {  # opcodes whose argument is the value pushed
    "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
    "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BYTEARRAY8",
}  # fmt: skip


def walk(data: bytes, path: str) -> Any:
    """The value the pickle ``data`` describes, with every object it would build as an inert ``Call``."""
    stack: list[Any] = []
    marks: list[list[Any]] = []
    memo: dict[int, Any] = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in _VALUES:
                stack.append(bytes(arg) if isinstance(arg, (bytes, bytearray)) else arg)
            elif name in _PUSH:
                stack.append(_PUSH[name])
            elif name in ("PROTO", "FRAME"):
                pass
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name in ("TUPLE", "APPENDS", "SETITEMS"):
                items, stack = stack, marks.pop()
                if name == "TUPLE":
                    stack.append(tuple(items))
                elif name == "APPENDS":
                    _list(stack[-1], path).extend(items)
                else:
                    _dict(stack[-1], path).update(zip(items[::2], items[1::2], strict=True))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                stack[-n:] = [tuple(stack[-n:])]
            elif name == "APPEND":
                value = stack.pop()
                _list(stack[-1], path).append(value)
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                _dict(stack[-1], path)[key] = value
            elif name in ("MEMOIZE", "BINPUT", "LONG_BINPUT"):
                memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name in ("STACK_GLOBAL", "GLOBAL"):
                where = tuple(arg.split(" ", 1)) if name == "GLOBAL" else tuple(reversed([stack.pop(), stack.pop()]))
                if where not in NAMES:
                    raise refuse(path, f"it names {'.'.join(map(str, where))}, which VecNormalize.save never writes")
                stack.append(Call(where))
            elif name in ("REDUCE", "NEWOBJ"):
                args, cls = stack.pop(), stack.pop()
                if not isinstance(cls, Call) or cls.args or not isinstance(args, tuple):
                    raise refuse(path, f"its {name} applies something other than a name to a tuple")
                stack.append(Call(cls.name, args))
            elif name == "BUILD":
                state = stack.pop()
                if not isinstance(stack[-1], Call):
                    raise refuse(path, "its BUILD sets the state of something not built")
                stack[-1].state = state
            elif name == "STOP":
                return stack.pop()
            else:
                raise refuse(path, f"it holds the pickle opcode {name}, which VecNormalize.save never writes")
    except InputError:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as err:  # a truncated or malformed stream
        raise refuse(path, f"its pickle stream is malformed ({type(err).__name__}: {err})") from None
    raise refuse(path, "its pickle stream has no STOP")


def _list(value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise refuse(path, "it appends to something not a list")
    return value


def _dict(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise refuse(path, "it sets an item of something not a dict")
    return value


# -- the numbers --------------------------------------------------------------------------------------------------


def _dtype(value: Any, path: str) -> np.dtype:
    """A ``numpy.dtype(code, False, True)`` record with its byte order (state[1]) as a NumPy dtype."""
    if not (isinstance(value, Call) and value.name == ("numpy", "dtype") and value.args[:1]):
        raise refuse(path, "an array's dtype is not a numpy.dtype")
    code, state = value.args[0], value.state
    order = state[1] if isinstance(state, tuple) and len(state) > 1 and state[1] in ("<", ">", "|", "=") else "="
    if code not in DTYPES:
        raise refuse(path, f"it holds an array of dtype {code!r}, where VecNormalize's are numbers")
    return np.dtype(code).newbyteorder(order) if order in "<>" else np.dtype(code)


def array(value: Any, path: str, what: str) -> np.ndarray:
    """The float64 array a ``_reconstruct`` (or protocol 5's ``_frombuffer``) record describes; its size checked
    against its bytes before it is made; a NumPy or Python scalar (a return's statistics) as a 0-d one."""
    if (isinstance(value, Call) and value.name[1] == "scalar") or type(value) in (int, float):
        return np.array(number(value, path, what))
    if not isinstance(value, Call) or value.name[1] not in _ARRAY:
        raise refuse(path, f"its {what} is not a NumPy array")
    if value.name[1] == "_reconstruct":  # state: (version, shape, dtype, fortran order, raw bytes)
        state = value.state if isinstance(value.state, tuple) and len(value.state) == 5 else None
        shape, dtype, fortran, raw = state[1:] if state else (None, None, None, None)
    else:  # _frombuffer(buffer, dtype, shape, order)
        raw, dtype, shape, fortran = (value.args + (None,) * 4)[:4]
        fortran = fortran == "F"
    if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape) and isinstance(raw, bytes)):
        raise refuse(path, f"its {what} is not an array of shape and bytes")
    dtype = _dtype(dtype, path)
    if math.prod(shape) * dtype.itemsize != len(raw):
        raise refuse(path, f"its {what} of shape {shape} holds {len(raw)} bytes, not {math.prod(shape)} {dtype}s")
    flat = np.frombuffer(raw, dtype=dtype).astype(np.float64)
    return flat.reshape(shape, order="F" if fortran else "C")


def number(value: Any, path: str, what: str) -> float:
    """A Python number, or a NumPy scalar record (``scalar(dtype, bytes)``)."""
    if isinstance(value, Call) and value.name[1] == "scalar" and len(value.args) == 2:
        dtype, raw = _dtype(value.args[0], path), value.args[1]
        if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
            raise refuse(path, f"its {what} is a NumPy scalar of the wrong size")
        value = np.frombuffer(raw, dtype=dtype)[0].item()
    if type(value) not in (int, float, bool) or not math.isfinite(value):
        raise refuse(path, f"its {what} is {value!r}, not a finite number")
    return float(value)


def _rms(value: Any, path: str, what: str) -> tuple[np.ndarray, np.ndarray, float]:
    if not (isinstance(value, Call) and value.name[1] == "RunningMeanStd" and isinstance(value.state, dict)):
        kind = "a dict of them (a Dict observation space)" if isinstance(value, Call) else repr(type(value).__name__)
        raise refuse(path, f"its {what} is {kind}, not one RunningMeanStd, as the zoo's agents keep")
    state = value.state
    if set(state) != {"mean", "var", "count"}:
        raise refuse(path, f"its {what} holds {sorted(state)}, not mean, var and count")
    mean, var = array(state["mean"], path, f"{what}.mean"), array(state["var"], path, f"{what}.var")
    count = number(state["count"], path, f"{what}.count")
    if mean.shape != var.shape or not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all()):
        raise refuse(path, f"its {what} has a mean and variance of other shapes or not finite and >= 0")
    return mean, var, count


def read_vec_normalize(path: str | Path) -> VecNormalizeStats:
    """The statistics of the ``vec_normalize.pkl`` at ``path``, read as data (see above), or one line naming why not."""
    path = Path(path)
    name = str(path)
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise refuse(name, f"it is larger than {MAX_BYTES:,} bytes")
    top = walk(data, name)
    if not (isinstance(top, Call) and top.name[1] == "VecNormalize" and isinstance(top.state, dict)):
        raise refuse(name, "it is not a saved VecNormalize")
    state = top.state
    if unknown := sorted(str(k) for k in set(state) - FIELDS):
        raise refuse(name, f"it sets {', '.join(unknown)}, which the zoo does not know: refused, not ignored")
    if state.get("norm_obs_keys") is not None:
        raise refuse(name, "it normalises some keys of a Dict observation (norm_obs_keys), which the zoo lacks")
    missing = [k for k in ("obs_rms", "norm_obs", "clip_obs", "epsilon") if k not in state]
    if missing:
        raise refuse(name, f"it has no {', '.join(missing)}")
    flags = {k: state.get(k, False) for k in ("norm_obs", "norm_reward")}
    if bad := [k for k, v in flags.items() if type(v) is not bool]:
        raise refuse(name, f"its {bad[0]} is not true or false")
    mean, var, count = _rms(state["obs_rms"], name, "obs_rms")
    ret = _rms(state["ret_rms"], name, "ret_rms") if state.get("ret_rms") is not None else None
    if ret is not None and ret[0].shape != ():
        raise refuse(name, f"its ret_rms has the shape {ret[0].shape}, not a scalar return's")
    return VecNormalizeStats(
        obs_mean=mean,
        obs_var=var,
        obs_count=count,
        clip_obs=number(state["clip_obs"], name, "clip_obs"),
        epsilon=number(state["epsilon"], name, "epsilon"),
        norm_obs=flags["norm_obs"],
        norm_reward=flags["norm_reward"],
        clip_reward=number(state.get("clip_reward", 10.0), name, "clip_reward"),
        gamma=number(state.get("gamma", 0.99), name, "gamma"),
        ret=(float(ret[0]), float(ret[1]), ret[2]) if ret is not None else (0.0, 1.0, 1e-4),
    )
