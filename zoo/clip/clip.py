"""CLIP: two towers mapped into one space, and the temperature that scales their cosine similarities.

Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision", sec. 2.5:
the logit scale is a learned log-temperature, initialised to ln(1/0.07) and clipped so that logits are
never scaled by more than 100, which keeps training stable. SigLIP (Zhai et al. 2023) adds a learned
bias, initialised to -10 so that the many negative pairs start with a small loss.

Any image net works as the image tower if it maps (B, C, H, W) to (B, E): a ``VisionTransformer``, or
a zoo CNN with ``num_classes=E`` (its classifier head becomes the projection).

Notation: B batch, E joint embedding dim, T tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _output_dim(encoder: nn.Module) -> int | None:
    return getattr(encoder, "embed_dim", None) or getattr(encoder, "num_classes", None)


class CLIP(nn.Module):
    """An image tower and a text tower with L2-normalised outputs, a clamped logit scale and an optional bias."""

    def __init__(
        self,
        image_encoder: nn.Module | None = None,
        text_encoder: nn.Module | None = None,
        init_logit_scale: float = math.log(1 / 0.07),
        max_logit_scale: float = math.log(100),
        init_logit_bias: float | None = None,
    ) -> None:
        """
        Args:
            image_encoder: images (B, C, H, W) -> features (B, E), e.g. ``zoo.clip.VisionTransformer`` or
                ``zoo.cnn.ConvNet`` with ``num_classes`` E.
            text_encoder: token ids (B, T) -> features (B, E), e.g. ``zoo.clip.TextTransformer``. Both towers are
                required; a config may leave them unset (None) with ``init_weights`` a Hugging Face or open_clip
                folder: ``cli.py`` then builds them as its config states.
            init_logit_scale: initial log of the multiplier applied to cosine similarities (CLIP: ln(1/0.07)).
            max_logit_scale: the log scale is clamped here, in the forward and after each optimizer step (ln 100).
            init_logit_bias: initial learned logit bias, needed by the sigmoid loss (SigLIP: -10); None: no bias.
        """
        if image_encoder is None or text_encoder is None:
            raise ValueError(
                "CLIP needs an image_encoder and a text_encoder: give them in the net block, or init_weights a Hugging "
                "Face or open_clip folder, whose config states them (cli.py builds them from it)"
            )
        super().__init__()
        e_img, e_txt = _output_dim(image_encoder), _output_dim(text_encoder)
        if e_img is not None and e_txt is not None and e_img != e_txt:
            raise ValueError(f"the image tower outputs {e_img} features and the text tower {e_txt}: set one embed_dim")
        self.image_encoder, self.text_encoder = image_encoder, text_encoder
        self.max_logit_scale = max_logit_scale
        # Shape (1,), not a scalar: FSDP2 shards parameters along their first dimension.
        self.logit_scale = nn.Parameter(torch.tensor([float(init_logit_scale)]))
        self.logit_bias = nn.Parameter(torch.tensor([float(init_logit_bias)])) if init_logit_bias is not None else None

    def no_weight_decay(self) -> tuple[str, ...]:
        names = ["logit_scale", "logit_bias"]
        for prefix, enc in (("image_encoder", self.image_encoder), ("text_encoder", self.text_encoder)):
            names += [f"{prefix}.{n}" for n in getattr(enc, "no_weight_decay", tuple)()]
        return tuple(names)

    def io_layers(self) -> tuple[str, ...]:
        """Each tower's input and output layers; a tower that names none stays with AdamW whole."""
        names = []
        for prefix, enc in (("image_encoder", self.image_encoder), ("text_encoder", self.text_encoder)):
            io_layers = getattr(enc, "io_layers", None)
            names += [f"{prefix}.{n}" for n in io_layers()] if io_layers else [prefix]
        return tuple(names)

    def encode_image(self, images: Tensor, normalize: bool = True) -> Tensor:
        features = self.image_encoder(images)  # (B, E)
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, ids: Tensor, normalize: bool = True) -> Tensor:
        features = self.text_encoder(ids)  # (B, E)
        return F.normalize(features, dim=-1) if normalize else features

    def scale(self) -> Tensor:
        """(1,) exp(logit_scale), the log clamped at ``max_logit_scale`` (no gradient pushes it past the clamp)."""
        s = self.logit_scale
        if hasattr(s, "full_tensor"):  # FSDP2 outside the forward: the parameter is still sharded
            s = s.full_tensor()
        return s.clamp(max=self.max_logit_scale).exp()

    @torch.no_grad()
    def clamp_logit_scale(self) -> None:
        """Clamp the parameter itself, as open_clip does after each optimizer step."""
        self.logit_scale.clamp_(max=self.max_logit_scale)

    def forward(self, images: Tensor, ids: Tensor) -> dict[str, Tensor]:
        """Normalised features of both towers, the scale and the bias: what a contrastive loss takes."""
        out = {"image_features": self.encode_image(images), "text_features": self.encode_text(ids)}
        out["logit_scale"] = self.scale()
        if self.logit_bias is not None:
            out["logit_bias"] = self.logit_bias
        return out
