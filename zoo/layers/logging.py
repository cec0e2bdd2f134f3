"""When Lightning writes step metrics, so per-step logging can skip the steps whose values it drops."""

from __future__ import annotations

import lightning.pytorch as pl


def lightning_writes(trainer: pl.Trainer, step: int | None = None) -> bool:
    """Whether Lightning's logger connector writes step metrics after optimizer step ``step`` (1-based).

    ``step`` defaults to the step being trained now (``global_step + 1``; call it from ``training_step``
    or a callback hook before the optimizer step). Values logged at other steps never reach a logger, and
    one ``LightningModule.log`` call costs 0.1-0.7 ms on a CPU (Lightning moves its result container to
    the device on every call), which is more than a whole step of a small model: log only when this is
    true. ``Trainer(log_every_n_steps=...)`` sets the cadence, as for everything else Lightning logs.
    """
    n = trainer.log_every_n_steps
    if step is None:
        step = trainer.global_step + 1
    return n > 0 and (step % n == 0 or trainer.should_stop)
