"""LoRA on an imported Llama-style folder through ``cli.py fit``, a few lines of YAML: it trains the adapters alone,
and the model it registers is merged (plain weights, no adapter keys) and predicts as the adapted module does."""

from __future__ import annotations

import json

import pytest
from conftest import fit_in_folder
from test_gpt_pretrained import write_model

pytest.importorskip("peft")


@pytest.mark.slow  # ~10 s: the families' cli.py LoRA fit (tests/adapt) registers a merged model in the default suite
def test_lora_on_a_model_folder_fits_registers_merged_and_predicts(tmp_path, monkeypatch):
    folder = tmp_path / "llama"
    write_model(folder, "llama")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 200)
    config = tmp_path / "lora.yaml"
    model = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(folder), "adapt": {"lora": {"r": 4}}}
    data = {"path": str(tmp_path / "text.txt"), "tokenizer": "pretrained", "pretrained_dir": str(folder)}
    data |= {"block_size": 16, "batch_size": 2, "samples_per_epoch": 4, "val_samples": 2}
    config.write_text(
        json.dumps(
            {
                "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": model},
                "data": {"class_path": "datamodules.TextDataModule", "init_args": data},
                "trainer": {"max_steps": 2, "enable_progress_bar": False},
            }
        )
    )
    fitted = fit_in_folder(tmp_path, "--config", str(config))
    module = fitted.model
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)

    import mlflow

    import zoo.tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", fitted.tracking_uri)
    mlflow.set_tracking_uri(fitted.tracking_uri)
    run = fitted.trainer.logger.run_id
    loaded = zoo.tracking.load(f"runs:/{run}/model")
    weights = mlflow.artifacts.download_artifacts(f"runs:/{run}/model/artifacts/weights.safetensors")
    from safetensors.torch import load_file

    keys = set(load_file(weights))
    assert not any("lora_" in k or "base_layer" in k for k in keys)
    spec = json.loads(mlflow.artifacts.load_text(f"runs:/{run}/model/artifacts/module.json"))
    assert spec["init_args"]["adapt"] is None
    prompt = "the cat"
    ours = module.eval().generate([prompt], max_new_tokens=4, temperature=0.0)[0]
    assert loaded.predict([prompt], params={"max_new_tokens": 4, "temperature": 0.0})["completion"][0] == ours
