"""Stable-Baselines3 agents in: a PPO, A2C, SAC or TD3 zip (SB3's ``model.save``) read, the zoo net it states
(``net_config``) and every tensor of its policy loaded into the zoo's agent module (``load_exact``,
``load_init_weights``: an agent's ``init_weights``), or refused in one line. ``zoo.rl.pretrained.from_pretrained``
builds the whole module, SB3's settings included.

An SB3 zip holds ``data`` (JSON; what JSON cannot hold - classes, spaces, schedules - is a base64 cloudpickle blob
under ":serialized:" with readable fields beside it), ``policy.pth`` (the policy's state dict),
``pytorch_variables.pth`` (SAC's log temperature), the optimizers' states and two text files. Only ``data``'s plain
JSON and the two weights files are read, the weights weights-only (``zoo.io.weights.load_bytes``), by the names SB3
gives them: no blob is ever unpickled, and nothing is extracted by a name the archive gives. What a blob alone would
tell (a custom features extractor, a gSDE policy) is refused by the readable name beside it.

The sizes come from ``policy.pth``'s shapes (hidden widths, observation and action dims) and are checked against the
readable spaces; the action bounds come from the spaces' printed ``low``/``high``, refused where NumPy's printing may
have rounded them. The mapping, SB3 -> zoo (n hidden layers; j = 0, 2, ..., 2n - 2):

    PPO, A2C   mlp_extractor.policy_net.j / value_net.j  -> net.actor.j / net.critic.j
               action_net / value_net                    -> net.actor.2n / net.critic.2n
               log_std (A,)                              -> net.actor_logstd (1, A)
    SAC        actor.latent_pi.j                         -> net.actor.trunk.j
               actor.mu, actor.log_std (A, H) each       -> net.actor.head (2A, H), means first
               critic.qfk.j, critic_target.qfk.j         -> net.critic.qs.k.j, critic_target.qs.k.j
               log_ent_coef (pytorch_variables.pth)      -> log_alpha
    TD3        actor.mu.j, actor_target.mu.j             -> net.actor.mlp.j, actor_target.mlp.j
               critic.qfk.j, critic_target.qfk.j         -> as SAC's

Deterministic actions equal SB3's ``predict(obs, deterministic=True)`` (a Box action clipped to its bounds, as the
zoo's collector clips it). SAC's sampled actions differ: SB3 clamps the actor's log-std to [-20, 2] where the zoo's
actor bounds it smoothly (``zoo.rl.q_nets``). VecNormalize statistics (``vec_normalize.pkl``, a pickle) are not a
zip: ``zoo.rl.vec_normalize`` reads them as data beside one (``zoo.rl.sb3_statistics``, for ``from_pretrained`` and
``init_weights``).
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from zoo.errors import InputError
from zoo.io.weights import load_bytes
from zoo.rl.nets import ActorCritic
from zoo.rl.q_nets import DeterministicActorCritic, SoftActorCritic

MAX_MEMBERS = 32  # SB3 writes 6 to 8
MAX_DATA_BYTES = 16 * 2**20  # a data JSON is about 10 kB, mostly docstrings
MAX_WEIGHTS_BYTES = 2**31  # 2 GiB: a policy of half a billion float32 parameters
_READ = ("data", "policy.pth", "pytorch_variables.pth")

# The policy classes imported, by their module and the class named in their ``__init__``'s repr: SB3's MlpPolicy of
# each algorithm (CnnPolicy, MultiInputPolicy, sb3-contrib's classes are other names, refused by them).
POLICIES = {
    ("stable_baselines3.common.policies", "ActorCriticPolicy"): "on-policy",
    ("stable_baselines3.sac.policies", "SACPolicy"): "SAC",
    ("stable_baselines3.td3.policies", "TD3Policy"): "TD3",
}
# policy_kwargs whose values the import reads or which do not change the function; any other is refused by name.
KNOWN_KWARGS = {
    "net_arch",
    "activation_fn",
    "ortho_init",
    "log_std_init",
    "optimizer_class",
    "optimizer_kwargs",
    "n_critics",
    "share_features_extractor",
    "normalize_images",
    "use_sde",
    "squash_output",
}
ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu"}


@dataclass
class SB3Zip:
    """What is read from a zip: ``data``'s JSON and the tensors of ``policy.pth`` and ``pytorch_variables.pth``."""

    path: str
    data: dict[str, Any]
    policy: dict[str, Tensor]
    variables: dict[str, Tensor] = field(default_factory=dict)


