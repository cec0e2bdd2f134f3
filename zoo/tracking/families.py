"""What the application needs to know of each family, in one visible table (as DiT's ``DiT_models``): the families
know nothing of the application, so what a run adds around a module is written here, not in the module.

Keyed by the module's class path as the family exports it; a subclass of a listed module (a user's own) takes its
row. A module listed nowhere (a test's, a user's from scratch) gets the plain defaults: no family callbacks, no
predict DataModule of its own, predictions written by their type, checkpoints on ``last`` only.
"""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # the run's ``zoo.family`` tag and the first word of its default name
    monitor: str | None = None  # the metric the best checkpoint is chosen by (callbacks.MonitoredCheckpoint)
    monitor_mode: Literal["min", "max"] = "min"
    callbacks: tuple[str, ...] = ()  # class paths added to every run unless the trainer has one of that class
    predict_data: str | None = None  # the DataModule that reads new inputs for ``predict --ckpt_path`` alone
    # How callbacks.WritePredictions writes predict's outputs: "csv", or None for CSV when all are tensors and JSON
    # lines otherwise (generated text); the outputs named in ``prediction_arrays`` go to .npy files, a row an example.
    predictions: Literal["csv"] | None = None
    prediction_arrays: tuple[str, ...] = ()
    # The rule the net's sizes follow from the data by (``zoo.app.sizes.RULES``), set before the net is built;
    # None: none do.
    sizes: Literal["vocabulary", "classes", "spaces"] | None = None
    # The rule that builds the net's config from a pretrained source given as ``init_weights`` (a model folder, an
    # SB3 zip: ``zoo.app.pretrained.SOURCES``; its architecture is the source's, not a hand-written net block); None:
    # the config's.
    net_from_folder: Literal["gpt", "diffusers", "clip", "sb3"] | None = None
    # The class of ``zoo.tracking.serving`` a logged model answers raw inputs through; None: it is not served.
    interface: str | None = None


RL = dict(
    name="rl", monitor="val/return", monitor_mode="max", sizes="spaces", net_from_folder="sb3", interface="Policy"
)

FAMILIES: dict[str, Family] = {
    "zoo.gpt.CausalLMModule": Family(
        "gpt",
        "val/loss",
        callbacks=("callbacks.LogTextSamples",),
        sizes="vocabulary",
        net_from_folder="gpt",
        interface="TextGenerator",
    ),
    # GRPO: the best checkpoint is the one that answers most held-out prompts right
    "zoo.gpt.GRPOModule": Family(
        "gpt",
        "val/accuracy",
        "max",
        callbacks=("callbacks.LogCompletions",),
        sizes="vocabulary",
        net_from_folder="gpt",
        interface="TextGenerator",
    ),
    "zoo.diffusion.DiffusionModule": Family(
        "diffusion",
        "val/loss",
        callbacks=("callbacks.LogImageSamples",),
        net_from_folder="diffusers",
        interface="ImageGenerator",
    ),
    # latent diffusion's autoencoder, trained for DiffusionModule(autoencoder_weights=<its checkpoint>)
    "zoo.diffusion.AutoencoderModule": Family("autoencoder", "val/loss"),
    # recall@1: the mean of the two retrieval directions, defined for any caption data
    "zoo.clip.ContrastiveModule": Family(
        "clip",
        "val/recall_1",
        "max",
        predict_data="datamodules.ZeroShotDataModule",
        predictions="csv",
        prediction_arrays=("embedding",),
        net_from_folder="clip",
        interface="Embedder",
    ),
    "zoo.cnn.ClassifierModule": Family(
        "cnn",
        "val/acc",
        "max",
        callbacks=("callbacks.LogConfusionMatrix",),
        predict_data="datamodules.ImageFilesDataModule",
        predictions="csv",
        sizes="classes",
        interface="ImageClassifier",
    ),
    "zoo.rl.PPOModule": Family(**RL),
    "zoo.rl.A2CModule": Family(**RL),
    "zoo.rl.IMPALAModule": Family(**RL),
    "zoo.rl.SACModule": Family(**RL),
    "zoo.rl.TD3Module": Family(**RL),
}
UNLISTED = Family("unknown")


def family_of(module: object) -> Family:
    """The row of ``module`` (an instance or a class): its own class's, else the nearest base class's listed."""
    cls = module if isinstance(module, type) else type(module)
    for base in cls.__mro__:
        # listed by the package that exports it, any level above its file (zoo.gpt.tune.grpo's is zoo.gpt.GRPOModule)
        parts = base.__module__.split(".")
        for path in (".".join([*parts[:n], base.__qualname__]) for n in range(len(parts), 0, -1)):
            if path in FAMILIES:
                return FAMILIES[path]
    return UNLISTED
