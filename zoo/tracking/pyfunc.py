"""The MLflow pyfunc of a zoo model, logged as code (MLflow's "models from code"), so no pickle.

``mlflow.pyfunc.load_model`` runs this file from the model's folder: ``ZooPyfunc`` (``zoo.tracking.serving``) rebuilds
the LightningModule from its class path and hyperparameters (``module.json``), loads ``weights.safetensors`` and
answers raw inputs through its family's prediction interface.
"""

from __future__ import annotations

import mlflow

from zoo.tracking.serving import ZooPyfunc

mlflow.models.set_model(ZooPyfunc())
