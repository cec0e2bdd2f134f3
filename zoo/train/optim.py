"""Shared optimisation: AdamW parameter groups, optionally Muon for the hidden matrices, and a warmup-cosine
schedule over both, injected as one ``AdamWCosine``; the RL agents' constant-rate Adam or RMSprop, ``AdamOrRMSprop``.

Every module's ``optimizer`` setting is an ``OptimizerSettings``: a frozen dataclass of plain fields (a config's
``model.init_args.optimizer``, a checkpoint's hyperparameters as a dict), rebuilt by ``of`` and turned into the torch
optimizer by ``build``.

Decay rule (GPT-2 / nanoGPT, open_clip): tensors of two or more dimensions decay;
biases, norm weights and embeddings do not. Embeddings are 2-D, so the net names them
through an optional ``no_weight_decay()`` method returning parameter-name prefixes.

Muon rule (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"): the weight matrices
of hidden layers go to Muon; embeddings, the layers that read the input and write the output, norms, biases
and scalars stay with AdamW. The net names its input and output layers through ``io_layers()`` (parameter-name
prefixes), as it names its embeddings through ``no_weight_decay()``. Conv filters (out, in, k, k) are
orthogonalised as (out, in*k*k) matrices, as Jordan's reference and airbench do; a stack of matrices such as
the MoE's expert weights (E, out, in) as E separate matrices, one per expert (each is its own linear map).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from zoo import compat
from zoo.errors import InputError

_NORMS = (  # the lazy and sync variants subclass these
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _no_decay_names(net: nn.Module) -> set[str]:
    names: set[str] = set()
    for mod_name, mod in net.named_modules():
        if isinstance(mod, (*_NORMS, nn.Embedding)):
            names.update(f"{mod_name}.{p}" if mod_name else p for p, _ in mod.named_parameters(recurse=False))
    prefixes = tuple(getattr(net, "no_weight_decay", lambda: ())())
    for name, p in net.named_parameters():
        if p.ndim < 2 or (prefixes and name.startswith(prefixes)):
            names.add(name)
    return names


def param_groups(net: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decay group and a no-decay group (each appears once)."""
    skip = _no_decay_names(net)
    decay, no_decay = [], []
    for name, p in net.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _io_prefixes(net: nn.Module) -> tuple[str, ...]:
    io_layers = getattr(net, "io_layers", None)
    if io_layers is None:
        raise InputError(
            f"optimizer.muon needs the net to name the layers that read its input and write its output, which Muon "
            f"must not take: {type(net).__name__} has no io_layers() method. Remove model.init_args.optimizer.muon "
            "to train it with AdamW alone"
        )
    return tuple(io_layers())


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def muon_param_groups(net: nn.Module, weight_decay: float) -> tuple[list[dict], list[dict]]:
    """(Muon groups, AdamW groups) of the trainable parameters, each parameter in exactly one group.

    Muon: the >=2-D weights of hidden layers, as ``{"params": matrices, "flatten": False}`` (2-D, or stacks of
    matrices over their leading dimensions) and ``{"params": conv filters, "flatten": True}``. AdamW: the rest,
    split as ``param_groups`` splits (the input and output layers' weights decay by ``weight_decay``;
    embeddings, norms, biases and what ``no_weight_decay()`` names do not). Empty groups are left out.
    """
    skip, io = _no_decay_names(net), _io_prefixes(net)
    filters = {
        f"{mod_name}.weight" if mod_name else "weight"
        for mod_name, mod in net.named_modules()
        if isinstance(mod, _CONVS) and isinstance(mod.weight, nn.Parameter)
    }
    matrices, convs, decay, no_decay = [], [], [], []
    for name, p in net.named_parameters():
        if not p.requires_grad:
            continue
        if name in skip:  # every tensor under 2-D is here too
            no_decay.append(p)
        elif _under(name, io):
            decay.append(p)
        else:
            (convs if name in filters else matrices).append(p)
    muon = [{"params": ps, "flatten": flat} for ps, flat in ((matrices, False), (convs, True)) if ps]
    adamw = [{"params": ps, "weight_decay": wd} for ps, wd in ((decay, weight_decay), (no_decay, 0.0)) if ps]
    return muon, adamw


