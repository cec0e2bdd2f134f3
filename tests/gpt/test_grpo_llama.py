"""GRPO from an imported Llama-style folder with LoRA through cli.py (configs/gpt/grpo_arithmetic_llama.yaml): a tiny
folder as bench/assistant.py writes it (random weights, a BPE trained on the task's text, a Llama-3-style chat
template), a few steps, finishing and registering its model."""

from __future__ import annotations

import pytest

from zoo.gpt import GRPOModule

pytest.importorskip("peft")


@pytest.mark.slow  # tens of seconds: transformers writes the folder, a cli.py fit into MLflow and its registered model
def test_the_grpo_config_runs_from_a_llama_folder_with_lora_and_registers(tmp_path, monkeypatch):
    from conftest import CONFIGS, fit_in_folder

    from bench import assistant

    task = {"digits": 1, "terms": 2, "ops": "+-", "train": 32, "pairs": 0, "test": 4, "seed": 0}
    monkeypatch.setattr(assistant, "TASK", task)
    monkeypatch.setattr(assistant, "SIZE", {"layers": 1, "width": 32})
    folder = assistant.build_llama(tmp_path, 0)  # the task written into tmp_path/data/arithmetic, as the fit reads
    fitted = fit_in_folder(
        tmp_path,
        "--config",
        str(CONFIGS / "gpt" / "grpo_arithmetic_llama.yaml"),
        f"--model.init_args.init_weights={folder}",
        *(f"--data.init_args.generate.{k}={v}" for k, v in task.items()),
        "--model.init_args.group_size=2",
        "--model.init_args.generation.max_new_tokens=6",
        "--model.init_args.loss.beta=0.1",  # the KL to the base with the adapters off
        "--data.init_args.batch_size=2",
        "--data.init_args.val_batch_size=4",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.logger.init_args.registered_model_name=grpo-llama",
    )
    module, metrics = fitted.model, fitted.trainer.callback_metrics
    assert (
        isinstance(module, GRPOModule)
        and module.net.vocab_size == module.tokenizer.vocab_size
        and module._reference.copy is None
    )
    assert any("lora_" in name for name, p in module.net.named_parameters() if p.requires_grad)
    assert {"train/reward", "train/kl", "val/accuracy"} <= set(metrics) and fitted.trainer.global_step == 2
    from mlflow.tracking import MlflowClient

    versions = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_model_versions("name='grpo-llama'")
    assert len(versions) == 1
