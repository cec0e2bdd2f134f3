"""Training-health monitors: gradient norms and numeric precision.

Both run on every step of every run, so the hot path is a handful of tensor ops and no host sync:
values are handed to `pl_module.log` as tensors and Lightning converts them only when it writes logs.

Notation: P = number of parameter tensors that have a gradient.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch import Callback
from lightning.pytorch.plugins.precision import FSDPPrecision, MixedPrecision
from torch import Tensor
from torch.distributed.tensor import DTensor, Partial, Replicate

from zoo.layers.logging import lightning_writes


class NonFiniteLossError(RuntimeError):
    """The training loss was NaN or inf; raised before backward, so the weights never saw it."""


def grad_norms_per_tensor(grads: list[Tensor], norm_type: float = 2.0) -> Tensor:
    """(P,) float32 p-norm of each gradient; for a DTensor, the norm of the full tensor across ranks.

    Accumulating in float32 keeps fp16 gradients (precision="16-true") from overflowing the norm.
    """
    if not any(isinstance(g, DTensor) for g in grads):
        return torch.stack(torch._foreach_norm(grads, norm_type, dtype=torch.float32))
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
    local = torch.stack(torch._foreach_norm([g.to_local() for g in grads], norm_type, dtype=torch.float32))
    inf = math.isinf(norm_type)
    partial = [Partial("max" if inf else "sum") if p.is_shard() else Replicate() for p in placements]
    full = DTensor.from_local(local if inf else local.pow(norm_type), mesh, partial, run_check=False).full_tensor()
    return full if inf else full.pow(1.0 / norm_type)


class GradNormMonitor(Callback):
    """Log the global gradient norm (after AMP unscaling, before clipping) and how many grads are non-finite.

    `grad/norm` and `grad/nonfinite` go through `pl_module.log` on the steps Lightning writes (every
    `Trainer(log_every_n_steps)`) that are multiples of `log_every_n_steps`; at Lightning's writes in between,
    a logger shows their last value again. The per-layer norms go straight to the loggers on their own period.
    """

    def __init__(self, per_layer_every_n_steps: int = 0, norm_type: float = 2.0, log_every_n_steps: int = 1) -> None:
        """
        Args:
            per_layer_every_n_steps: also write `grad/norm/<param name>` every this many optimizer steps; 0 = never.
            norm_type: the p of the p-norm; `float("inf")` for the max-norm.
            log_every_n_steps: log `grad/norm` and `grad/nonfinite` every this many optimizer steps.
        """
        if per_layer_every_n_steps < 0 or log_every_n_steps < 1 or not norm_type > 0:
            raise ValueError(
                f"Need per_layer_every_n_steps >= 0, log_every_n_steps >= 1 and norm_type > 0; got "
                f"{per_layer_every_n_steps}, {log_every_n_steps}, {norm_type}"
            )
        self.per_layer_every_n_steps = per_layer_every_n_steps
        self.norm_type = float(norm_type)
        self.log_every_n_steps = log_every_n_steps
        self._params: list[tuple[str, torch.nn.Parameter]] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After strategy setup, so these are the final (for FSDP2, DTensor) parameters. Frozen ones stay in
        # the list (they have no grad): a fine-tuning schedule may unfreeze them later.
        self._params = list(pl_module.named_parameters())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Lightning calls this hook from `Precision._after_closure`, which runs after the closure (backward)
        # and before `_clip_gradients`; `MixedPrecision.optimizer_step` calls `scaler.unscale_(optimizer)`
        # before `_after_closure` (lightning/pytorch/plugins/precision/{precision,amp}.py). So these are the
        # true, unscaled, unclipped gradients. Under 16-mixed an occasional inf is normal: GradScaler then
        # skips the step (see PrecisionMonitor's precision/skipped_steps).
        if not pl_module.automatic_optimization:
            return
        step = trainer.global_step + 1  # this step, 1-based, as Lightning's logger connector counts it
        log_total = step % self.log_every_n_steps == 0 and lightning_writes(trainer, step)
        log_layers = (
            self.per_layer_every_n_steps > 0 and step % self.per_layer_every_n_steps == 0
            and trainer.log_every_n_steps > 0 and bool(trainer.loggers)
        )
        if not (log_total or log_layers):
            return
        named = [(n, p.grad) for n, p in self._params if p.grad is not None]
        if not named:
            return
        norms = grad_norms_per_tensor([g for _, g in named], self.norm_type)  # (P,)
        if log_total:
            # A tensor holding inf/nan has a non-finite norm, so the count needs no extra pass.
            total, nonfinite = torch.linalg.vector_norm(norms, self.norm_type), (~torch.isfinite(norms)).sum()
            pl_module.log("grad/norm", total, on_step=True, on_epoch=False)
            pl_module.log("grad/nonfinite", nonfinite.float(), on_step=True, on_epoch=False)
        if log_layers:
            # P keys through `pl_module.log` would cost P * ~0.4 ms; one host transfer and one write per logger
            # instead, at the step number Lightning gives this optimizer step (as LearningRateMonitor does).
            # Lightning's `utilities.grad_norm` would recompute every norm in a Python loop (partial DTensors
            # under FSDP2) under `grad_2.0_norm/` keys; the norms are already here.
            per_layer = {f"grad/norm/{n}": v for (n, _), v in zip(named, norms.tolist())}
            for logger in trainer.loggers:
                logger.log_metrics(per_layer, step=trainer.global_step)


def _autocast_dtype(plugin: Any) -> torch.dtype | None:
    if isinstance(plugin, MixedPrecision):
        return plugin.autocast_context_manager().fast_dtype  # not entered; just read the dtype it would use
    if isinstance(plugin, FSDPPrecision) and plugin.precision.endswith("-mixed"):
        return torch.bfloat16 if plugin.precision.startswith("bf16") else torch.float16
    return None  # "32-true", "64-true", "16-true", "bf16-true", ...: no autocast, params already in that dtype


def _param_dtypes(module: torch.nn.Module) -> str:
    """Elements per parameter dtype, most first: "torch.float32:1234,torch.bfloat16:56"."""
    counts: dict[str, int] = {}
    for p in module.parameters():
        counts[str(p.dtype)] = counts.get(str(p.dtype), 0) + p.numel()  # DTensor.numel() is the global size
    return ",".join(f"{d}:{n}" for d, n in sorted(counts.items(), key=lambda kv: -kv[1]))


class PrecisionMonitor(Callback):
    """Record the numeric setup of a run, track fp16 loss scaling, and stop on a non-finite loss."""

    def __init__(self, log_every_n_steps: int = 1, stop_on_nonfinite_loss: bool = True) -> None:
        """
        Args:
            log_every_n_steps: log `precision/grad_scale` and `precision/skipped_steps` every this many steps
                (only when a GradScaler is in use, i.e. precision="16-mixed").
            stop_on_nonfinite_loss: raise NonFiniteLossError before backward when the loss is NaN or inf.
        """
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}")
        self.log_every_n_steps = log_every_n_steps
        self.stop_on_nonfinite_loss = stop_on_nonfinite_loss
        self._skipped: Tensor = torch.zeros((), dtype=torch.int64)
        self._prev_scale: Tensor | None = None
        self._batch_idx = 0

    @staticmethod
    def _scaler(trainer: pl.Trainer) -> torch.amp.GradScaler | None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    @staticmethod
    def _scale(scaler: torch.amp.GradScaler) -> Tensor:
        # `get_scale()` calls `.item()`; the async variant keeps the scale on the device (no host sync).
        # The scaler updates its tensor in place, hence the clone.
        scale = scaler._get_scale_async()
        return torch.tensor(scaler.get_scale()) if scale is None else scale.detach().clone()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        autocast = _autocast_dtype(trainer.precision_plugin)
        params = {
            "precision/precision": str(trainer.precision),
            "precision/autocast_dtype": str(autocast) if autocast is not None else "none",
            "precision/param_dtypes": _param_dtypes(pl_module),
        }
        for logger in trainer.loggers:
            logger.log_hyperparams(params)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After the checkpoint (and the scaler's state) is restored: the reference for the first step.
        scaler = self._scaler(trainer)
        self._prev_scale = self._scale(scaler) if scaler is not None else None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_idx = batch_idx

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        if not self.stop_on_nonfinite_loss:
            return
        # One host sync per step (a GPU stall until the forward is done); unavoidable to stop before the step.
        # `.item()` on the scalar is ~20x cheaper on a CPU than `torch.isfinite(loss).all()`.
        finite = math.isfinite(loss.item()) if loss.numel() == 1 else bool(torch.isfinite(loss.detach()).all())
        if trainer.world_size > 1:  # every rank stops together, so OnExceptionCheckpoint can save a sharded state
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            raise NonFiniteLossError(
                f"Non-finite loss ({loss.detach().flatten()[:4].tolist()} on rank {trainer.global_rank}) at global "
                f"step {trainer.global_step}, epoch {trainer.current_epoch}, batch {self._batch_idx}. Stopped before "
                "backward, so the weights were not updated with it. Try a lower learning rate or a longer warmup, "
                "gradient clipping (Trainer(gradient_clip_val=1.0)), precision='bf16-mixed' instead of '16-mixed', "
                "and check that batch for NaN/inf inputs."
            )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        scaler = self._scaler(trainer)
        if scaler is None:
            return
        # GradScaler multiplies the scale by backoff_factor (< 1) exactly when it skips a step for inf/nan
        # grads, and only ever grows it otherwise; checked every batch so no skip is missed between logs.
        # (Manual optimization stepping two optimizers in one batch would count two skips as one.)
        scale = self._scale(scaler)
        if self._prev_scale is not None:
            self._skipped = self._skipped.to(scale.device) + (scale < self._prev_scale.to(scale.device))
        self._prev_scale = scale
        step = trainer.global_step  # already counts this batch's step
        if step % self.log_every_n_steps == 0 and lightning_writes(trainer, step):
            pl_module.log("precision/grad_scale", scale.float(), on_step=True, on_epoch=False)
            pl_module.log("precision/skipped_steps", self._skipped.float(), on_step=True, on_epoch=False)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": int(self._skipped)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._skipped = torch.tensor(int(state_dict["skipped_steps"]), dtype=torch.int64)