def use_fused(params: list[torch.Tensor]) -> bool:
    """Whether AdamW's fused kernel serves these parameters: all on CUDA, or all plain tensors on the CPU.

    One kernel per step instead of a dozen foreach ops per tensor list: measured on a 2-core AMD EPYC,
    1 thread, a 4-layer 256-wide GPT (3.4M parameters), 2.3-2.5 ms per step fused against 10.6-10.9 ms
    foreach (4.4x) and 5.9-6.1 ms per-tensor. Sharded (DTensor) parameters on the CPU keep the default.
    """
    devices = {p.device.type for p in params}
    if devices == {"cuda"}:
        return True
    return devices == {"cpu"} and not any(isinstance(p, DTensor) for p in params)


# The settings a Muon group carries, as torch.optim.Muon names them.
_MUON_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn")


def newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """Jordan's quintic Newton-Schulz iteration from ``g`` = U S V^T towards U V^T (singular values end in about
    [0.7, 1.2]), in float32: torch's Muon runs it in bfloat16, which CPUs without bf16 matmul units emulate (20x
    slower, measured on a 2-core AMD EPYC). Otherwise the recipe of torch.optim.Muon's iteration."""
    a, b, c = coefficients
    x = g.float()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x  # (m, n), m <= n: the Gram matrix is the small side
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T  # (m, m)
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # a X + (b A + c A^2) X
    return x.T if tall else x


def _adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    out, inp = shape[:2]  # as torch.optim.Muon: original (Jordan), match_rms_adamw (Moonshot), spectral_unclamped
    ratio = {"match_rms_adamw": 0.2 * math.sqrt(max(out, inp)), "spectral_unclamped": math.sqrt(out / inp)}
    return lr * ratio.get(adjust_lr_fn, math.sqrt(max(1.0, out / inp)))


def muon_float32_(params, grads, bufs, **group) -> None:
    """torch.optim.Muon's update of 2-D tensors in place, with the Newton-Schulz iteration in float32."""
    lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
    for p, g, buf in zip(params, grads, bufs):
        buf.lerp_(g, 1 - momentum)
        update = g.lerp(buf, momentum) if group["nesterov"] else buf
        update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
        p.mul_(1 - lr * decay)
        p.add_(update.to(p.dtype), alpha=-_adjusted_lr(lr, group["adjust_lr_fn"], p.shape))


def _matrices(t: torch.Tensor, flatten: bool) -> list[torch.Tensor]:
    """2-D views of a contiguous ``t``: itself, its filters as (out, in*k*k), or each matrix of a stack."""
    if t.ndim == 2:
        return [t]
    if flatten:
        return [t.view(t.shape[0], -1)]
    return list(t.view(-1, *t.shape[-2:]).unbind())


