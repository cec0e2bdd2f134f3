"""ClassifierModule: cross-entropy training of any image classifier net.

Notation: B batch, C channels, H/W height/width, K classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from zoo.adapt import Adaptation
from zoo.adapt import adapt as adapt_module
from zoo.adapt.base import drop_base, restore_base
from zoo.compat import trainer_of
from zoo.errors import InputError
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.io.new_inputs import image_inputs, top_k_columns
from zoo.io.weights import (
    check_compatible,
    classifier_head,
    extract_state_dict,
    load_file,
    load_with_new_head,
    readable,
)
from zoo.train.logging import lightning_writes
from zoo.train.optim import AdamWCosine
from zoo.train.parallel import shard


def classification_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> dict[str, Tensor]:
    """Cross-entropy (optionally label-smoothed, Szegedy et al. 2016) on (B, K) logits."""
    return {"loss": F.cross_entropy(logits, target, label_smoothing=label_smoothing)}


def num_classes_for(given: int | None, k: int | None, names: list[str] | None = None) -> int:
    """The net's ``num_classes`` for data of ``k`` classes (``names``, when known): ``given``, unless None (then
    ``k``); a given number that disagrees with the data's is an error naming both."""
    if k is None:
        if given is None:
            raise InputError(
                "the net's num_classes is not set and the data does not say how many classes it has: "
                "set model.init_args.net.init_args.num_classes"
            )
        return given
    if given is not None and given != k:
        shown = f" ({', '.join(map(str, names[:6]))}{', ...' if len(names) > 6 else ''})" if names else ""
        raise InputError(
            f"the net has num_classes={given} but the data has {k} classes{shown}: "
            f"drop num_classes from the net's config to take the data's, or set it to {k}"
        )
    return k


