"""EMA of the weights that starts late without showing the initial weights meanwhile.

Lightning's ``EMAWeightAveraging(update_starting_at_step=s)`` copies the module when fit starts and first
averages at step s; until then validation, the logged samples and every checkpoint's ``state_dict`` are
that copy, the untrained initial weights. This average tracks the weights exactly (a copy per step) up to
step s, and from there on is the usual EMA, ema <- d ema + (1 - d) w (DiT: d = 0.9999 from step 0), so what
validation and checkpoints show is the trained net before the EMA starts and its average after.
Everything else (swapping the average in for validation, ``state_dict`` = average and
``current_model_state`` = weights in checkpoints, resume) is Lightning's ``WeightAveraging``.
"""

from __future__ import annotations

from functools import partial

import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch import Tensor


def ema_update(average: Tensor, current: Tensor, num_averaged: Tensor, decay: float, start_step: int) -> Tensor:
    """The average after an update: ``current`` up to the ``start_step``-th update (0-based), then the EMA."""
    weight = torch.where(num_averaged <= start_step, 1.0, 1.0 - decay).to(average.dtype)  # no host sync
    return average.lerp(current, weight)


class EMA(WeightAveraging):
    """Exponential moving average of the weights, updated after every optimizer step from ``start_step`` on."""

    def __init__(self, decay: float = 0.9999, start_step: int = 0) -> None:
        """
        Args:
            decay: d of ema <- d ema + (1 - d) w (0.9999 in DiT).
            start_step: 0-based optimizer step whose weights the average starts from (a copy); before it the
                average is the weights themselves.
        """
        super().__init__(use_buffers=True, avg_fn=partial(ema_update, decay=decay, start_step=start_step))
        self.decay, self.start_step = decay, start_step

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None  # every optimizer step: before start_step the update is a copy