class MuonAdamW(torch.optim.Optimizer):
    """Muon (``torch.optim.Muon``'s update) on the groups marked ``muon``, AdamW (``torch.optim.AdamW``) on the rest.

    One optimizer rather than two, as Jordan's ``MuonWithAuxAdam``: Lightning's automatic optimisation, gradient
    clipping, accumulation and precision plugins, the LR monitor and one ``WarmupCosine`` all see every group,
    and its ``state_dict`` is torch's usual one (resume is exact). The AdamW groups are stepped by a real
    ``torch.optim.AdamW`` (fused where ``use_fused`` says) sharing this optimizer's group dicts and state.
    Conv filters and stacked matrices, which ``torch.optim.Muon`` refuses, reach Muon's update as 2-D views.
    Sharded (FSDP2 DTensor) parameters are refused: Muon orthogonalises each whole matrix, which a shard is not.
    """

    def __init__(
        self,
        muon_groups: list[dict],
        adamw_groups: list[dict],
        *,
        muon: dict,
        lr: float,
        betas: tuple[float, float],
        eps: float = 1e-8,
        fused: bool | None = None,
    ) -> None:
        if any(isinstance(p, DTensor) for g in muon_groups for p in g["params"]):
            raise InputError(
                "optimizer.muon cannot step FSDP-sharded parameters: Muon orthogonalises each whole weight matrix, "
                "which a shard is not. Train with the ddp strategy, or remove model.init_args.optimizer.muon"
            )
        defaults = {k: v.default for k, v in inspect.signature(torch.optim.Muon).parameters.items() if k != "params"}
        groups = [{**defaults, **muon, **g, "muon": True} for g in muon_groups]
        self._adamw = (
            torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps, fused=fused) if adamw_groups else None
        )
        for g in self._adamw.param_groups if self._adamw else ():
            g["muon"] = False
        super().__init__([*groups, *(self._adamw.param_groups if self._adamw else ())], {})
        self._share_with_adamw()

    def _share_with_adamw(self) -> None:
        if self._adamw is not None:  # the same group dicts and state: what the scheduler sets, AdamW reads
            self._adamw.param_groups = [g for g in self.param_groups if not g["muon"]]
            self._adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # new group dicts and state: share them again
        self._share_with_adamw()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group)
        if self._adamw is not None:
            self._adamw.step()
        return loss

    def _muon_step(self, group: dict) -> None:
        params, grads, bufs, staged = [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            w, buf = p, state["momentum_buffer"]
            if not (w.is_contiguous() and buf.is_contiguous()):  # channels-last filters: step copies, write back
                w, buf = w.contiguous(), buf.contiguous()
                staged.append((p, w, state["momentum_buffer"], buf))
            params += _matrices(w, group["flatten"])
            grads += _matrices(p.grad.contiguous(), group["flatten"])
            bufs += _matrices(buf, group["flatten"])
        if params:
            dtype = group.get("ns_dtype", "auto")
            float32 = dtype == "float32" or (dtype == "auto" and params[0].device.type == "cpu")
            (muon_float32_ if float32 else compat.muon_)(params, grads, bufs, **{k: group[k] for k in _MUON_KEYS})
        for p, w, buf, staged_buf in staged:
            p.copy_(w)
            buf.copy_(staged_buf)


class WarmupCosine(LambdaLR):
    """Linear warmup from 0 to the base LR, then cosine decay to ``min_lr_ratio`` x base LR by ``total_steps``.

    Stepped per optimizer step (Loshchilov & Hutter 2017, SGDR; warmup as in Goyal et al. 2017). The horizon
    is saved with the scheduler's state. Resumed with another one (``max_epochs``/``max_steps`` extended, or
    the warmup, floor or base LR changed), the schedule is rebuilt deliberately for the new settings at the
    step reached, as if this run had been started with them, the learning rate jumps to that curve (a warm
    restart), and a warning names both: such a run cannot equal one started with the new settings, whose
    first part decayed over the longer horizon.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1
    ):
        self.warmup_steps = max(0, int(warmup_steps))
        self.total_steps = max(int(total_steps), self.warmup_steps + 1)
        self.min_lr_ratio = float(min_lr_ratio)
        super().__init__(optimizer, lambda step: self.factor(step))  # a function: LambdaLR saves no state for it

    def factor(self, step: int) -> float:
        """The learning rate at optimizer step ``step`` as a fraction of the base LR."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def _settings(self) -> dict:
        return {
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "min_lr_ratio": self.min_lr_ratio,
            "base_lrs": list(self.base_lrs),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        planned = self._settings()  # this run's, from its config and trainer
        super().load_state_dict(state_dict)  # the step reached, and the checkpoint's settings
        stored = {k: state_dict.get(k) for k in planned}
        changed = {k: (stored[k], v) for k, v in planned.items() if stored[k] is not None and stored[k] != v}
        self.__dict__.update(planned)
        if not changed:
            return
        groups = self.optimizer.param_groups
        before = groups[0]["lr"]  # restored with the optimizer: the old curve's value
        for group, base in zip(groups, self.base_lrs):
            group["lr"] = base * self.factor(self.last_epoch)
        what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
        rank_zero_warn(
            f"Resuming with another learning-rate schedule than the checkpoint's ({what}): the warmup-cosine is "
            f"rebuilt for this run's settings at step {self.last_epoch}, so the learning rate moves from {before:.4g} "
            f"to {groups[0]['lr']:.4g}. From here on it follows the new schedule, but the run will not equal one "
            "started with these settings. Resume with the checkpoint's max_epochs/max_steps to continue exactly.",
            category=UserWarning,
        )


def _with_schedule(opt: torch.optim.Optimizer, trainer, warmup_steps: int, min_lr_ratio: float) -> dict:
    total = trainer.estimated_stepping_batches if trainer is not None else warmup_steps + 1
    sched = WarmupCosine(opt, warmup_steps, int(total), min_lr_ratio)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "lr"}}