def refuse(path: str, why: str) -> InputError:
    return InputError(f"{path} is not a Stable-Baselines3 agent the zoo imports: {why}")


# -- the zip ------------------------------------------------------------------------------------------------------


def read_zip(path: str | Path) -> SB3Zip:
    """``data``, ``policy.pth`` and ``pytorch_variables.pth`` of an SB3 zip, each read within its bound; a zip with
    members that are not plain names of its own, a name twice, or more members than SB3 writes, refused."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist: pass the .zip Stable-Baselines3's model.save wrote")
    name = str(path)
    with path.open("rb") as f:
        head = f.read(2)
    if head[:1] == pickle.PROTO:
        raise refuse(
            name,
            "it is a pickle (a VecNormalize's vec_normalize.pkl is one), not the agent's zip: pass the zip, with "
            "the statistics as from_pretrained(zip, vec_normalize=...) (read as data, never unpickled)",
        )
    if not zipfile.is_zipfile(path):
        raise refuse(name, "it is not a zip archive")
    with zipfile.ZipFile(path) as z:
        _check_members(z, name)
        names = set(z.namelist())
        for needed in ("data", "policy.pth"):
            if needed not in names:
                raise refuse(name, f"it has no {needed!r} member (it holds {sorted(names)})")
        data = _json(_member(z, "data", MAX_DATA_BYTES, name), name)
        policy = load_bytes(_member(z, "policy.pth", MAX_WEIGHTS_BYTES, name), f"{name}:policy.pth")
        variables = "pytorch_variables.pth" in names and load_bytes(
            _member(z, "pytorch_variables.pth", MAX_WEIGHTS_BYTES, name), f"{name}:pytorch_variables.pth"
        )
    return SB3Zip(name, data, dict(policy), dict(variables or {}))


def _check_members(z: zipfile.ZipFile, name: str) -> None:
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS:
        raise refuse(name, f"it has {len(infos)} members, where SB3 writes fewer than {MAX_MEMBERS}")
    names = [i.filename for i in infos]
    for member in names:
        if member in ("", ".", "..") or set(member) & {"/", "\\", "\0", ":"}:
            raise refuse(name, f"its member {member!r} is not a plain file name, as every member SB3 writes is")
    if twice := sorted({m for m in names if names.count(m) > 1} & set(_READ)):
        raise refuse(name, f"it holds {twice[0]!r} twice, so which is read would be a reader's choice")


def _member(z: zipfile.ZipFile, member: str, max_bytes: int, name: str) -> bytes:
    """At most ``max_bytes + 1`` bytes are inflated, whatever the member declares: a zip bomb is refused unread."""
    with z.open(member) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise refuse(name, f"its member {member!r} is larger than {max_bytes:,} bytes")
    return data


def _json(data: bytes, name: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except RecursionError:
        raise refuse(name, "its 'data' JSON nests deeper than Python parses") from None
    except ValueError as err:
        raise refuse(name, f"its 'data' member is not JSON ({err})") from None
    if not isinstance(value, dict):
        raise refuse(name, f"its 'data' JSON is a {type(value).__name__}, not SB3's object of settings")
    return value


# -- the agent the zip describes: algorithm, features refused by name, spaces --------------------------------------


def algorithm(z: SB3Zip) -> str:
    """ "PPO", "A2C", "SAC" or "TD3", from the policy class's readable module and ``__init__``; PPO and A2C share
    ActorCriticPolicy, and only PPO has a ``clip_range``. DDPG (TD3Policy, one critic, no delay) imports as TD3."""
    policy = z.data.get("policy_class")
    policy = policy if isinstance(policy, dict) else {}
    module, init = str(policy.get("__module__")), str(policy.get("__init__", ""))
    cls = m.group(1) if (m := re.match(r"<function (\w+)\.__init__", init)) else "?"
    kind = POLICIES.get((module, cls))
    if kind is None:
        raise refuse(
            z.path,
            f"its policy class is {module}.{cls}, where the zoo imports SB3's MlpPolicy of PPO, A2C, SAC or TD3 "
            f"({', '.join(f'{m}.{c}' for m, c in POLICIES)})",
        )
    return ("PPO" if "clip_range" in z.data else "A2C") if kind == "on-policy" else kind


def policy_kwargs(z: SB3Zip) -> dict[str, Any]:
    """The readable ``policy_kwargs``, the features the zoo's nets do not have refused by name."""
    kwargs = z.data.get("policy_kwargs") or {}
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith(":")} if isinstance(kwargs, dict) else {}
    if unknown := sorted(set(kwargs) - KNOWN_KWARGS):
        raise refuse(z.path, f"its policy_kwargs set {unknown[0]}={kwargs[unknown[0]]!r}, which the zoo's nets lack")
    if _true(z.data.get("use_sde")) or _true(kwargs.get("use_sde")):
        raise refuse(z.path, "it uses gSDE (use_sde=True), state-dependent exploration the zoo's agents lack")
    if _true(kwargs.get("squash_output")):
        raise refuse(z.path, "its policy squashes actions with tanh (squash_output=True), which the zoo's PPO lacks")
    return kwargs


