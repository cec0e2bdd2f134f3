"""ClassifierModule: cross-entropy training of any image classifier net.

Notation: B batch, C channels, H/W height/width, K classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from zoo.layers.hparams import save_hparams
from zoo.layers.parallel import shard
from zoo.layers.optim import AdamWCosine
from zoo.layers.weights import check_compatible, extract_state_dict
from zoo.layers.logging import lightning_writes
from zoo.tracking import log_json_artifact


def classification_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> dict[str, Tensor]:
    """Cross-entropy (optionally label-smoothed, Szegedy et al. 2016) on (B, K) logits."""
    return {"loss": F.cross_entropy(logits, target, label_smoothing=label_smoothing)}


class ClassifierModule(LightningModule):
    """Trains ``net`` (images -> logits) with cross-entropy; top-1/top-5 accuracy; confusion matrix on test."""

    family = "cnn"
    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(
        self,
        net: nn.Module,
        label_smoothing: float = 0.0,
        optimizer: AdamWCosine = AdamWCosine(lr=1e-3, weight_decay=0.05, warmup_steps=100, min_lr_ratio=0.01),
        channels_last: bool = False,
        compile: bool = False,
    ) -> None:
        """
        Args:
            net: a classifier ``nn.Module`` mapping (B, C, H, W) images to (B, K) logits, with ``num_classes``.
            label_smoothing: cross-entropy label smoothing in [0, 1).
            optimizer: AdamW with warmup and cosine decay (``zoo.layers.optim.AdamWCosine``).
            channels_last: store weights and inputs NHWC (faster convolutions on GPUs and bf16 CPUs).
            compile: run the net through ``torch.compile`` (weights and checkpoint keys unchanged).
        """
        super().__init__()
        save_hparams(self, "net")
        self.net = net
        k = net.num_classes
        metrics = MetricCollection(
            {"acc": MulticlassAccuracy(k, average="micro"), "acc_top5": MulticlassAccuracy(k, top_k=min(5, k), average="micro")}
        )
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.test_confusion = MulticlassConfusionMatrix(k)
        self._compiled = None  # set by configure_model; kept off the module tree (no "_orig_mod." keys)

    def configure_model(self) -> None:
        shard(self.net, self.device_mesh)
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.hparams.compile and self._compiled is None:
            object.__setattr__(self, "_compiled", torch.compile(self.net))

    def forward(self, x: Tensor) -> Tensor:
        if self.hparams.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        net = self.net if self._compiled is None else self._compiled
        return net(x)  # (B, K)

    def _loss(self, batch: tuple[Tensor, Tensor]) -> tuple[dict[str, Tensor], Tensor]:
        x, y = batch
        logits = self(x)
        return classification_loss(logits, y, self.hparams.label_smoothing), logits

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        out, _ = self._loss(batch)
        if lightning_writes(self.trainer):  # values logged at other steps are dropped anyway
            self.log_dict({f"train/{k}": v for k, v in out.items()}, prog_bar=True)
        return out["loss"]

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        out, logits = self._loss(batch)
        self.val_metrics.update(logits, batch[1])
        self.log("val/loss", out["loss"], prog_bar=True, sync_dist=True)
        self.log_dict(self.val_metrics, prog_bar=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        out, logits = self._loss(batch)
        self.test_metrics.update(logits, batch[1])
        self.test_confusion.update(logits, batch[1])
        self.log("test/loss", out["loss"], sync_dist=True)
        self.log_dict(self.test_metrics)

    def on_test_epoch_end(self) -> None:
        matrix = self.test_confusion.compute()  # (K, K): rows true class, columns predicted
        log_json_artifact(self.trainer, {"confusion_matrix": matrix.tolist()}, "test/confusion_matrix.json")
        self.test_confusion.reset()

    def configure_optimizers(self):
        return AdamWCosine.of(self.hparams.optimizer).configure(self.net, self.trainer)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "state_dict" in checkpoint:  # absent in a sharded (FSDP2) resume: the shards load into the net directly
            check_compatible(self.net, extract_state_dict(checkpoint, "net."), "checkpoint")

    def predict_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> dict[str, Tensor]:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        probs = self(x).float().softmax(-1)
        conf, pred = probs.max(-1)
        out = {"pred": pred, "confidence": conf}
        if isinstance(batch, (tuple, list)) and len(batch) > 1:
            out["target"] = batch[1]
        return out
