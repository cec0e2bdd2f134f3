"""Diffusion: noise schedules, DDPM/DDIM samplers, classifier-free guidance, UNet and DiT denoisers."""

from zoo.diffusion.convert import load_dit_weights
from zoo.diffusion.dit import DiT
from zoo.diffusion.losses import denoising_loss
from zoo.diffusion.module import DiffusionModule
from zoo.diffusion.samplers import ClassifierFreeGuidance, DDIMSampler, DDPMSampler
from zoo.diffusion.schedule import NoiseSchedule
from zoo.diffusion.unet import UNet

__all__ = [
    "ClassifierFreeGuidance",
    "DDIMSampler",
    "DDPMSampler",
    "DiT",
    "DiffusionModule",
    "NoiseSchedule",
    "UNet",
    "denoising_loss",
    "load_dit_weights",
]
