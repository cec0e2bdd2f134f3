"""Gradient norms, defined once: what ``callbacks.GradNormMonitor`` logs for automatically optimised modules
and what manually optimised ones (the RL agents) log themselves, between ``manual_backward`` and ``step``.

The numbers: the p-norm of each gradient tensor in float32 (a DTensor's is its full tensor's, across ranks),
the global norm as the p-norm of those (what ``torch.nn.utils.clip_grad_norm_`` returns), and how many tensors
are not finite. Measured before clipping, since a clipped norm would only ever show the threshold.
The values stay tensors (no host sync); Lightning converts them when it writes logs.

Notation: P = number of parameter tensors that have a gradient.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Partial, Replicate

from zoo.compat import foreach_norm


def grad_norms_per_tensor(grads: list[Tensor], norm_type: float = 2.0) -> Tensor:
    """(P,) float32 p-norm of each gradient; for a DTensor, the norm of the full tensor across ranks.

    Accumulating in float32 keeps fp16 gradients (precision="16-true") from overflowing the norm.
    """
    if not any(isinstance(g, DTensor) for g in grads):
        return foreach_norm(grads, norm_type, dtype=torch.float32)
    groups: dict[Any, list[int]] = {}  # plain tensors under None, DTensors by (mesh, placements)
    for i, g in enumerate(grads):
        groups.setdefault((g.device_mesh, g.placements) if isinstance(g, DTensor) else None, []).append(i)
    norms: list[Tensor] = [torch.empty(0)] * len(grads)
    for key, idx in groups.items():
        group = [grads[i] for i in idx]
        group_norms = _full_norms(group, norm_type) if key is not None else grad_norms_per_tensor(group, norm_type)
        for i, n in zip(idx, group_norms.unbind()):
            norms[i] = n
    return torch.stack(norms)


def _full_norms(grads: list[DTensor], norm_type: float) -> Tensor:
    """(P,) norms of DTensors sharing one mesh and placements, in one collective (FSDP2, tensor parallel).

    The norms of the local shards combine exactly: sum of norm**p over the sharded mesh dims (max for
    p=inf). Done by hand because DTensor's `_foreach_norm` rule rejects the float32 `dtype` argument.
    """
    mesh, placements = grads[0].device_mesh, grads[0].placements
    if any(p.is_partial() for p in placements):  # unreduced grads: reduce them first
        placements = tuple(Replicate() if p.is_partial() else p for p in placements)
        grads = [g.redistribute(mesh, placements) for g in grads]
    local = foreach_norm([g.to_local() for g in grads], norm_type, dtype=torch.float32)
    inf = math.isinf(norm_type)
    partial = [Partial("max" if inf else "sum") if p.is_shard() else Replicate() for p in placements]
    full = DTensor.from_local(local if inf else local.pow(norm_type), mesh, partial, run_check=False).full_tensor()
    return full if inf else full.pow(1.0 / norm_type)


def total_norm(norms: Tensor, norm_type: float = 2.0) -> tuple[Tensor, Tensor]:
    """The global p-norm of the per-tensor norms (P,) and the number of non-finite tensors (a float scalar).

    A tensor holding inf or nan has a non-finite norm, so the count needs no second pass over the gradients.
    """
    return torch.linalg.vector_norm(norms, norm_type), (~torch.isfinite(norms)).sum().float()


def grad_norm_keys(name: str = "") -> tuple[str, str]:
    """The keys of a global norm and its non-finite count: ``grad/norm``, ``grad/nonfinite``, or for the part of a
    module called ``name`` (SAC's actor, critic, temperature) ``grad/norm/<name>``, ``grad/nonfinite/<name>``,
    beside GradNormMonitor's per-tensor ``grad/norm/<parameter name>``."""
    suffix = f"/{name}" if name else ""
    return f"grad/norm{suffix}", f"grad/nonfinite{suffix}"


def grad_norm(parameters: Iterable[nn.Parameter], norm_type: float = 2.0, name: str = "") -> dict[str, Tensor]:
    """The global norm and non-finite count of the parameters' gradients as they are now, under
    ``grad_norm_keys(name)``; empty when none has a gradient. Call it between backward and the optimizer step."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return {}
    norm_key, nonfinite_key = grad_norm_keys(name)
    total, nonfinite = total_norm(grad_norms_per_tensor(grads, norm_type), norm_type)
    return {norm_key: total, nonfinite_key: nonfinite}


def clip_grad_norm(
    parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0, name: str = ""
) -> dict[str, Tensor]:
    """``grad_norm`` before clipping, then the gradients scaled to a global norm of at most ``max_norm`` with that
    same norm: ``torch.nn.utils.clip_grad_norm_`` (whose return value is the logged norm), the norm computed once."""
    params = list(parameters)
    norms = grad_norm(params, norm_type, name)
    if norms:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norms[grad_norm_keys(name)[0]])
    return norms
