"""A TQDM progress bar that redraws on a clock rather than on every batch."""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import TQDMProgressBar


class ProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, redrawn at most every ``min_interval`` seconds (and on a loop's last batch).

    Lightning's bar redraws every ``refresh_rate`` batches, and each redraw collects the logged metrics and
    formats them: ~0.3-0.5 ms, as much as a whole training step of a small model on a CPU. A step count
    that suits a 3 ms step is far too coarse for a 3 s one; a time interval suits both.
    """

    def __init__(self, min_interval: float = 0.2, process_position: int = 0, leave: bool = False) -> None:
        """
        Args:
            min_interval: seconds between redraws; 0 redraws after every batch.
            process_position: passed to ``TQDMProgressBar`` (offset when several bars share a terminal).
            leave: keep each finished bar on screen.
        """
        if min_interval < 0:
            raise ValueError(f"min_interval must be >= 0 seconds, got {min_interval}")
        super().__init__(refresh_rate=1, process_position=process_position, leave=leave)
        self.min_interval = min_interval
        self._last_draw = float("-inf")

    def _should_update(self, current: int, total: int) -> bool:
        if not self.is_enabled:
            return False
        now = time.monotonic()
        if current == total or now - self._last_draw >= self.min_interval:
            self._last_draw = now
            return True
        return False
