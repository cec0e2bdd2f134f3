"""ContrastiveModule: trains a ``CLIP`` on image-caption batches; zero-shot and retrieval in the loop.

Validation embeds the whole held-out split and reports (Radford et al. 2021, sec. 3.1):
  * zero-shot accuracy: each class's prompts (class name x templates) are embedded, normalised,
    averaged and normalised again into one classifier row (prompt ensembling); an image is assigned
    the class with the most similar row.
  * image -> text and text -> image recall@1/5/10 over unique images, every caption of an image a hit
    (the COCO/Flickr protocol, ``zoo.clip.metrics``).

Notation: B batch, N held-out pairs, K classes, P prompts per class, E embedding dim, T tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from zoo.adapt import Adaptation
from zoo.adapt import adapt as adapt_module
from zoo.adapt.base import drop_base, restore_base
from zoo.adapt.lora import ADAPTER_PREFIX
from zoo.clip.clip import CLIP
from zoo.clip.losses import infonce_loss, siglip_loss
from zoo.clip.metrics import first_rows, retrieval_recall, zeroshot_accuracy, zeroshot_weights
from zoo.clip.pretrained import check_reads_as_source, source_inputs, source_tokenizer
from zoo.compat import trainer_of
from zoo.errors import InputError
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.io.new_inputs import image_inputs, prompt, top_k_columns
from zoo.io.tokenizers import tokenize, tokenizer_from_dict
from zoo.io.weights import check_compatible, extract_state_dict, readable
from zoo.train.logging import lightning_writes
from zoo.train.optim import AdamWCosine
from zoo.train.parallel import shard


class ContrastiveModule(WeightsOnlyLoading, LightningModule):
    """Trains ``net`` (a ``CLIP``) with InfoNCE or the sigmoid loss across all ranks' pairs."""

    def __init__(
        self,
        net: CLIP,
        loss: Literal["infonce", "siglip"] = "infonce",
        optimizer: AdamWCosine = AdamWCosine(
            lr=5e-4, weight_decay=0.2, betas=(0.9, 0.98), warmup_steps=100, min_lr_ratio=0.0
        ),
        init_weights: str | None = None,
        compile: bool = False,
        lock_image: bool = False,
        lock_text: bool = False,
        adapt: Adaptation | None = None,
    ) -> None:
        """
        Args:
            net: the two-tower model (``zoo.clip.CLIP``); the sigmoid loss needs its ``init_logit_bias``.
            loss: infonce (CLIP's symmetric cross-entropy) or siglip (pairwise sigmoid, Zhai et al. 2023).
            optimizer: AdamW with warmup and cosine decay (``zoo.train.optim.AdamWCosine``); CLIP uses beta2 = 0.98
                for stability with large batches; positions, the logit scale and bias take no weight decay.
            init_weights: a local Hugging Face CLIP or SigLIP folder (config.json + weights), an open_clip folder, a
                weights file, or models:/<name>@<alias>, to start from, loaded weights-only before any checkpoint given
                by --ckpt_path is restored over it; a tower projection of another size is replaced. Imported weights
                bring their tokenizer, image preprocessing and OpenAI's zero-shot templates (``zoo.clip.pretrained``).
            compile: run the towers through ``torch.compile`` for training (checkpoint keys unchanged).
            lock_image: keep the image tower as loaded (LiT, Zhai et al. 2022: a pretrained image tower, locked,
                teaches a new text tower); its normalisation statistics and dropout stay in eval mode.
            lock_text: keep the text tower as loaded (linear probing of the image tower against fixed texts).
            adapt: what a fine-tune trains (``zoo.adapt.Adaptation``): LoRA adapters on some layers
                (``lora: {r: 8, alpha: 16}``: every linear and conv layer of the towers but their patch or token
                embeddings and projections, which ``io_layers()`` name) and the parameters named by ``trainable`` globs
                (LiT: ``["net.text_encoder.*", "net.logit_scale"]``); None: every weight. A locked tower never trains:
                LoRA targets there are refused, ``trainable`` globs there overruled.
        """
        super().__init__()
        save_hparams(self, "net")
        if loss == "siglip" and net.logit_bias is None:
            raise ValueError("loss='siglip' needs a learned bias: set net.init_args.init_logit_bias (SigLIP: -10)")
        self.net = net
        self._compiled = None  # set by configure_model; kept off the module tree (no "_orig_mod." keys)
        self._init_loaded = False
        self._val: dict[str, list[Tensor]] = {}
        self._classifier: tuple[tuple, Tensor] | None = None  # predict: (class names, (K, E) weights)
        self.tokenizer = None  # from the datamodule or the checkpoint; needed by ``embed_texts``
        self.context_length: int | None = None
        self.inputs: dict | None = None  # image format, class names, templates of the training data (new_inputs)
        self._source_inputs: dict | None = None  # imported weights' own image format (zoo.clip.pretrained)

    # -- setup ---------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        shard(self.net, self.device_mesh, blocks=[self.net.image_encoder, self.net.text_encoder])
        if self.hparams.compile and self._compiled is None:
            object.__setattr__(self, "_compiled", torch.compile(self.net))

    def setup(self, stage: str) -> None:
        if self.hparams.init_weights and not self._init_loaded:  # once: a later test() keeps trained weights
            self._load_init_weights(readable(self.hparams.init_weights))
        self._adapt()  # after init_weights, before sharding and compiling (configure_model)
        dm = getattr(trainer_of(self), "datamodule", None)
        if self._source_inputs is not None:
            check_reads_as_source(image_inputs(dm), self._source_inputs)
        if stage == "fit" or self.inputs is None:  # a checkpoint's own, restored after setup, wins otherwise
            self.inputs = image_inputs(dm) or self.inputs
        if getattr(dm, "tokenizer", None) is None:
            return
        self.tokenizer, self.context_length = dm.tokenizer, dm.context_length
        self._check_text_tower()

    def _load_init_weights(self, path) -> None:
        """The weights, and for imported ones (not the zoo's own) their image format, OpenAI's prompts and the
        folder's tokenizer: what predicting with them needs, before any data or checkpoint says otherwise."""
        from zoo.clip.hf import load_source_into

        layout = load_source_into(self.net, path)
        if layout != "zoo":
            self.inputs = self._source_inputs = source_inputs(path, self.net)
            tokenizer = source_tokenizer(path, layout)
            if tokenizer is not None:
                self.tokenizer, self.context_length = tokenizer, self.net.text_encoder.context_length
                self._check_text_tower()
        self._init_loaded = True

    def _adapt(self) -> None:
        """The locks, then ``adapt`` (once; ``zoo.adapt``): LoRA's default targets are the layers that train, so a
        locked tower takes none; the locks again after, over any ``trainable`` glob that names a locked tower."""
        for tower in self._locked_towers():
            tower.requires_grad_(False)  # param_groups leaves them out of the optimizer
        adapt_module(self, self.hparams.adapt)
        for tower in self._locked_towers():
            if any(ADAPTER_PREFIX in name for name, _ in tower.named_parameters()):
                raise InputError(
                    "adapt.lora.targets name layers of a locked tower (lock_image, lock_text): it never "
                    "trains, so neither would they; name the other tower's layers or unlock it"
                )
            tower.requires_grad_(False)

    def _locked_towers(self) -> list[nn.Module]:
        h = self.hparams
        return [
            t
            for t, lock in ((self.net.image_encoder, h.get("lock_image")), (self.net.text_encoder, h.get("lock_text")))
            if lock
        ]

    def on_train_epoch_start(self) -> None:
        for tower in self._locked_towers():  # Lightning puts the whole module in train mode before each epoch
            tower.eval()

    def _check_text_tower(self) -> None:
        tower = self.net.text_encoder
        n_vocab, eot = getattr(tower, "vocab_size", None), getattr(tower, "eot_id", None)
        ctx = getattr(tower, "context_length", None)
        tok = self.tokenizer
        if getattr(tower, "pool", "eot") == "last":  # SigLIP: read at the last position, so padding is its input
            eot, pads_to = None, getattr(tok, "model_max_length", ctx)
            if ctx is not None and pads_to != ctx:
                raise ValueError(
                    f"the text tower reads the last of its {ctx} positions but its tokenizer pads texts to {pads_to} "
                    "(model_max_length): give the tokenizer and the tower one length"
                )
            if ctx is not None and self.context_length != ctx:
                raise ValueError(
                    f"the text tower reads the last of its {ctx} positions, so texts are padded to {ctx}: pass "
                    f"--data.init_args.context_length={ctx} (not {self.context_length})"
                )
        if n_vocab is not None and tok.vocab_size > n_vocab:
            raise ValueError(
                f"the tokenizer has {tok.vocab_size} ids but the text tower's vocab_size is {n_vocab}: "
                f"set --model.init_args.net.init_args.text_encoder.init_args.vocab_size={tok.vocab_size}"
            )
        if eot is not None and eot != tok.eos_id:
            raise ValueError(
                f"the text tower reads eot_id={eot} but the tokenizer ends texts with {tok.eos_id}: "
                f"set --model.init_args.net.init_args.text_encoder.init_args.eot_id={tok.eos_id}"
            )
        if ctx is not None and self.context_length > ctx:
            raise ValueError(f"the data's context_length {self.context_length} exceeds the text tower's {ctx}")

    # -- training ------------------------------------------------------------------------------------------

    def forward(self, images: Tensor, text: Tensor) -> dict[str, Tensor]:
        net = self.net if self._compiled is None or not self.training else self._compiled
        return net(images, text)

    def _loss(self, out: dict[str, Tensor]) -> dict[str, Tensor]:
        img, txt, scale = out["image_features"], out["text_features"], out["logit_scale"]
        if self.hparams.loss == "siglip":
            return siglip_loss(img, txt, scale, out["logit_bias"])
        return infonce_loss(img, txt, scale)

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        out = self(batch["image"], batch["text"])
        losses = self._loss(out)
        if lightning_writes(self.trainer):  # values logged at other steps are dropped anyway
            self.log_dict({f"train/{k}": v for k, v in losses.items()}, prog_bar=True)
            self.log("train/logit_scale", out["logit_scale"].squeeze())
        return losses["loss"]

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self.net.clamp_logit_scale()  # after the optimizer step, as open_clip does

    def configure_optimizers(self):
        return AdamWCosine.of(self.hparams.optimizer).configure(self.net, self.trainer)

    # -- evaluation ----------------------------------------------------------------------------------------

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self(batch["image"], batch["text"])
        self.log("val/loss", self._loss(out)["loss"], prog_bar=True, sync_dist=True, batch_size=len(batch["text"]))
        fields = {
            "image": out["image_features"],
            "text": out["text_features"],
            "label": batch["label"],
            "image_id": batch["image_id"],
            "caption_id": batch["caption_id"],
            "index": batch["index"],
        }
        for k, v in fields.items():
            self._val.setdefault(k, []).append(v)

    def on_validation_epoch_start(self) -> None:
        self._val = {}

    def _gathered(self, name: str) -> Tensor:
        x = torch.cat(self._val[name])
        # Every rank holds as many held-out pairs (the distributed sampler pads), so their features stack.
        return self.all_gather(x).flatten(0, 1) if self.trainer.world_size > 1 else x

    def on_validation_epoch_end(self) -> None:
        if not self._val:
            return
        val = {k: self._gathered(k) for k in self._val}
        self._val = {}
        rows, _ = first_rows(val["index"])  # each held-out row once: the distributed sampler repeats a few
        val = {k: v[rows] for k, v in val.items()}
        metrics = retrieval_recall(val["image"], val["text"], val["image_id"], val["caption_id"])
        one_per_image, _ = first_rows(val["image_id"])
        metrics |= self.zeroshot_metrics(val["image"][one_per_image], val["label"][one_per_image])
        self.log_dict({f"val/{k}": v for k, v in metrics.items()})
        self.log("val/logit_scale", self.net.scale().squeeze())

    def zeroshot_metrics(self, images: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """Zero-shot accuracy of (N, E) image features (``zoo.clip.metrics.zeroshot_accuracy``); {} without labels."""
        prompts = getattr(self.trainer.datamodule, "zeroshot_prompts", lambda: None)()
        known = labels >= 0
        if prompts is None or not known.any():
            return {}
        names, ids = prompts
        weights = zeroshot_weights(self.net, ids.to(self.device), len(names))  # (K, E)
        return zeroshot_accuracy(images[known], labels[known], weights)

    # -- use after training --------------------------------------------------------------------------------

    @torch.no_grad()
    def embed_images(self, images: Tensor) -> Tensor:
        """(B, E) normalised embeddings of (B, C, H, W) images, resized and standardised as the training data."""
        return self.net.encode_image(images.to(self.device))

    @torch.no_grad()
    def embed_texts(self, texts: list[str]) -> Tensor:
        """(B, E) normalised embeddings of texts, tokenised as in training."""
        if self.tokenizer is None:
            raise RuntimeError("No tokenizer: fit, or load from a checkpoint made with CaptionDataModule")
        return self.net.encode_text(tokenize(self.tokenizer, texts, self.context_length).to(self.device))

    def _tokens(self, texts: list[str]) -> Tensor:
        if self.tokenizer is None:
            raise RuntimeError("No tokenizer: fit, or load from a checkpoint made with CaptionDataModule")
        return tokenize(self.tokenizer, texts, self.context_length).to(self.device)

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Zero-shot classes (path, class, confidence and the top 5, as the CNN's), image embeddings or text
        embeddings, as the datamodule's ``predict`` asks. Texts come as ids (``CaptionDataModule``, tokenised by
        the data) or as strings (``ZeroShotDataModule``, tokenised here with the model's own tokenizer)."""
        mode = batch["mode"]
        if mode == "text_embeddings":
            ids = batch["text"] if "text" in batch else self._tokens(list(batch["caption"]))
            return {"text": list(batch["caption"]), "embedding": self.net.encode_text(ids)}
        ident = {"path": list(batch["path"])} if "path" in batch else {"index": batch["index"]}
        images = self.net.encode_image(batch["image"])  # (B, E)
        if mode == "image_embeddings":
            return ident | {"embedding": images}
        names = tuple(batch["class_names"])
        if self._classifier is None or self._classifier[0] != names:  # the prompts are the same in every batch
            ids = batch.get("class_text")
            if ids is None:  # class-major prompts, as CaptionDataModule.zeroshot_prompts builds them
                ids = self._tokens([prompt(t, c) for c in names for t in batch["templates"]])
            self._classifier = (names, zeroshot_weights(self.net, ids, len(names)))
        probs = self.zeroshot_probs(images, self._classifier[1])

        rows = ident | top_k_columns(probs, list(names), batch.get("top_k", 5))
        if "label" in batch and (batch["label"] >= 0).any():
            rows["label"] = [names[k] if 0 <= k < len(names) else "" for k in batch["label"].tolist()]
        return rows

    def zeroshot_probs(self, images: Tensor, classes: Tensor) -> Tensor:
        """(B, K) class probabilities of (B, E) image and (K, E) class embeddings: a softmax over the scaled cosines
        (InfoNCE's classes compete), or under the sigmoid loss each pair's own probability, sigmoid(t x cos + b)
        (Zhai et al. 2023: SigLIP's probabilities do not sum to one)."""
        logits = (self.net.scale() * images @ classes.T).float()  # (B, K)
        if self.hparams.loss == "siglip":
            return torch.sigmoid(logits + self.net.logit_bias.float())
        return logits.softmax(-1)

    def on_predict_start(self) -> None:
        # Here, after --ckpt_path restored the checkpoint's tokenizer: the data must tokenise as training did.
        self._classifier = None
        dm = self.trainer.datamodule
        tok = getattr(dm, "tokenizer", None)
        if tok is not None and self.tokenizer is not None and tok.to_dict() != self.tokenizer.to_dict():
            raise ValueError(
                "the data's tokenizer differs from the one this checkpoint was trained with: "
                "predict with the data settings (tokenizer, path) of the training run"
            )

    # -- checkpoints ---------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)  # the zoo version that wrote it (WeightsOnlyLoading)
        # The tokenizer travels with the weights, so load_from_checkpoint(path).embed_texts([...]) works alone.
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = {**self.tokenizer.to_dict(), "context_length": self.context_length}
        if self.inputs is not None:  # so that new files are read as the training data was, without its config
            checkpoint["inputs"] = self.inputs
        drop_base(self, checkpoint)  # a LoRA fine-tune keeps its adapters; the base is init_weights'

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # The checkpoint's adapter keys meet adapted layers; a base left out is read again from init_weights.
        restore_base(
            self, checkpoint, lambda: self._load_init_weights(readable(self.hparams.init_weights)), self._adapt
        )
        if "state_dict" in checkpoint:  # absent in a sharded (FSDP2) resume: the shards load into the net directly
            check_compatible(self.net, extract_state_dict(checkpoint, "net."), "checkpoint")
        if "tokenizer" in checkpoint:
            tok = dict(checkpoint["tokenizer"])
            self.context_length = tok.pop("context_length")
            self.tokenizer = tokenizer_from_dict(tok)
        if "inputs" in checkpoint:
            self.inputs = dict(checkpoint["inputs"])
