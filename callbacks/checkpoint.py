"""ModelCheckpoint that keeps the last checkpoint and the best on the module's own metric, and a checkpoint on
exception that holds only what the failed fit trained.

Each family's metric and mode ("val/acc", "max") are in the application's table (``zoo.tracking.families``); the CLI's
default checkpoint callback cannot know the family before the module exists, so it reads them at setup.
Lightning 2.6 refreshes ``last.ckpt`` only when a best checkpoint is saved in the same step, so a
run whose metric stops improving would resume from stale weights: here ``last`` follows every save.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities import rank_zero_warn

from zoo.compat import refresh_last_checkpoint
from zoo.tracking.families import family_of


class MonitoredCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint(save_last=True)`` whose monitor defaults to the module's family's
    (``zoo.tracking.families``)."""

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str | None = "best-{step}",
        monitor: str | None = None,
        mode: Literal["min", "max"] | None = None,
        save_last: bool = True,
        save_top_k: int = 1,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
    ) -> None:
        """
        Args:
            dirpath: where checkpoints go; None puts them under the run's folder in default_root_dir.
            filename: best-checkpoint file name pattern.
            monitor: metric to rank checkpoints by; None takes the module's family's (``zoo.tracking.families``).
            mode: "min" or "max"; None takes the family's.
            save_last: also keep ``last.ckpt`` for resuming.
            save_top_k: how many best checkpoints to keep.
            every_n_train_steps: also checkpoint every N optimizer steps.
            every_n_epochs: checkpoint every N epochs (None: at every validation).
        """
        self._explicit_mode = mode
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            mode=mode or "min",
            save_last=save_last,
            save_top_k=save_top_k,
            every_n_train_steps=every_n_train_steps,
            every_n_epochs=every_n_epochs,
        )

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        family = family_of(pl_module)
        if stage == "fit" and self.monitor is None and not validates(trainer, pl_module):
            # No validation loop, so no family metric to rank by (Lightning warned at every save that it was
            # missing): the last checkpoint is the model, and no "best" copy of it is written.
            self.save_top_k = 0
        elif self.monitor is None and family.monitor:
            self.monitor = family.monitor
            self.mode = self._explicit_mode or family.monitor_mode
            # The worst score of the mode, as ModelCheckpoint's __init__ sets it for its own mode.
            self.kth_value = torch.tensor(torch.inf if self.mode == "min" else -torch.inf)
            self.best_model_score = None
        super().setup(trainer, pl_module, stage)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        refresh_last_checkpoint(self, trainer, at_train_epoch_end=True)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        refresh_last_checkpoint(self, trainer, at_train_epoch_end=False)


def validates(trainer: Trainer, pl_module: LightningModule) -> bool:
    """Whether this fit has a validation loop: batches allowed, a ``validation_step``, and a ``val_dataloader``."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    data = trainer.datamodule if trainer.datamodule is not None else pl_module
    return (
        trainer.limit_val_batches != 0
        and is_overridden("validation_step", pl_module)
        and is_overridden("val_dataloader", data)
    )


class CheckpointOnException(OnExceptionCheckpoint):
    """``OnExceptionCheckpoint`` that saves only once this fit has taken an optimizer step.

    Lightning's saves on any exception of any stage: a run that failed in data setup (a mistyped CSV path)
    wrote 605 MB of untrained ViT-B/32 weights, and each failed validate run a copy of the checkpoint it read.
    Before the first step, or resumed and failed before the next, the weights are those the run started from.
    A save that fails (a full disk) is a warning: the run's own exception is the one it ends with.
    """

    def __init__(self, dirpath: str, filename: str = "on_exception") -> None:
        """
        Args:
            dirpath: folder of the checkpoint (cli.py moves its default into the run's own folder).
            filename: file name without ``.ckpt``.
        """
        super().__init__(dirpath, filename)
        self.start_step: int | None = None  # global step when this fit's training began; None outside training

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.start_step = None  # a test after fit (cli.py --test_after_fit) trains nothing

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.start_step = trainer.global_step  # after a resume restored its step

    def on_exception(self, trainer: Trainer, *args, **kwargs) -> None:
        if self.start_step is None or trainer.global_step <= self.start_step:
            return
        try:
            super().on_exception(trainer, *args, **kwargs)
        except Exception as err:
            # Raising here would replace the run's own exception and skip what Lightning does after the callbacks
            # (the loggers' finalize: the MLflow run stayed RUNNING). A partial file is no checkpoint: removed.
            with contextlib.suppress(Exception):
                trainer.strategy.remove_checkpoint(self.ckpt_path)
            why = str(err).splitlines()[0] if str(err) else ""
            rank_zero_warn(
                f"The failed run's checkpoint was not written to {self.ckpt_path} ({type(err).__name__}: "
                f"{why}); its last checkpoint, if any, is the one to resume from."
            )
