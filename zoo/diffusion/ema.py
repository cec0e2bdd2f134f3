"""EMA of the weights, kept sharded like the weights under FSDP2, that starts late without showing the initial
weights meanwhile.

The average is one tensor per trained parameter (``requires_grad``) and buffer of the module: under FSDP2 each
rank's local shard, so it costs what the weights cost on that rank and every update and swap is local (no
collective). From the
0-based optimizer step ``start_step`` on (DiT: 0, d = 0.9999):

    ema <- w                         at step start_step (a copy)
    ema <- d ema + (1 - d) w         after every later optimizer step

Before ``start_step`` there is no average and everything uses the weights. (Lightning's
``EMAWeightAveraging(update_starting_at_step=s)`` instead copies the module when fit starts, so until step s
validation, the logged samples and every checkpoint's ``state_dict`` were the untrained initial weights;
and its copy is a whole unsharded module, which is why it could not follow FSDP2.)

As Lightning's weight averaging does: the average is swapped in for validation (so ``val/loss`` and the
samples callbacks log the EMA's), a checkpoint's ``state_dict`` holds the average and ``current_model_state``
the training weights, resuming restores both, and the module holds the average when fit ends. A sharded
(FSDP2) checkpoint keeps the average sharded in its folder and gathers the training weights only while
saving, into the folder's ``meta.pt``; consolidating it (``python -m zoo.train.parallel``) yields both.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import WeightAveraging
from torch import Tensor

from zoo import compat


def _local(t: Tensor) -> Tensor:
    """The tensor a rank holds: an FSDP2 parameter's local shard (sharing its storage), or the tensor itself."""
    t = t.detach()
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t: Tensor) -> Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # a collective for a sharded tensor


class EMA(WeightAveraging):
    """Exponential moving average of the weights, updated after every optimizer step from ``start_step`` on.

    A ``WeightAveraging`` (so a module that adds its own EMA sees one is there) that keeps no ``AveragedModel``.
    """

    def __init__(self, decay: float = 0.9999, start_step: int = 0) -> None:
        """
        Args:
            decay: d of ema <- d ema + (1 - d) w (0.9999 in DiT).
            start_step: 0-based optimizer step whose weights the average starts from (a copy); before it there is
                no average and validation, samples and checkpoints use the weights.
        """
        super().__init__()
        self.decay, self.start_step = decay, start_step
        self._average: list[Tensor] | None = None  # local shards, in the order of _tensors(module)
        self._latest_update_step = 0
        self._num_updates = 0  # updates of the average, its first copy included (torch's AveragedModel.n_averaged)

    @staticmethod
    def _tensors(pl_module: LightningModule) -> list[Tensor]:
        from torch.distributed.fsdp import FSDPModule

        for m in pl_module.modules():  # FSDP2 leaves the root gathered after a forward without backward
            if isinstance(m, FSDPModule):
                m.reshard()
        # What no optimizer trains does not move (a latent model's frozen autoencoder): averaging it would only cost a
        # copy of it. Buffers (BatchNorm's statistics, the latents' scale) are averaged: they change without gradients.
        trained = (p for p in pl_module.parameters() if p.requires_grad)
        return [_local(t) for t in itertools.chain(trained, pl_module.buffers())]

    # -- averaging -------------------------------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._average = None  # made at the first update, from the (by then sharded) weights

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step_idx = trainer.global_step - 1  # 0-based index of the optimizer step just taken
        if trainer.global_step <= self._latest_update_step or not self.should_update(step_idx):
            return  # no optimizer step since the last update (gradient accumulation), or not started
        current = self._tensors(pl_module)
        with torch.no_grad():
            if self._average is None:
                self._average, self._num_updates = [t.clone() for t in current], 0
            else:
                floats = [(a, c) for a, c in zip(self._average, current) if a.is_floating_point()]
                compat.foreach_lerp_([a for a, _ in floats], [c for _, c in floats], 1.0 - self.decay)
                for a, c in zip(self._average, current):
                    if not a.is_floating_point():
                        a.copy_(c)  # integer buffers (BatchNorm's batch count): the latest value
        self._latest_update_step = trainer.global_step
        self._num_updates += 1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx >= self.start_step  # per optimizer step, never per epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pass  # WeightAveraging's per-epoch update: this average moves per optimizer step only

    def _swap(self, pl_module: LightningModule) -> None:
        if self._average is None:
            return
        with torch.no_grad():
            for a, c in zip(self._average, self._tensors(pl_module)):
                tmp = a.clone()
                a.copy_(c)
                c.copy_(tmp)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._swap(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._average is not None:  # fit ends holding the average: sample() and predict use it
            with torch.no_grad():
                for a, c in zip(self._average, self._tensors(pl_module)):
                    c.copy_(a)

    # -- checkpoints -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._average is None:
            return  # no average yet (or outside fit): the weights are the checkpoint
        sharded_folder = any(hasattr(v, "full_tensor") for v in checkpoint["state_dict"].values())
        current = checkpoint["state_dict"]
        if sharded_folder:  # meta.pt is rank 0's torch.save: it needs whole tensors (every rank gathers)
            current = {k: _full(v).cpu() for k, v in current.items()}
        self._swap(pl_module)
        try:  # the average in the strategy's own format (sharded, gathered or plain), copied before swapping back
            average = {k: v.clone() for k, v in trainer.strategy.lightning_module_state_dict().items()}
        finally:
            self._swap(pl_module)
        checkpoint["state_dict"], checkpoint["current_model_state"] = average, current
        # Where Lightning's EMAWeightAveraging keeps its count, so either callback resumes the other's checkpoints.
        checkpoint["averaging_state"] = {"n_averaged": torch.tensor(self._num_updates, dtype=torch.long)}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # By now the module holds the checkpoint's state_dict: the average. Resuming fit restores the training
        # weights over it; validate/test/predict keep the average.
        if trainer.state.fn != "fit" or "current_model_state" not in checkpoint:
            return
        self._average = [t.clone() for t in self._tensors(pl_module)]
        self._num_updates = int(checkpoint.get("averaging_state", {}).get("n_averaged", 0))
        current = checkpoint["current_model_state"]
        if any(hasattr(p, "device_mesh") for p in pl_module.parameters()):  # sharded: each rank takes its shard
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(pl_module, current, options=StateDictOptions(full_state_dict=True))
        else:
            pl_module.load_state_dict(current)
