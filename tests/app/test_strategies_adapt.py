"""LoRA under DDP and FSDP2 on 2 CPU processes: the adapters train, in step on both ranks (PEFT's layers go into the
net, not the LightningModule, whose FSDP2 device mesh PEFT would take for a tensor-parallel plan)."""

from __future__ import annotations

import pytest
from conftest import CONFIGS
from test_strategies import _equal_ranks, _run

pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # two processes per strategy


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_lora_fits_on_two_ranks_in_step(strategy, embedded_store):
    _run(
        "--config",
        str(CONFIGS / "trainer" / f"{strategy}.yaml"),
        "--model.init_args.adapt.lora.r=4",
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        config=str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
    )
    r0, _ = _equal_ranks()
    state = r0["state"]
    assert all(state[k].abs().sum() > 0 for k in state if "lora_B" in k)
    assert any("lora_B" in k for k in state) and any(".base_layer." in k for k in state)
