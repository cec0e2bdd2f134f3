"""AutoencoderModule: trains the KL autoencoder of a latent diffusion model, so that none need be downloaded.

Latent diffusion's first stage (Rombach et al. 2022, sec. 3 and app. G) without its perceptual and adversarial
terms, which need a pretrained network: a reconstruction loss plus a small KL term towards N(0, I) (the VAE's,
Kingma & Welling 2014), weighted so that the latents stay close to the data (LDM: 1e-6 of per-image sums; here per
element, hence a larger weight):

    loss = mean |x - D(z)|^p + kl_weight * mean_{Z, h, w} KL(N(mu, sigma^2) || N(0, 1)),   z ~ N(mu, sigma^2)

with KL = (mu^2 + sigma^2 - 1 - log sigma^2) / 2 per latent element. What it writes is a checkpoint whose
``autoencoder.`` weights ``DiffusionModule(autoencoder_weights=...)`` reads.

Notation: B batch, C image channels, Z latent channels, h/w latent side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from zoo.diffusion.latent import build_autoencoder, posterior_sample
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.hparams import save_hparams
from zoo.train.logging import lightning_writes
from zoo.train.optim import AdamWCosine


def kl_to_standard_normal(mean: Tensor, logvar: Tensor) -> Tensor:
    """Mean over all elements of KL(N(mean, exp(logvar)) || N(0, 1)) = (mean^2 + var - 1 - logvar) / 2."""
    return 0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar).mean()


class AutoencoderModule(WeightsOnlyLoading, LightningModule):
    """Trains ``autoencoder`` (``encode(x).latent_dist``, ``decode(z).sample``) on (images in [-1, 1], labels)."""

    def __init__(
        self,
        autoencoder: dict[str, Any],
        kl_weight: float = 1e-3,
        reconstruction: Literal["l1", "l2"] = "l1",
        optimizer: AdamWCosine = AdamWCosine(lr=1e-3),
    ) -> None:
        """
        Args:
            autoencoder: ``{class_path: diffusers.AutoencoderKL, init_args: {...}}`` (``zoo.diffusion.latent``), or
                from Python the module itself; the same config a latent ``DiffusionModule`` then reads it with.
            kl_weight: weight of the KL term (per latent element) against the reconstruction (per pixel).
            reconstruction: "l1" (LDM's) or "l2" pixel loss.
            optimizer: AdamW with warmup and cosine decay (``zoo.train.optim.AdamWCosine``).
        """
        super().__init__()
        save_hparams(self, "autoencoder")
        self.autoencoder: nn.Module = (
            build_autoencoder(autoencoder) if isinstance(autoencoder, Mapping) else autoencoder
        )

    def _loss(self, images: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        posterior = self.autoencoder.encode(images).latent_dist
        z = posterior_sample(posterior, generator)  # (B, Z, h, w)
        recon = self.autoencoder.decode(z).sample  # (B, C, H, W)
        err = recon.float() - images.float()
        rec = err.abs().mean() if self.hparams.reconstruction == "l1" else err.pow(2).mean()
        kl = kl_to_standard_normal(posterior.mean.float(), posterior.logvar.float())
        return {"loss": rec + self.hparams.kl_weight * kl, "rec": rec, "kl": kl}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        # Keyed like DiffusionModule's draws, so a resumed run draws what an unbroken one would.
        key = hash((torch.initial_seed(), self.current_epoch, batch_idx, self.global_rank)) % 2**63
        out = self._loss(batch[0], torch.Generator(batch[0].device).manual_seed(key))
        if lightning_writes(self.trainer):
            self.log_dict({f"train/{k}": v for k, v in out.items()}, prog_bar=True)
        return out["loss"]

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        out = self._loss(batch[0], torch.Generator().manual_seed(batch_idx))  # the same draws at every validation
        self.log_dict({f"val/{k}": v for k, v in out.items()}, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return AdamWCosine.of(self.hparams.optimizer).configure(self.autoencoder, self.trainer)
