"""Contrastive image-text objectives on normalised features, with the "local loss" arrangement across ranks.

InfoNCE (Radford et al. 2021, CLIP, Fig. 3): the B x B matrix of scaled cosine similarities is a
classification problem both ways, image -> its caption among all captions and caption -> its image;
the loss is the mean of the two cross-entropies.

Sigmoid loss (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training", Algorithm 1): every
pair is an independent binary problem, z_ij = +1 on the diagonal and -1 elsewhere,
loss = -1/B sum_ij log sigmoid(z_ij (t x_i . y_j + b)).

Across ranks (open_clip's ``local_loss=True, gather_with_grad=True``): each rank gathers every rank's
features with an all-gather whose backward sums the gradients that flow to each rank's features from
all ranks, and computes only its own rows of the global matrix, its
labels offset by rank x local batch. The mean over ranks of the local losses is then the full-batch
loss, and DDP's averaging of parameter gradients gives the full-batch gradient (tested with 2 processes).
Every rank must hold the same local batch size (training loaders drop their last partial batch).

Notation: b local batch, R ranks, N = R b global batch, E embedding dim.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from zoo.compat import all_gather_with_grad


def _fp32(x: Tensor) -> Tensor:
    """Logits in at least single precision: a softmax over thousands of bf16 logits loses the small terms."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def gather_with_grad(x: Tensor) -> tuple[Tensor, int]:
    """Every rank's rows of ``x`` (b, E) concatenated in rank order, (N, E), and this rank's first row."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    # Differentiable: the backward sums what every rank's loss sends back to these rows.
    return all_gather_with_grad(x), dist.get_rank() * x.shape[0]


def _gather_pair(image_features: Tensor, text_features: Tensor, gather: bool) -> tuple[Tensor, Tensor, int]:
    if not gather:
        return image_features, text_features, 0
    # One collective for both towers: [image | text] along the feature axis.
    both, offset = gather_with_grad(torch.cat([image_features, text_features], dim=1))
    all_images, all_texts = both.split([image_features.shape[1], text_features.shape[1]], dim=1)
    return all_images, all_texts, offset


def infonce_loss(
    image_features: Tensor, text_features: Tensor, logit_scale: Tensor, gather: bool = True
) -> dict[str, Tensor]:
    """Symmetric InfoNCE of this rank's rows against all ranks' pairs; features (b, E) normalised.

    Returns ``loss`` (the mean of the two directions), ``loss_i2t`` and ``loss_t2i``.
    """
    all_images, all_texts, offset = _gather_pair(image_features, text_features, gather)
    labels = torch.arange(image_features.shape[0], device=image_features.device) + offset  # (b,)
    logits_per_image = logit_scale * image_features @ all_texts.T  # (b, N): row i scores image i against every caption
    logits_per_text = logit_scale * text_features @ all_images.T  # (b, N)
    loss_i2t = F.cross_entropy(_fp32(logits_per_image), labels)
    loss_t2i = F.cross_entropy(_fp32(logits_per_text), labels)
    return {"loss": (loss_i2t + loss_t2i) / 2, "loss_i2t": loss_i2t, "loss_t2i": loss_t2i}


def siglip_loss(
    image_features: Tensor, text_features: Tensor, logit_scale: Tensor, logit_bias: Tensor, gather: bool = True
) -> dict[str, Tensor]:
    """Sigmoid loss of this rank's images against all ranks' captions, normalised by the local batch b."""
    all_texts, offset = gather_with_grad(text_features) if gather else (text_features, 0)
    b, n = image_features.shape[0], all_texts.shape[0]
    logits = _fp32(logit_scale * image_features @ all_texts.T + logit_bias)  # (b, N)
    rows = torch.arange(b, device=logits.device)
    signs = -torch.ones(b, n, device=logits.device)  # z_ij: -1 for every negative pair ...
    signs[rows, rows + offset] = 1.0  # ... and +1 for each image's own caption
    return {"loss": -F.logsigmoid(signs * logits).sum() / b}
