"""The MLflow pyfunc of a zoo model, logged as code (MLflow's "models from code"), so no pickle.

``mlflow.pyfunc.load_model`` runs this file from the model's folder; it rebuilds the LightningModule from
its class path and hyperparameters (``module.json``) and loads ``weights.safetensors``. ``predict`` calls
the module's ``forward`` on the input array: logits for CNN and GPT, the net's outputs for the others.
"""

from __future__ import annotations

import json

import mlflow
import numpy as np
import torch
from mlflow.pyfunc import PythonModel


class ZooPyfunc(PythonModel):
    def load_context(self, context) -> None:
        from zoo.io.weights import load_file
        from zoo.tracking.models import build_module

        spec = json.loads(open(context.artifacts["module"]).read())
        self.module = build_module(spec)
        state_dict = load_file(context.artifacts["weights"])
        self.module.on_load_checkpoint({"state_dict": state_dict, **spec.get("checkpoint", {})})  # the tokenizer
        self.module.load_state_dict(state_dict)
        self.module.eval()

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:  # ids, images or observations
        x = torch.as_tensor(np.asarray(model_input))
        with torch.no_grad():
            return self.module(x).float().numpy()


mlflow.models.set_model(ZooPyfunc())
