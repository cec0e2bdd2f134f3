"""Writes what ``predict_step`` returns to a file, one row per example: CSV for tensors, JSONL for text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import json

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter


class WritePredictions(BasePredictionWriter):
    """Collects per-example tensors from ``predict_step`` dicts and writes them at epoch end.

    Under DDP each rank writes ``<stem>.rank<k>.csv``; on one process the file is ``path``. Dicts that
    carry lists (generated text) are written as JSON lines to ``path`` with the suffix ``.jsonl``.
    """

    def __init__(self, path: str = "predictions.csv") -> None:
        """
        Args:
            path: CSV file the predictions are written to (columns are the predict_step dict keys).
        """
        super().__init__(write_interval="epoch")
        self.path = path

    def write_on_epoch_end(self, trainer: Trainer, pl_module: LightningModule, predictions: Any, batch_indices: Any) -> None:
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        batches = [b for b in batches if isinstance(b, dict)]
        if not batches:
            return
        if any(not isinstance(v, torch.Tensor) for v in batches[0].values()):
            self._write_jsonl(trainer, batches)
            return
        columns = {k: torch.cat([b[k].reshape(len(b[k]), -1) for b in batches]).cpu() for k in batches[0]}
        path = self._rank_path(trainer, Path(self.path).suffix)
        header = [k if v.shape[1] == 1 else f"{k}_{i}" for k, v in columns.items() for i in range(v.shape[1])]
        table = torch.cat([v.double() if v.is_floating_point() else v.to(torch.float64) for v in columns.values()], 1)
        is_int = [not v.is_floating_point() for v in columns.values() for _ in range(v.shape[1])]
        fmt = ["%d" if i else "%.6g" for i in is_int]
        np.savetxt(path, table.numpy(), fmt=fmt, delimiter=",", header=",".join(header), comments="")
        print(f"Wrote {len(table)} predictions to {path.resolve()}")

    def _rank_path(self, trainer: Trainer, suffix: str) -> Path:
        path = Path(self.path).with_suffix(suffix)
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _write_jsonl(self, trainer: Trainer, batches: list[dict]) -> None:
        path = self._rank_path(trainer, ".jsonl")
        rows = [
            {k: (v[i].tolist() if isinstance(v, torch.Tensor) else v[i]) for k, v in b.items()}
            for b in batches for i in range(len(next(iter(b.values()))))
        ]
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"Wrote {len(rows)} predictions to {path.resolve()}")
