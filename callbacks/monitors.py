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

from zoo.compat import grad_scale
from zoo.errors import InputError
from zoo.train.gradnorm import grad_norm_keys, grad_norms_per_tensor, total_norm
from zoo.train.logging import lightning_writes


class NonFiniteLossError(RuntimeError):
    """The training loss was NaN or inf; raised before backward, so the weights never saw it."""


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
            return  # its own training_step logs these, from zoo.train.gradnorm, between backward and step
        step = trainer.global_step + 1  # this step, 1-based, as Lightning's logger connector counts it
        log_total = step % self.log_every_n_steps == 0 and lightning_writes(trainer, step)
        log_layers = (
            self.per_layer_every_n_steps > 0
            and step % self.per_layer_every_n_steps == 0
            and trainer.log_every_n_steps > 0
            and bool(trainer.loggers)
        )
        if not (log_total or log_layers):
            return
        named = [(n, p.grad) for n, p in self._params if p.grad is not None]
        if not named:
            return
        norms = grad_norms_per_tensor([g for _, g in named], self.norm_type)  # (P,)
        if log_total:
            for key, value in zip(grad_norm_keys(), total_norm(norms, self.norm_type)):
                pl_module.log(key, value, on_step=True, on_epoch=False)
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
        self._prev_scale = grad_scale(scaler) if scaler is not None else None

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
        scale = grad_scale(scaler)
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


class TrainsSomething(Callback):
    """Fails a fit that would train on no batch (a dataset smaller than one batch when the last partial batch is
    dropped, an empty split): Lightning would print "No training batches" as info and exit 0, having trained
    nothing, and a script going on to register or deploy the model could not tell."""

    def on_fit_start(self, trainer, pl_module) -> None:
        # The zoo's modules size their schedules from estimated_stepping_batches, which builds the training loader
        # by now; Lightning's own count is inf until then, and 0 after it skipped a fit with no batches.
        self.on_fit_end(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.num_training_batches == 0:
            raise InputError(
                "fit has no training batches: the training split is empty or smaller than one batch (some DataModules "
                "drop the last partial batch). Give more data, or a smaller --data.init_args.batch_size"
            )


class ResumesItsOptimizer(Callback):
    """Fails a resumed fit whose optimizer groups its parameters otherwise than the checkpoint's (Muon turned on or
    off, another optimizer) with one line that names the fix, before torch's ``load_state_dict`` raises "loaded state
    dict has a different number of parameter groups" from deep inside Lightning. The checkpoint's own settings do
    not build the module: this run's config and command line do (``zoo.io.checkpoint.reconcile``)."""

    def __init__(self) -> None:
        self.saved: list[list[int]] | None = None
        self.path: str | None = None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("optimizer_states")
        if trainer.state.fn != "fit" or not isinstance(states, list):
            return
        try:  # torch's layout: each group lists its parameters' indices
            self.saved = [[len(g["params"]) for g in s["param_groups"]] for s in states]
        except (KeyError, TypeError):  # another layout (a sharded checkpoint's): the strategy checks its own
            return
        self.path = str(trainer.ckpt_path)
        if trainer.optimizers:  # strategies that restore after setup have built the optimizers by now
            self._check(trainer)

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.saved is not None:
            self._check(trainer)

    def _check(self, trainer) -> None:
        given = [[len(g["params"]) for g in opt.param_groups] for opt in trainer.optimizers]
        saved, self.saved = self.saved, None
        if given != saved:
            raise InputError(
                f"--ckpt_path {self.path}: its optimizer state groups the parameters as {saved}, this run's "
                f"optimizer as {given}: this run's optimizer settings are not the ones it was trained with (Muon on "
                "or off: model.init_args.optimizer.muon). Resume with those settings"
            )
