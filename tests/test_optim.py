"""The optimizer written once: every AdamW module takes one AdamWCosine and splits its net's parameters in one place."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS

from zoo.layers.optim import AdamWCosine

TINY = ["gpt/gpt_tiny.yaml", "clip/tiny.yaml", "diffusion/tiny.yaml", "cnn/convnet_digits.yaml"]


def _module(config: str, *args: str):
    from cli import main

    return main(["--config", str(CONFIGS / config), "--trainer.logger=false", *args], run=False).model


@pytest.mark.parametrize("config", TINY)
def test_every_module_builds_adamw_on_one_partition_of_its_net(config):
    m = _module(config, "--model.init_args.optimizer.weight_decay=0.3")
    m.trainer = SimpleNamespace(estimated_stepping_batches=10)
    out = m.configure_optimizers()
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    assert isinstance(opt, torch.optim.AdamW) and isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    settings = AdamWCosine.of(m.hparams.optimizer)
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    trainable = {id(p) for p in m.net.parameters() if p.requires_grad}
    assert len(seen) == len(set(seen)) and set(seen) == trainable  # each trainable parameter exactly once
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.3 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])  # norms and biases never decay
    assert opt.defaults["betas"] == tuple(settings.betas)


def test_a_partial_override_keeps_the_modules_other_defaults():
    gpt = AdamWCosine.of(_module("gpt/gpt_tiny.yaml", "--model.init_args.optimizer.lr=0.01").hparams.optimizer)
    assert (gpt.lr, gpt.weight_decay, tuple(gpt.betas), gpt.min_lr_ratio) == (0.01, 0.1, (0.9, 0.95), 0.1)
