"""The zoo: model families as LightningModules, one CLI, every run tracked in MLflow."""

__version__ = "0.1.0"  # pyproject.toml's; recorded in every checkpoint (zoo.io.checkpoint.WeightsOnlyLoading)
