"""What a trained image model needs to be used on new files, and how its predictions on them read.

A net trained on normalised images predicts well on a new file only if the file is read as the training
data was: the same channels and side, the same per-channel mean and std. The module records these, with
the class names (and CLIP's prompt templates), from its DataModule at fit (``image_inputs``) and keeps them
in its checkpoint and MLflow model as ``inputs``, so ``datamodules.ImageFilesDataModule`` can read new
files without the training config.

Notation: B batch, K classes.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor


def image_inputs(datamodule: Any) -> dict | None:
    """``{"image_shape", "mean", "std", "class_names", "templates"}`` from an image DataModule's protocol
    attributes (``image_shape``, ``normalization``, ``class_names``, ``templates``), or None without them."""
    shape = getattr(datamodule, "image_shape", None)
    if shape is None:
        return None
    spec: dict[str, Any] = {"image_shape": [int(s) for s in shape]}
    normalization = getattr(datamodule, "normalization", None)
    if normalization is not None:
        spec["mean"], spec["std"] = ([float(v) for v in part] for part in normalization)
    for key in ("class_names", "templates"):
        values = getattr(datamodule, key, None)
        if values:
            spec[key] = [str(v) for v in values]
    return spec


def top_k_columns(probs: Tensor, class_names: list[str] | None, k: int = 5) -> dict[str, Any]:
    """Prediction columns from (B, K) class probabilities: ``pred`` (index), ``class`` (name) and ``confidence``
    of the best class, then ``class_<i>`` and ``confidence_<i>`` of the i-th best, for i up to min(k, K)."""
    conf, idx = probs.float().topk(min(k, probs.shape[-1]), dim=-1)  # (B, k) each, best first
    names = class_names or [str(i) for i in range(probs.shape[-1])]
    out: dict[str, Any] = {"pred": idx[:, 0]}
    for i in range(idx.shape[1]):
        suffix = "" if i == 0 else f"_{i + 1}"
        out[f"class{suffix}"] = [names[j] for j in idx[:, i].tolist()]
        out[f"confidence{suffix}"] = conf[:, i]
    return out
