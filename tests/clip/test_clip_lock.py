"""Locked towers (LiT): the locked tower's weights and normalisation statistics stay as loaded through a real
fit, the other tower trains."""

from __future__ import annotations

import pytest
import torch
from conftest import CONFIGS

TINY = str(CONFIGS / "clip" / "tiny.yaml")
CONV_TOWER = (
    '--model.init_args.net.init_args.image_encoder={"class_path": "zoo.cnn.ConvNet", "init_args": '
    '{"num_classes": 32, "in_channels": 3, "width": 8, "depth": 2}}'
)


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _changed(before: dict, after: dict) -> set[str]:
    return {k for k in before if not torch.equal(before[k], after[k])}


@pytest.mark.parametrize("locked", ["image", "text"])
def test_a_locked_tower_keeps_its_weights_and_statistics_while_the_other_trains(locked):
    from cli import main

    c = main(
        [
            "--config",
            TINY,
            CONV_TOWER,
            f"--model.init_args.lock_{locked}=true",
            "--trainer.max_steps=4",
            "--trainer.limit_val_batches=1",
            "--trainer.val_check_interval=2",
            "--trainer.logger=false",
        ],
        run=False,
    )
    net = c.model.net
    image, text = _state(net.image_encoder), _state(net.text_encoder)
    assert any("running_mean" in k for k in image)  # the conv tower has batch-norm statistics to keep
    c.trainer.fit(c.model, datamodule=c.datamodule)
    image_changed, text_changed = _changed(image, _state(net.image_encoder)), _changed(text, _state(net.text_encoder))
    if locked == "image":
        assert not image_changed and text_changed
        assert not any(p.requires_grad for p in net.image_encoder.parameters())
    else:
        assert not text_changed and image_changed
        assert any("running_mean" in k for k in image_changed)  # the trained tower's statistics do move
