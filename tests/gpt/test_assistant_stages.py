"""Base -> SFT -> DPO through cli.py into one MLflow store, as docs/gpt.md's "From a language model to an assistant"
runs it (tiny nets and a tiny generated task): each stage starts from the last one's registered model, and the report
card printed after the DPO fit has the three stages as columns, then a task evaluation fills its row."""

from __future__ import annotations

import re

import pytest
from conftest import CONFIGS, cli

# The same small net and task for every stage: a stage loads the last one's weights exactly, and the folder is
# written once (other settings would write it again).
NET = [f"--model.init_args.net.init_args.{k}={v}" for k, v in (("n_layer", 1), ("n_embd", 32), ("n_head", 2))]
TASK = [f"--data.init_args.generate.{k}={v}" for k, v in (("train", 64), ("pairs", 32), ("test", 8))]
STAGES = {"base": "arithmetic_base.yaml", "sft": "chat_arithmetic.yaml", "dpo": "dpo_tiny.yaml"}


@pytest.mark.slow
def test_base_sft_dpo_stages_report_one_card_and_a_task_evaluation_fills_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = None
    for stage, config in STAGES.items():
        start = [f"--model.init_args.init_weights={parent}"] if parent else []
        cli(
            "fit", "--config", str(CONFIGS / "gpt" / config), *NET, *TASK, *start,
            "--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.check_val_every_n_epoch=null",
            "--trainer.limit_val_batches=1", f"--trainer.logger.init_args.stage={stage}",
            f"--trainer.logger.init_args.registered_model_name=arith-{stage}",
        )  # fmt: skip
        printed = capsys.readouterr().out
        parent = re.findall(r"= (models:/arith-\w+/\d+)", printed)[-1]
    assert parent == "models:/arith-dpo/1"
    card = printed[printed.index("Report card") :].splitlines()
    assert card[1] == "| metric | base | sft | dpo |", card
    assert any(line.startswith("| val/loss | ") for line in card), card  # each stage's own validation
    cli(
        "test", "--ckpt_path", parent, "--data", "datamodules.TaskDataModule",
        "--data.init_args.path=data/arithmetic/test.jsonl", "--data.init_args.kind=exact_match",
        "--data.init_args.chat=true", "--data.init_args.max_new_tokens=8",
    )  # fmt: skip
    printed = capsys.readouterr().out
    card = printed[printed.index("Report card") :].splitlines()
    assert card[1] == "| metric | base | sft | dpo |", card
    row = next(line for line in card if line.startswith("| test/exact_match |"))
    assert re.fullmatch(r"\| test/exact_match \| - \| - \| [\d.]+ \|", row), row
