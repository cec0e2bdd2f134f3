"""Base -> SFT -> DPO, and SFT -> GRPO, through cli.py into one MLflow store, as docs/gpt-tune.md's "From a language
model to an assistant" runs it (a tiny net and a tiny generated task): each stage starts from its parent's registered
model, DPO and GRPO with the net that model stores (their configs write none), the report card printed after the DPO
fit has the three stages as columns, a task evaluation fills the row of its file, and the GRPO stage's card follows its
own lineage (base, sft, rl)."""

from __future__ import annotations

import re

import pytest
from conftest import CONFIGS, cli

# A small net for the stages whose configs state one (base, and sft: its config is also the from-scratch one); dpo
# and rl build the registered sft model's. One small task: the folder is written once (other settings would write it
# again).
NET = [f"--model.init_args.net.init_args.{k}={v}" for k, v in (("n_layer", 1), ("n_embd", 32), ("n_head", 2))]
TASK = [f"--data.init_args.generate.{k}={v}" for k, v in (("train", 64), ("pairs", 32), ("test", 8))]
STAGES = {
    "base": "arithmetic_base.yaml",
    "sft": "chat_arithmetic.yaml",
    "dpo": "dpo_tiny.yaml",
    "rl": "grpo_arithmetic.yaml",
}
PARENT = {"sft": "base", "dpo": "sft", "rl": "sft"}
SMALL_RL = [
    "--model.init_args.group_size=2",
    "--model.init_args.generation.max_new_tokens=8",
    "--data.init_args.batch_size=2",
]


@pytest.mark.slow
def test_base_sft_dpo_stages_report_one_card_and_a_task_evaluation_fills_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    models, cards, built = {}, {}, {}
    for stage, config in STAGES.items():
        start = [f"--model.init_args.init_weights={models[PARENT[stage]]}"] if stage in PARENT else []
        c = cli(
            "fit", "--config", str(CONFIGS / "gpt" / config), *(NET if stage in ("base", "sft") else []), *TASK, *start,
            *(SMALL_RL if stage == "rl" else []),
            "--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.check_val_every_n_epoch=null",
            "--trainer.limit_val_batches=1", f"--trainer.logger.init_args.stage={stage}",
            f"--trainer.logger.init_args.registered_model_name=arith-{stage}",
        )  # fmt: skip
        printed = capsys.readouterr().out
        models[stage] = re.findall(r"= (models:/arith-\w+/\d+)", printed)[-1]
        built[stage] = c.model.net
        cards[stage] = printed[printed.index("Report card") :].splitlines()
    assert models["dpo"] == "models:/arith-dpo/1" and models["rl"] == "models:/arith-rl/1"
    for stage in ("dpo", "rl"):  # the sft model's net (1 x 32, exact GeLU), not GPT's defaults (4 x 256, tanh)
        net = built[stage]
        assert (len(net.blocks), net.n_embd, net.block_size, net.blocks[0].mlp.approximate) == (1, 32, 96, "none")
    assert cards["rl"][1] == "| metric | base | sft | rl |", cards["rl"]
    assert any(line.startswith("| val/accuracy | - | - | ") for line in cards["rl"]), cards["rl"]
    card, parent = cards["dpo"], models["dpo"]
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
    row = next(line for line in card if line.startswith("| test/exact_match on data/arithmetic/test.jsonl |"))
    assert re.fullmatch(r"\| test/exact_match on data/arithmetic/test.jsonl \| - \| - \| [\d.]+ \|", row), row