def adamw_warmup_cosine(
    net: nn.Module,
    trainer,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    warmup_steps: int,
    min_lr_ratio: float,
) -> dict:
    """AdamW on ``param_groups(net)`` with ``WarmupCosine`` over the trainer's total optimizer steps.

    Returns the ``configure_optimizers`` dict, with the scheduler stepped every optimizer step.
    """
    return _with_schedule(adamw_or_muon(net, lr, betas, 1e-8, weight_decay, None), trainer, warmup_steps, min_lr_ratio)


def _check(settings, rules, key: str) -> None:
    # Checked when the config is read, not at the first step (torch's "Invalid learning rate" traceback).
    bad = [(name, rule) for name, ok, rule in rules if not ok]
    if bad:
        name, rule = bad[0]
        raise InputError(f"optimizer {name}={getattr(settings, name)} must be {rule}: set {key}.{name}")


@dataclass(frozen=True)
class OptimizerSettings:
    """What every module's ``optimizer`` setting is: a frozen dataclass (a dataclass base too, so jsonargparse and
    ``zoo.io.build`` take its fields, not a class path) whose ``build(params)`` makes the torch
    optimizer (``params``: a net, whose parameters it groups by the decay and Muon rules above, or the tensors of
    one group), and ``of`` rebuilds it from the dict of fields a checkpoint's hyperparameters carry."""

    @classmethod
    def of(cls, value):
        """From itself or from its fields as a dict (how checkpoints' hyperparameters carry it)."""
        return value if isinstance(value, cls) else cls(**value)


@dataclass(frozen=True)
class MuonSettings:
    """Muon (Jordan et al. 2024) for the hidden weight matrices: momentum, then Newton-Schulz orthogonalisation.

    Defaults are Jordan's reference and nanochat's (lr 0.02, momentum 0.95, Nesterov, 5 Newton-Schulz steps, no
    weight decay, the "original" shape scaling max(1, out/in)**0.5). ``adjust_lr_fn="match_rms_adamw"`` scales
    each update to AdamW's RMS instead (Liu et al. 2025, "Muon is Scalable for LLM Training", Moonshot AI), so that
    AdamW's learning rate and weight decay carry over: then set ``lr`` and ``weight_decay`` to AdamW's.

    Args:
        lr: peak learning rate of the Muon matrices, reached after the shared warmup.
        momentum: momentum of the gradient average.
        nesterov: apply Nesterov momentum.
        weight_decay: decoupled weight decay of the Muon matrices (torch's Muon: w -= lr * weight_decay * w).
        ns_steps: Newton-Schulz iterations.
        adjust_lr_fn: the update's scaling by the matrix shape, as ``torch.optim.Muon`` names it.
        ns_dtype: the Newton-Schulz iteration's dtype: bfloat16 is torch's Muon (and Jordan's); float32 runs 20x
            faster on CPUs without bf16 matmul units; auto: float32 on a CPU, bfloat16 elsewhere.
    """

    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    weight_decay: float = 0.0
    ns_steps: int = 5
    adjust_lr_fn: Literal["original", "match_rms_adamw", "spectral_unclamped"] = "original"
    ns_dtype: Literal["auto", "bfloat16", "float32"] = "auto"

    def __post_init__(self) -> None:
        rules = (
            ("lr", self.lr > 0, "above 0"),
            ("momentum", 0 <= self.momentum < 1, "in [0, 1)"),
            ("weight_decay", self.weight_decay >= 0, "0 or more"),
            ("ns_steps", 1 <= self.ns_steps < 100, "in [1, 99]"),
            ("ns_dtype", self.ns_dtype in ("auto", "bfloat16", "float32"), "auto, bfloat16 or float32"),
            (
                "adjust_lr_fn",
                self.adjust_lr_fn in ("original", "match_rms_adamw", "spectral_unclamped"),
                "original, match_rms_adamw or spectral_unclamped",
            ),
        )
        _check(self, rules, "model.init_args.optimizer.muon")


