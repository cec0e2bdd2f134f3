"""Diffusion: noise schedules, samplers and their Sampling settings, classifier-free guidance, UNet and DiT."""

from zoo.diffusion.convert import load_dit_weights
from zoo.diffusion.dit import DiT
from zoo.diffusion.losses import denoising_loss
from zoo.diffusion.module import DiffusionModule
from zoo.diffusion.samplers import SAMPLERS, ClassifierFreeGuidance, DDIMSampler, DDPMSampler, Sampler, Sampling
from zoo.diffusion.schedule import NoiseSchedule
from zoo.diffusion.unet import UNet

__all__ = [
    "ClassifierFreeGuidance",
    "DDIMSampler",
    "DDPMSampler",
    "DiT",
    "DiffusionModule",
    "NoiseSchedule",
    "SAMPLERS",
    "Sampler",
    "Sampling",
    "UNet",
    "denoising_loss",
    "load_dit_weights",
]
