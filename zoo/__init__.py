"""The zoo: model families as LightningModules, one CLI, every run tracked in MLflow."""