def _true(value: Any) -> bool:
    return value is True or value == "True"


def activation(z: SB3Zip, algo: str, kwargs: dict[str, Any]) -> str:
    """The hidden activation: the class named by ``activation_fn``'s repr, or SB3's default (Tanh on-policy, ReLU
    off-policy, whose zoo nets have ReLU only)."""
    named = kwargs.get("activation_fn")
    if named is None:
        return "tanh" if algo in ("PPO", "A2C") else "relu"
    cls = m.group(1) if (m := re.fullmatch(r"<class 'torch\.nn\.modules\.activation\.(\w+)'>", str(named))) else named
    act = ACTIVATIONS.get(cls)
    if act is None or (act != "relu" and algo in ("SAC", "TD3")):
        have = "ReLU" if algo in ("SAC", "TD3") else "Tanh or ReLU"
        raise refuse(z.path, f"its activation_fn is {cls}, where the zoo's {algo} nets have {have}")
    return act


def space(z: SB3Zip, key: str) -> tuple[str, dict[str, Any]]:
    """A space's class name ("Box", "Discrete", ...) and its readable fields."""
    s = z.data.get(key)
    kind = re.search(r"spaces\.\w+\.(\w+)'>", str(s.get(":type:"))) if isinstance(s, dict) else None
    if kind is None:
        raise refuse(z.path, f"its data has no readable {key}")
    return kind.group(1), s


def numbers(z: SB3Zip, text: Any, what: str) -> list[float]:
    """The numbers of a NumPy array's printed form (``'[-2.  2.]'``), exact: NumPy prints a float32 with at most 8
    fractional digits, so a number printed with 8 may have been rounded, and is refused; so is a summary (``...``)."""
    tokens = str(text).replace("[", " ").replace("]", " ").split()
    parsed = []
    for token in tokens:
        m = re.fullmatch(r"-?(?:inf|nan|\d+\.?(\d*)(?:e[-+]?\d+)?)", token)
        if m is None or len(m.group(1) or "") >= 8:
            raise refuse(z.path, f"its {what} {text!r} is printed rounded or summarised, and the exact one is pickled")
        parsed.append(float(token))
    return parsed