@dataclass(frozen=True)
class AdamWCosine(OptimizerSettings):
    """AdamW (Loshchilov & Hutter 2019) on ``param_groups``, linear warmup then cosine decay per optimizer step;
    with ``muon`` set, Muon for the hidden weight matrices and AdamW for the rest, under the same schedule.

    Every module's ``optimizer`` argument: ``model.init_args.optimizer.lr`` and so on in a config; a field left
    out keeps the module's default. ``optimizer: {muon: {}}`` turns Muon on with its defaults.

    Args:
        lr: peak learning rate, reached after warmup (with ``muon``: of the AdamW groups, i.e. embeddings,
            input and output layers, norms, biases).
        weight_decay: decoupled weight decay on >=2-D weights (not on norms, biases, embeddings, or what the
            net's ``no_weight_decay()`` names).
        betas: (beta1, beta2) of the moment averages.
        warmup_steps: optimizer steps of linear warmup before the cosine decay.
        min_lr_ratio: final learning rate as a fraction of ``lr`` at the end of the cosine; 1.0 keeps it constant.
        muon: Muon for the hidden weight matrices (``MuonSettings``); None: AdamW for every parameter.
    """

    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    min_lr_ratio: float = 1.0
    muon: MuonSettings | None = None

    def __post_init__(self) -> None:
        if isinstance(self.muon, dict):  # from a checkpoint's hyperparameters
            object.__setattr__(self, "muon", MuonSettings(**self.muon))
        rules = (
            ("lr", self.lr > 0, "above 0"),
            ("weight_decay", self.weight_decay >= 0, "0 or more"),
            ("betas", all(0 <= b < 1 for b in self.betas), "each in [0, 1)"),
            ("warmup_steps", self.warmup_steps >= 0, "0 or more"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "in [0, 1]"),
        )
        _check(self, rules, "model.init_args.optimizer")

    def configure(self, net: nn.Module, trainer) -> dict:
        """The ``configure_optimizers`` dict for ``net`` over the trainer's total optimizer steps."""
        return _with_schedule(self.build(net), trainer, self.warmup_steps, self.min_lr_ratio)

    def build(self, net: nn.Module) -> torch.optim.Optimizer:
        """AdamW on ``net``'s decay groups, or ``MuonAdamW`` on its Muon and AdamW groups with ``muon``."""
        return adamw_or_muon(net, self.lr, self.betas, 1e-8, self.weight_decay, self.muon)


def adamw_or_muon(
    net: nn.Module,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    muon: MuonSettings | None,
) -> torch.optim.Optimizer:
    """AdamW on ``param_groups(net)``, or Muon for the hidden matrices and AdamW for the rest (``muon_param_groups``),
    fused where ``use_fused`` says."""
    if muon is None:
        groups = param_groups(net, weight_decay)
        fused = use_fused([p for g in groups for p in g["params"]]) or None
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)
    muon_groups, adamw_groups = muon_param_groups(net, weight_decay)
    return MuonAdamW(
        muon_groups,
        adamw_groups,
        muon=dict(vars(muon)),
        lr=lr,
        betas=tuple(betas),
        eps=eps,
        fused=use_fused([p for g in adamw_groups for p in g["params"]]) or None,
    )


