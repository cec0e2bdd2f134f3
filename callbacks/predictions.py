"""Writes what ``predict_step`` returns to files in the run's folder, one row per example, and logs them to MLflow.

Every output of a run (predictions, sample grids, per-image PNGs, GIFs, text) goes under ``run_dir(trainer)``
(``<root>/<experiment id>/<run id>`` with the MLflow logger) and into the run's artifacts with ``log_file``;
nothing is written to the working directory or outside the run's folder (a folder setting is a name inside it,
``zoo.tracking.in_run_dir``), and nothing over an existing file (``callbacks.media.new_file``). The run's folder
is the application's (``zoo.tracking.runs``: DataModules name outputs inside it too); re-exported here for the
callbacks. Images and videos among the outputs (``callbacks.media``) become PNGs with a grid and GIF/MP4 files in the
same folder.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from callbacks.media import new_file, split_media, write_images, write_video
from zoo.io.files import check_output_name
from zoo.tracking import in_run_dir, log_file, run_dir
from zoo.tracking.families import family_of

__all__ = ["WritePredictions", "log_file", "output_path", "run_dir"]

ARTIFACT_DIR = "predictions"
PATH_KEY = "callbacks.WritePredictions path"


def output_path(trainer: Trainer, path: str | Path) -> Path:
    """``path`` inside this run's folder (one file per rank under DDP); refuses one that leaves it."""
    path = in_run_dir(trainer, path, PATH_KEY)
    if trainer.world_size > 1:
        path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
    return path


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


class WritePredictions(BasePredictionWriter):
    """Collects per-example values from ``predict_step`` dicts and writes them at epoch end.

    A family whose ``predictions`` is "csv" (``zoo.tracking.families``) gets a CSV of tensors and strings; otherwise
    tensors alone make a CSV and dicts carrying other lists (generated text) make JSON lines (``.jsonl``). Keys its
    row names in ``prediction_arrays`` (embeddings) go to ``<stem>.<key>.npy`` instead, one row per example.
    """

    def __init__(self, path: str = "predictions.csv") -> None:
        """
        Args:
            path: file the predictions are written to, a name inside the run's folder (columns are the
                predict_step dict keys).
        """
        super().__init__(write_interval="epoch")
        self.path = check_output_name(PATH_KEY, path)

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        batches = [b for b in batches if isinstance(b, dict)]
        if not batches:
            return
        batches, images, images_dir, videos = split_media(batches)
        for video in videos:
            self._write_video(trainer, video)
        if images:
            self._write_images(trainer, batches, torch.cat(images), images_dir)
        columns = {k: _concat([b[k] for b in batches]) for k in batches[0]}
        family = family_of(pl_module)
        written = [self._write_array(trainer, k, columns.pop(k)) for k in family.prediction_arrays if k in columns]
        fmt = family.predictions
        tensors_only = all(isinstance(v, torch.Tensor) for v in columns.values())
        if columns:
            written.append(
                self._write_csv(trainer, columns)
                if fmt == "csv" or (fmt is None and tensors_only)
                else self._write_jsonl(trainer, columns)
            )
        for path in written:
            log_file(trainer, path, ARTIFACT_DIR)
        print("\n".join(f"Wrote {path.resolve()}" for path in written))

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # What the module measured beyond its outputs (a GPT decoding speculatively: acceptance rate, tokens per
        # target forward), into the run's metrics.
        metrics = getattr(pl_module, "predict_metrics", None)
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics)

    def _media_dir(self, trainer: Trainer, name: str, given: str | None = None, key: str = "") -> Path:
        """The folder ``given`` (setting ``key``), else ``name`` beside the predictions file, in the run's folder."""
        if given:
            return in_run_dir(trainer, given, key)
        return in_run_dir(trainer, Path(self.path).parent / name, PATH_KEY)

    def _write_video(self, trainer: Trainer, video: dict) -> None:
        path = write_video(video, self._media_dir(trainer, "videos", video.get("dir"), "the video's folder"))
        log_file(trainer, path, "videos")
        print(f"Wrote a video of {len(video['frames'])} frames to {path.resolve()}")

    def _write_images(self, trainer: Trainer, batches: list[dict], images: torch.Tensor, given: str | None) -> None:
        """A PNG per image, named by its row's index and label when it has them, and a grid; the rows get the paths."""
        rank = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        classes = list(getattr(trainer.datamodule, "class_names", None) or [])
        names, n = [], 0
        for b in batches:
            size = len(next(iter(b.values())))
            for i in range(size):
                index = int(b["index"][i]) if "index" in b else n + i
                k = int(b["label"][i]) if "label" in b else -1
                label = (
                    ""
                    if k < 0
                    else "_" + re.sub(r"[^\w.-]+", "_", str(classes[k]))
                    if k < len(classes)
                    else f"_label{k}"
                )
                names.append(f"{index:04d}{label}{rank}")
            n += size
        folder = self._media_dir(trainer, "images", given, "the images' folder")
        paths, grid = write_images(images, names, folder, grid_name=f"grid{rank}")
        files = iter(str(p) for p in paths)
        for b in batches:
            b["image"] = [next(files) for _ in range(len(next(iter(b.values()))))]
        for path in [*paths, grid]:
            log_file(trainer, path, "images")
        print(f"Wrote {len(paths)} images and their grid to {grid.resolve()}")

    def _write_array(self, trainer: Trainer, key: str, values: torch.Tensor) -> Path:
        f, path = new_file(output_path(trainer, Path(self.path).with_suffix(f".{key}.npy")))
        with f:
            np.save(f, values.float().numpy())
        return path

    def _write_csv(self, trainer: Trainer, columns: dict[str, Any]) -> Path:
        header, cells = [], []
        for key, value in columns.items():
            if isinstance(value, torch.Tensor):
                table = value.reshape(len(value), -1)
                table = table.int() if table.dtype == torch.bool else table
                header += [key] if table.shape[1] == 1 else [f"{key}_{i}" for i in range(table.shape[1])]
                cells += list(table.T.tolist())
            else:
                header.append(key)
                cells.append(value)
        f, path = new_file(output_path(trainer, Path(self.path).with_suffix(".csv")))
        with io.TextIOWrapper(f, encoding="utf-8", newline="") as text:
            writer = csv.writer(text)
            writer.writerow(header)
            writer.writerows([_format(v) for v in row] for row in zip(*cells))
        return path

    def _write_jsonl(self, trainer: Trainer, columns: dict[str, Any]) -> Path:
        f, path = new_file(output_path(trainer, Path(self.path).with_suffix(".jsonl")))
        n = len(next(iter(columns.values())))
        rows = [
            {k: (v[i].tolist() if isinstance(v, torch.Tensor) else v[i]) for k, v in columns.items()} for i in range(n)
        ]
        with f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
        return path


def _concat(parts: list[Any]) -> Any:
    """One column from its per-batch parts: tensors concatenated on the CPU, anything else as one list."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat([p.reshape(len(p), -1) if p.dim() != 1 else p for p in parts]).cpu()
    return [x for p in parts for x in (p.tolist() if isinstance(p, torch.Tensor) else p)]