def spaces(z: SB3Zip, algo: str) -> dict[str, Any]:
    """obs_dim, action_dim and (Box actions) the bounds, from the readable spaces: a flat Box of observations and a
    Discrete or flat Box of actions (Box only for SAC and TD3)."""
    obs_kind, obs = space(z, "observation_space")
    if obs_kind != "Box" or len(obs.get("_shape") or []) != 1:
        raise refuse(z.path, f"its observations are a {obs_kind} of shape {obs.get('_shape')}, not a flat Box")
    act_kind, act = space(z, "action_space")
    if act_kind == "Discrete" and algo in ("PPO", "A2C") and str(act.get("start", "0")) == "0":
        if not str(act.get("n")).isdigit():
            raise refuse(z.path, f"its Discrete action space has n={act.get('n')!r}")
        return {"obs_dim": obs["_shape"][0], "action_dim": int(act["n"]), "continuous": False}
    if act_kind != "Box" or len(act.get("_shape") or []) != 1:
        kinds = "a flat Box" if algo in ("SAC", "TD3") else "a Discrete starting at 0 or a flat Box"
        size = f"n={act.get('n')} start={act.get('start', '0')}" if act_kind == "Discrete" else act.get("_shape")
        raise refuse(z.path, f"its actions are a {act_kind} {size}, not {kinds}")
    low = numbers(z, act.get("low"), "action_space.low")
    high = numbers(z, act.get("high"), "action_space.high")
    return {"obs_dim": obs["_shape"][0], "action_dim": act["_shape"][0], "continuous": True, "low": low, "high": high}


# -- the nets: sizes from policy.pth's shapes, SB3's names mapped onto the zoo module's ----------------------------


