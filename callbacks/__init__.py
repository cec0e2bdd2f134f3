"""Callbacks shared by every family: monitors, checkpointing, prediction writing, progress."""

from callbacks.checkpoint import CheckpointOnException, MonitoredCheckpoint
from callbacks.completions import LogCompletions
from callbacks.confusion import LogConfusionMatrix
from callbacks.fid import FrechetInceptionDistance
from callbacks.frechet import FrechetDistance
from callbacks.image_samples import LogImageSamples
from callbacks.monitors import (
    GradNormMonitor,
    NonFiniteLossError,
    PrecisionMonitor,
    ResumesItsOptimizer,
    TrainsSomething,
)
from callbacks.predictions import WritePredictions
from callbacks.progress import ProgressBar
from callbacks.summary import ModelSummary
from callbacks.text_samples import LogTextSamples
from callbacks.wiseft import WiseFT

__all__ = [
    "CheckpointOnException",
    "FrechetDistance",
    "FrechetInceptionDistance",
    "GradNormMonitor",
    "LogCompletions",
    "LogConfusionMatrix",
    "LogImageSamples",
    "LogTextSamples",
    "ModelSummary",
    "MonitoredCheckpoint",
    "NonFiniteLossError",
    "PrecisionMonitor",
    "ProgressBar",
    "ResumesItsOptimizer",
    "TrainsSomething",
    "WiseFT",
    "WritePredictions",
]
