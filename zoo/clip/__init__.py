"""CLIP-style contrastive image-text models: ViT and text towers, InfoNCE and SigLIP losses across ranks."""

from zoo.clip.clip import CLIP
from zoo.clip.module import ContrastiveModule
from zoo.clip.towers import TextTransformer, VisionTransformer

__all__ = ["CLIP", "ContrastiveModule", "TextTransformer", "VisionTransformer"]