def _layers(z: SB3Zip, prefix: str) -> list[tuple[int, int]]:
    """(out, in) features of each Linear of the Sequential at ``prefix`` in policy.pth, in order."""
    at = sorted(int(m.group(1)) for k in z.policy if (m := re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.weight", k)))
    return [tuple(z.policy[f"{prefix}.{i}.weight"].shape) for i in at]


def _shape(z: SB3Zip, key: str) -> tuple[int, ...]:
    if key not in z.policy:
        raise refuse(z.path, f"its policy.pth has no {key!r}")
    return tuple(z.policy[key].shape)


def _widths(layers: list[tuple[int, int]]) -> list[int]:
    return [out for out, _ in layers]


def net_sizes(z: SB3Zip, algo: str) -> dict[str, Any]:
    """hidden_sizes, obs_dim, action_dim (and SAC's and TD3's critics) as policy.pth's shapes say; actor and critic
    of different widths refused, as each zoo net takes one ``hidden_sizes`` for both."""
    if algo in ("PPO", "A2C"):
        actor, critic = _layers(z, "mlp_extractor.policy_net"), _layers(z, "mlp_extractor.value_net")
        head = _shape(z, "action_net.weight")
        sizes = {"hidden_sizes": _widths(actor), "obs_dim": actor[0][1] if actor else head[1], "action_dim": head[0]}
        names = ("policy", "value")
    else:
        if algo == "SAC":
            actor, head = _layers(z, "actor.latent_pi"), _shape(z, "actor.mu.weight")
            if not actor:
                raise refuse(z.path, "its SAC actor has no hidden layer (net_arch=[]), which the zoo's SAC actor needs")
        else:  # TD3's actor is one Sequential, its head the last Linear
            *actor, head = _layers(z, "actor.mu") or [_shape(z, "actor.mu.0.weight")]
        critic, k = _layers(z, "critic.qf0")[:-1], len({m[0] for m in map(_critic_of, z.policy) if m})
        obs_dim = actor[0][1] if actor else head[1]
        sizes = {"hidden_sizes": _widths(actor), "obs_dim": obs_dim, "action_dim": head[0], "num_critics": k}
        names = ("actor", "critic")
    if _widths(actor) != _widths(critic):
        raise refuse(
            z.path,
            f"its {names[0]} net's hidden widths {_widths(actor)} differ from its {names[1]} net's "
            f"{_widths(critic)}, where the zoo's nets take one hidden_sizes for both",
        )
    return sizes


def _critic_of(key: str) -> tuple[str, ...] | None:
    m = re.match(r"critic\.qf(\d+)\.", key)
    return m.groups() if m else None


def renames(algo: str, hidden_layers: int) -> list[tuple[str, str]]:
    """SB3's names -> the zoo module's (regular expressions, anchored), per the table in this file's header."""
    head = 2 * hidden_layers  # a Linear and an activation per hidden layer, then the head
    critics = [
        (r"critic\.qf(\d+)\.(\d+)\.", r"net.critic.qs.\1.\2."),
        (r"critic_target\.qf(\d+)\.", r"critic_target.qs.\1."),
    ]
    if algo in ("PPO", "A2C"):
        return [
            (r"mlp_extractor\.policy_net\.", "net.actor."),
            (r"mlp_extractor\.value_net\.", "net.critic."),
            (r"action_net\.", f"net.actor.{head}."),
            (r"value_net\.", f"net.critic.{head}."),
            (r"log_std$", "net.actor_logstd"),
        ]
    if algo == "SAC":
        return [(r"actor\.latent_pi\.", "net.actor.trunk."), *critics]
    return [(r"actor\.mu\.", "net.actor.mlp."), (r"actor_target\.mu\.", "actor_target.mlp."), *critics]


def module_state(z: SB3Zip, algo: str, hidden_layers: int) -> dict[str, tuple[str, Tensor]]:
    """The zoo module's name -> (SB3's name, tensor) for every tensor of policy.pth and pytorch_variables.pth; a name
    no rule maps stays SB3's, so that the exactness check names it."""
    policy = dict(z.policy)
    state: dict[str, tuple[str, Tensor]] = {}
    if algo == "SAC" and {"actor.mu.weight", "actor.log_std.weight"} <= policy.keys():
        for p in ("weight", "bias"):  # the zoo's actor emits mean and log-std from one Linear, means first
            pair = [policy.pop(f"actor.{head}.{p}", None) for head in ("mu", "log_std")]
            if all(t is not None for t in pair):
                state[f"net.actor.head.{p}"] = (f"actor.mu.{p} + actor.log_std.{p}", torch.cat(pair))
    for name, tensor in policy.items():
        zoo_name = next((re.sub(f"^{a}", b, name) for a, b in renames(algo, hidden_layers) if re.match(a, name)), name)
        state[zoo_name] = (name, tensor.reshape(1, -1) if zoo_name == "net.actor_logstd" else tensor)
    for name, tensor in z.variables.items():  # SAC's temperature: learned (log_ent_coef) or fixed (ent_coef_tensor)
        log_alpha = {"log_ent_coef": tensor, "ent_coef_tensor": tensor.log()}.get(name)
        state["log_alpha" if log_alpha is not None else name] = (name, tensor if log_alpha is None else log_alpha)
    if "log_alpha" in state:
        state["log_alpha"] = (state["log_alpha"][0], state["log_alpha"][1].reshape(()))
    return state


def load_exact(module: LightningModule, state: dict[str, tuple[str, Tensor]], path: str) -> None:
    """Set every parameter of ``module`` (nets, target copies, log alpha) from ``state``, which must hold those and
    nothing else, at their shapes; else one line naming what is left over, unset or misshapen."""
    own = dict(module.named_parameters())
    unused = sorted(state[k][0] for k in state.keys() - own.keys())
    unset = sorted(own.keys() - state.keys())
    shapes = [
        f"{state[k][0]} {tuple(state[k][1].shape)} for {k} {tuple(own[k].shape)}"
        for k in sorted(state.keys() & own.keys())
        if state[k][1].shape != own[k].shape
    ]
    parts = [
        f"{what}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
        for what, names in (("tensors it has no place for", unused), ("parameters unset", unset), ("shapes", shapes))
        if names
    ]
    if parts:
        raise refuse(path, f"not an exact {type(module).__name__} ({'; '.join(parts)})")
    with torch.no_grad():
        for k, (_, tensor) in state.items():
            own[k].copy_(tensor)


# -- the net and the module ---------------------------------------------------------------------------------------

NETS = {"PPO": ActorCritic, "A2C": ActorCritic, "SAC": SoftActorCritic, "TD3": DeterministicActorCritic}


def net_config(path: str | Path) -> dict[str, Any]:
    """The agent's net the SB3 zip at ``path`` states, as ``{class_path, init_args}`` (what ``cli.py`` builds it from
    for ``init_weights: <zip>``): sizes from policy.pth's shapes, checked against the readable spaces, the activation,
    a Box's bounds; a zip that cannot be imported exactly is refused in one line (``InputError``) naming why."""
    z = read_zip(path)
    return net_config_of(z, algorithm(z))


def net_config_of(z: SB3Zip, algo: str) -> dict[str, Any]:
    """``net_config`` of a zip already read, whose algorithm is ``algo``."""
    kwargs = policy_kwargs(z)
    sizes, space_sizes = net_sizes(z, algo), spaces(z, algo)
    for key in ("obs_dim", "action_dim"):
        if sizes[key] != space_sizes[key]:
            raise refuse(z.path, f"its policy.pth has {key}={sizes[key]} where its spaces say {space_sizes[key]}")
    net_cls = NETS[algo]
    args = {k: v for k, v in sizes.items() if k != "num_critics" or algo in ("SAC", "TD3")}
    if algo in ("PPO", "A2C"):
        args |= {"continuous": space_sizes["continuous"], "activation": activation(z, algo, kwargs)}
    else:
        activation(z, algo, kwargs)  # refuses any but ReLU
        args |= {"action_low": space_sizes["low"], "action_high": space_sizes["high"]}
    return {"class_path": f"zoo.rl.{net_cls.__name__}", "init_args": args}


def load_init_weights(module: LightningModule, path: str | Path, env: tuple[Any, Any, str] | None = None) -> None:
    """``init_weights`` of an agent module: every tensor of the SB3 zip at ``path`` into ``module``, whose nets must be
    the zip's (``net_config``) and whose algorithm the zip's; with ``env`` (observation space, action space, id), the
    env must have the zip's spaces. Else one line (``InputError``) naming what differs."""
    z = read_zip(path)
    algo = algorithm(z)
    if f"{algo}Module" not in {cls.__name__ for cls in type(module).__mro__}:  # the agent files import this one's
        theirs = f"zoo.rl.{algo}Module"
        raise refuse(z.path, f"it holds a {algo} agent: continue it with {theirs}, not {type(module).__name__}")
    if env is not None:
        check_spaces(z, algo, *env)
    load_exact(module, module_state(z, algo, len(net_sizes(z, algo)["hidden_sizes"])), z.path)


def check_spaces(z: SB3Zip, algo: str, obs_space: gym.Space, action_space: gym.Space, env_id: str) -> None:
    """The env's spaces are the zip's (flat sizes, the kind of actions, a Discrete's first action, a Box's bounds as
    float32), or one line naming both."""
    theirs = spaces(z, algo)
    ours: dict[str, Any] = {"obs_dim": int(np.prod(obs_space.shape or ()))}
    if isinstance(action_space, gym.spaces.Discrete):
        ours |= {"action_dim": int(action_space.n), "continuous": False}
        if int(action_space.start):  # the zip's actions start at 0 (``spaces``); the zoo's would start here
            ours["start"] = int(action_space.start)
    elif isinstance(action_space, gym.spaces.Box):
        ours |= {"action_dim": int(np.prod(action_space.shape)), "continuous": True}
        ours |= {"low": action_space.low.tolist(), "high": action_space.high.tolist()}
    if not isinstance(obs_space, gym.spaces.Box) or _float32(ours) != _float32(theirs):
        raise InputError(
            f"{z.path} is an agent for {theirs}, and {env_id} observes {obs_space} and acts in {action_space}: fit "
            "it on an env of its spaces (the one it was trained on)"
        )


def _float32(sizes: dict[str, Any]) -> dict[str, Any]:
    """Bounds as the float32 a Box holds (a zip prints 0.4 for float32's 0.4000000059604645)."""
    return {k: np.float32(v).tolist() if k in ("low", "high") else v for k, v in sizes.items()}
