"""Diffusion: objectives (the noise schedule's, flow matching), samplers (one class each), classifier-free guidance,
UNet and DiT, and latent diffusion's autoencoder stage."""

from zoo.diffusion.autoencoder import AutoencoderModule
from zoo.diffusion.convert import load_dit_weights
from zoo.diffusion.dit import DiT
from zoo.diffusion.flow import FlowEulerSampler, FlowHeunSampler, FlowMatching
from zoo.diffusion.losses import denoising_loss, flow_matching_loss
from zoo.diffusion.module import DiffusionModule
from zoo.diffusion.objective import GaussianDiffusion, Objective
from zoo.diffusion.pretrained import from_pretrained
from zoo.diffusion.samplers import (
    ClassifierFreeGuidance,
    DDIMSampler,
    DDPMSampler,
    DPMSolverPlusPlus2M,
    Sampler,
    SamplerClass,
)
from zoo.diffusion.schedule import NoiseSchedule
from zoo.diffusion.unet import UNet

__all__ = [
    "AutoencoderModule",
    "ClassifierFreeGuidance",
    "DDIMSampler",
    "DDPMSampler",
    "DiT",
    "DPMSolverPlusPlus2M",
    "DiffusionModule",
    "FlowEulerSampler",
    "FlowHeunSampler",
    "FlowMatching",
    "GaussianDiffusion",
    "NoiseSchedule",
    "Objective",
    "Sampler",
    "SamplerClass",
    "UNet",
    "denoising_loss",
    "flow_matching_loss",
    "from_pretrained",
    "load_dit_weights",
]