class ClassifierModule(WeightsOnlyLoading, LightningModule):
    """Trains ``net`` (images -> logits) with cross-entropy; top-1/top-5 accuracy; confusion matrix on test."""

    def __init__(
        self,
        net: nn.Module,
        label_smoothing: float = 0.0,
        optimizer: AdamWCosine = AdamWCosine(lr=1e-3, weight_decay=0.05, warmup_steps=100, min_lr_ratio=0.01),
        channels_last: bool = False,
        compile: bool = False,
        init_weights: str | None = None,
        freeze_backbone: bool = False,
        adapt: Adaptation | None = None,
    ) -> None:
        """
        Args:
            net: a classifier ``nn.Module`` mapping (B, C, H, W) images to (B, K) logits, with ``num_classes``
                (a config may leave it unset: ``cli.py`` takes the data's before the net is built).
            label_smoothing: cross-entropy label smoothing in [0, 1).
            optimizer: AdamW with warmup and cosine decay (``zoo.train.optim.AdamWCosine``).
            channels_last: store weights and inputs NHWC (faster convolutions on GPUs and bf16 CPUs).
            compile: run the net through ``torch.compile`` (weights and checkpoint keys unchanged).
            init_weights: pretrained weights to start from (a checkpoint, .pth or .safetensors of the net, or
                models:/<name>@<alias>); a head of another number of classes is replaced, and a line says so.
            freeze_backbone: train the classifier head only (linear probing); the rest keeps its weights and
                its batch-norm statistics. With ``adapt``, the head trains besides what ``adapt`` trains.
            adapt: what a fine-tune trains (``zoo.adapt.Adaptation``): LoRA adapters on some layers
                (``lora: {r: 8, alpha: 16}``: every conv and linear layer but the stem and the head, which the net's
                ``io_layers()`` name) and the parameters named by ``trainable`` globs (``["net.fc.*"]``); None: every
                weight (or the head alone with ``freeze_backbone``).
        """
        super().__init__()
        save_hparams(self, "net")
        self.net = net
        self._build_metrics(net.num_classes)
        self.inputs: dict | None = None  # what new images must look like, and the class names (zoo.io.new_inputs)
        self.confusion_matrix: dict | None = None  # the last test's, set at its end
        self._init_loaded = False
        self._compiled = None  # set by configure_model; kept off the module tree (no "_orig_mod." keys)

    def _build_metrics(self, k: int) -> None:
        metrics = {"acc": MulticlassAccuracy(k, average="micro")}
        if k > 5:  # with 5 classes or fewer every label is in the top 5: a constant 1.0 says nothing
            metrics["acc_top5"] = MulticlassAccuracy(k, top_k=5, average="micro")
        metrics = MetricCollection(metrics)
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.test_confusion = MulticlassConfusionMatrix(k)

    def setup(self, stage: str) -> None:
        dm = getattr(trainer_of(self), "datamodule", None)
        if getattr(dm, "num_classes", None) is not None:  # sized by whoever built the net; checked here
            num_classes_for(self.net.num_classes, dm.num_classes, getattr(dm, "class_names", None))
        if stage == "fit" or self.inputs is None:  # a checkpoint's own, restored after setup, wins otherwise
            self.inputs = image_inputs(dm) or self.inputs
        if self.hparams.init_weights and not self._init_loaded:  # once: a later test() keeps the trained weights
            self._load_init_weights(self.hparams.init_weights)
        self._adapt()  # after init_weights, before sharding and compiling (configure_model)

    def _adapt(self) -> None:
        """``adapt`` applied once (``zoo.adapt``); ``freeze_backbone`` is its special case of a ``trainable`` glob
        naming the head (besides whatever ``adapt`` trains)."""
        settings = Adaptation.of(self.hparams.adapt)
        if self.hparams.freeze_backbone:
            lora, trainable = (settings.lora, settings.trainable or ()) if settings else (None, ())
            settings = Adaptation(lora=lora, trainable=(*trainable, f"net.{classifier_head(self.net)}.*"))
        adapt_module(self, settings)

    def _load_init_weights(self, path: str) -> None:
        state_dict = extract_state_dict(load_file(readable(path)), "net.")
        for line in load_with_new_head(self.net, state_dict, f"init_weights {path!r}"):
            rank_zero_info(f"init_weights: replaced the classifier head, {line}")
        self._init_loaded = True

    def on_train_epoch_start(self) -> None:
        if self.hparams.freeze_backbone:  # linear probing: the frozen layers' batch-norm statistics stay as loaded
            for m in self.net.modules():  # (and their dropout is off); the head and any adapters train
                if not any(p.requires_grad for p in m.parameters()):
                    m.eval()

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
        names = (self.inputs or {}).get("class_names")
        # What the last test counted, for whoever reports it (callbacks.LogConfusionMatrix logs it to MLflow).
        self.confusion_matrix = {"confusion_matrix": matrix.tolist(), "class_names": names}
        self.test_confusion.reset()

    def configure_optimizers(self):
        return AdamWCosine.of(self.hparams.optimizer).configure(self.net, self.trainer)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)  # the zoo version that wrote it (WeightsOnlyLoading)
        if self.inputs is not None:  # so that new files are read as the training data was, without its config
            checkpoint["inputs"] = self.inputs
        drop_base(self, checkpoint)  # a LoRA fine-tune keeps its adapters; the base is init_weights'

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # The checkpoint's adapter keys meet adapted layers; a base left out is read again from init_weights.
        restore_base(self, checkpoint, lambda: self._load_init_weights(self.hparams.init_weights), self._adapt)
        if "state_dict" in checkpoint:  # absent in a sharded (FSDP2) resume: the shards load into the net directly
            check_compatible(self.net, extract_state_dict(checkpoint, "net."), "checkpoint")
        if "inputs" in checkpoint:
            self.inputs = dict(checkpoint["inputs"])

    def predict_step(self, batch: Tensor | tuple[Tensor, ...] | dict, batch_idx: int) -> dict:
        """New files (a dict batch of ``image`` and ``path``): path, class name, confidence and the top 5 (or the
        batch's ``top_k``);
        a labelled split: the predicted index, its probability and the target."""
        if isinstance(batch, dict):
            probs = self(batch["image"]).float().softmax(-1)  # (B, K)
            names = (self.inputs or {}).get("class_names")
            return {"path": list(batch["path"])} | top_k_columns(probs, names, batch.get("top_k", 5))
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        probs = self(x).float().softmax(-1)
        conf, pred = probs.max(-1)
        out = {"pred": pred, "confidence": conf}
        if isinstance(batch, (tuple, list)) and len(batch) > 1:
            out["target"] = batch[1]
        return out
