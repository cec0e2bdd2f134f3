"""Writes what ``predict_step`` returns to a file, one row per example: CSV for tensors, JSONL for text; images
and videos among them (``callbacks.media``) as files in the same folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import json
import re

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from callbacks.media import split_media, write_images, write_video
from zoo.tracking import mlflow_loggers


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
        batches, images, videos = split_media(batches)
        for video in videos:
            self._write_video(trainer, video)
        if images:
            self._write_images(trainer, batches, torch.cat(images))
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

    def _media_dir(self, trainer: Trainer, name: str, given: str | None = None) -> Path:
        """``given``, else the folder ``name`` beside the predictions file."""
        return Path(given) if given else Path(self.path).parent / name

    def _write_video(self, trainer: Trainer, video: dict) -> None:
        path = write_video(video, self._media_dir(trainer, "videos", video.get("dir")))
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_artifact(lg.run_id, str(path), "videos")
        print(f"Wrote a video of {len(video['frames'])} frames to {path.resolve()}")

    def _write_images(self, trainer: Trainer, batches: list[dict], images: torch.Tensor) -> None:
        """A PNG per image, named by its row's index and label when it has them, and a grid; the rows get the paths."""
        rank = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        classes = list(getattr(trainer.datamodule, "class_names", None) or [])
        names, n = [], 0
        for b in batches:
            size = len(next(iter(b.values())))
            for i in range(size):
                index = int(b["index"][i]) if "index" in b else n + i
                k = int(b["label"][i]) if "label" in b else -1
                label = "" if k < 0 else "_" + re.sub(r"[^\w.-]+", "_", str(classes[k])) if k < len(classes) else f"_label{k}"
                names.append(f"{index:04d}{label}{rank}")
            n += size
        folder = self._media_dir(trainer, "images")
        paths, grid = write_images(images, names, folder, grid_name=f"grid{rank}")
        files = iter(str(p) for p in paths)
        for b in batches:
            b["image"] = [next(files) for _ in range(len(next(iter(b.values()))))]
        for lg in mlflow_loggers(trainer):
            lg.experiment.log_artifacts(lg.run_id, str(folder), "images")
        print(f"Wrote {len(paths)} images and their grid to {grid.resolve()}")

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