@dataclass(frozen=True)
class AdamOrRMSprop(OptimizerSettings):
    """Adam (Kingma & Ba 2015, with AdamW's decoupled weight decay) or RMSprop (Tieleman & Hinton 2012) at the rate
    ``lr``: the RL agents' ``optimizer`` settings. Their schedule is the agent's (``anneal_lr``: a linear decay to 0
    over the env-step budget, ``zoo.rl.common.linear_annealing``), as their steps are counted in env steps.

    Args:
        algorithm: "adam" or "rmsprop".
        lr: learning rate (at the start, when the agent anneals it); 0 trains nothing (a control run).
        eps: added to the denominator. torch's RMSprop adds it outside the square root, TensorFlow's (Baselines,
            the IMPALA paper) inside; SB3 and monobeast use torch's, as here.
        betas: Adam's (beta1, beta2), the decay rates of its moment averages.
        alpha: RMSprop's smoothing constant of its average of squared gradients.
        weight_decay: on >=2-D weights of a net (see ``param_groups``), on every tensor of a plain list; Adam's is
            decoupled (AdamW), RMSprop's an L2 term added to the gradient (torch's).
        muon: Muon (``MuonSettings``) for a net's hidden matrices, Adam for the rest; "adam" and a net only. None:
            no Muon.
    """

    algorithm: Literal["adam", "rmsprop"] = "adam"
    lr: float = 3e-4
    eps: float = 1e-8
    betas: tuple[float, float] = (0.9, 0.999)
    alpha: float = 0.99
    weight_decay: float = 0.0
    muon: MuonSettings | None = None

    def __post_init__(self) -> None:
        if isinstance(self.muon, dict):  # from a checkpoint's hyperparameters
            object.__setattr__(self, "muon", MuonSettings(**self.muon))
        rules = (
            ("algorithm", self.algorithm in ("adam", "rmsprop"), "adam or rmsprop"),
            ("lr", self.lr >= 0, "0 or more"),
            ("eps", self.eps > 0, "above 0"),
            ("betas", all(0 <= b < 1 for b in self.betas), "each in [0, 1)"),
            ("alpha", 0 <= self.alpha < 1, "in [0, 1)"),
            ("weight_decay", self.weight_decay >= 0, "0 or more"),
            ("muon", self.muon is None or self.algorithm == "adam", "null with rmsprop (Muon pairs with Adam)"),
        )
        _check(self, rules, "model.init_args.optimizer")

    def build(self, params: nn.Module | Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        """The optimizer of a net (its decay groups; Muon's and Adam's with ``muon``) or of a list of tensors (one
        group, as torch takes it, which no rule splits into weights and biases: no weight decay, no Muon)."""
        if isinstance(params, nn.Module):
            if self.algorithm == "adam":
                return adamw_or_muon(params, self.lr, self.betas, self.eps, self.weight_decay, self.muon)
            return self._rmsprop(param_groups(params, self.weight_decay))
        if self.weight_decay or self.muon is not None:
            raise InputError(
                "optimizer.weight_decay and optimizer.muon need a net, to tell its weights from its biases; this agent "
                "gives the optimizer a list of tensors: set them to 0 and null"
            )
        params = list(params)
        if self.algorithm == "rmsprop":
            return self._rmsprop(params)
        fused = use_fused(params) or None
        return torch.optim.AdamW(
            params, lr=self.lr, betas=tuple(self.betas), eps=self.eps, weight_decay=0.0, fused=fused
        )

    def _rmsprop(self, params: list) -> torch.optim.RMSprop:
        return torch.optim.RMSprop(params, lr=self.lr, alpha=self.alpha, eps=self.eps)
