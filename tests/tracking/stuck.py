"""A callback for ``python cli.py fit`` in a subprocess (tests/tracking/test_mlflow.py): after a step the fit loops
where no batch ends, so Lightning's SIGTERM handler only notes the signal."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback


class StuckAfterAStep(Callback):
    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= 1:
            Path("stuck").touch()
            while True:
                pass
