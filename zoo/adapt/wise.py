"""WiSE-FT: weight-space ensembles of the weights a fine-tune started from and those it ended with.

Wortsman et al. 2022, "Robust fine-tuning of zero-shot models": fine-tuning a zero-shot model on a target task loses
much of its accuracy elsewhere; the straight line between the two sets of weights,

    theta(alpha) = (1 - alpha) theta_0 + alpha theta_1        (theta_0 start, theta_1 fine-tuned, alpha in [0, 1])

keeps most of both, often beating either end on the target's distribution shifts. Nothing here knows a family: a
state dict in, a state dict out, and the rule that picks alpha from each point's scores.

LoRA (``zoo.adapt.lora``) trains factors A, B of an update s B A, one of which starts at zero (B for linear and conv
layers, A for embeddings). Interpolating both would give alpha^2 of the update on the zero side's path; interpolating
only the factor that started at zero, the other taken as trained, gives W + alpha s B_1 A_1: exactly the interpolation
of the merged weights, which is what serving sees. DoRA's magnitudes divide by a norm of the update, which no factor
scales linearly: refused.

Notation: alpha the interpolation weight; theta_0 / theta_1 the start / fine-tuned tensors of one name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import Tensor

from zoo.errors import InputError

# PEFT's factor names: lora_A / lora_B (linear, conv) and lora_embedding_A / lora_embedding_B (embeddings).
_FACTOR = re.compile(r"^(?P<layer>.*)\.lora_(?P<kind>embedding_)?(?P<side>[AB])\.(?P<adapter>[^.]+)(?P<rest>.*)$")


def interpolate(start: dict[str, Tensor], tuned: dict[str, Tensor], alpha: float) -> dict[str, Tensor]:
    """theta(alpha) for every name of ``start`` and ``tuned`` (the same names and shapes, or refused naming them).

    Floating tensors are interpolated (``torch.lerp``, exact at both ends: alpha = 0 returns theta_0 and alpha = 1
    theta_1 bit for bit); others (BatchNorm's batch count) are taken from ``tuned``; of a LoRA pair only the factor
    that started at zero moves. Each result is on ``tuned``'s device and in its dtype.
    """
    return dict(interpolated(start, tuned, alpha))


def interpolated(start: dict[str, Tensor], tuned: dict[str, Tensor], alpha: float) -> Iterator[tuple[str, Tensor]]:
    """``interpolate`` one tensor at a time (what copying into a module needs: no second copy of the weights)."""
    check_same(start, tuned)
    kept = lora_factors_kept(start)  # LoRA factors taken as trained
    for name, t1 in tuned.items():
        if not t1.is_floating_point() or name in kept:
            yield name, t1.clone()
        else:
            t0 = start[name].to(device=t1.device, dtype=t1.dtype)
            yield name, torch.lerp(t0, t1, alpha)  # t0 + alpha (t1 - t0); from t1's side when alpha >= 0.5


def check_same(start: dict[str, Tensor], tuned: dict[str, Tensor]) -> None:
    """Refuse two state dicts that do not pair up, naming what does not."""
    missing, extra = sorted(tuned.keys() - start.keys()), sorted(start.keys() - tuned.keys())
    if missing or extra:
        raise InputError(
            f"WiSE-FT pairs tensors by name: the fine-tuned weights have {missing[:5]} that the start lacks, and the "
            f"start has {extra[:5]} that they lack"
        )
    shapes = [f"{n} {tuple(start[n].shape)} -> {tuple(t.shape)}" for n, t in tuned.items() if t.shape != start[n].shape]
    if shapes:
        raise InputError(f"WiSE-FT interpolates tensors of one shape: {', '.join(shapes[:5])}")


def lora_factors_kept(start: dict[str, Tensor]) -> set[str]:
    """The LoRA factors taken as trained: in each pair, the one whose partner started at zero. Refuses DoRA, and a
    pair with neither factor at zero (an adapter loaded from elsewhere), whose interpolation no factor gives."""
    dora = [n for n in start if ".lora_magnitude_vector." in n]
    if dora:
        raise InputError(
            f"WiSE-FT cannot interpolate DoRA adapters ({dora[0]}): their magnitude divides by the update's norm; "
            f"fine-tune with adapt.lora.dora=false, or in full"
        )
    pairs: dict[tuple, dict[str, str]] = {}
    for name in start:
        m = _FACTOR.match(name)
        if m:
            pairs.setdefault((m["layer"], m["kind"], m["adapter"], m["rest"]), {})[m["side"]] = name
    kept = set()
    for pair in pairs.values():
        zero = [side for side, name in sorted(pair.items()) if not start[name].any()]
        if len(pair) != 2 or not zero:
            raise InputError(
                f"WiSE-FT interpolates a LoRA adapter through the factor that starts at zero, and "
                f"{sorted(pair.values())} has none: start the fine-tune from a fresh adapter"
            )
        kept.add(pair["B" if zero[0] == "A" else "A"])
    return kept


Choice = Literal["target", "mean"]


def choose_alpha(
    alphas: Sequence[float],
    target: Sequence[float],
    source: Sequence[float] | None = None,
    rule: Choice = "target",
    keep_source: float = 0.9,
    mode: Literal["max", "min"] = "max",
) -> int:
    """The index of the chosen point of a sweep over ``alphas`` (ascending, from 0), scored on the target task and
    optionally on the source task, both better when higher (``mode="max"``) or lower ("min").

    ``target``: the best target score among the points that keep ``keep_source`` of alpha = 0's source score (their
    source within that ratio of the start's; alpha = 0 always qualifies); without a source, the best target score.
    ``mean``: the best mean of the two scores (the paper's choice for in- and out-of-distribution together).
    Ties go to the smaller alpha, the one nearer the start.
    """
    sign = 1.0 if mode == "max" else -1.0
    if source is None:
        scores = [sign * t for t in target]
    elif rule == "mean":
        scores = [sign * (t + s) / 2 for t, s in zip(target, source)]
    else:
        s0 = source[alphas.index(0.0)]
        floor = keep_source * s0 if mode == "max" else s0 / keep_source
        kept = [sign * s >= sign * floor for s in source]
        scores = [sign * t if ok else -float("inf") for t, ok in zip(target, kept)]
    return max(range(len(alphas)), key=lambda i: (scores[i], -alphas[i]))
