"""The optimizer written once: every AdamW module takes one AdamWCosine and splits its net's parameters in one place."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS

from zoo.train.optim import AdamWCosine, param_groups

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


def test_adamw_is_fused_on_the_cpu_and_steps_as_the_reference_adamw():
    # The fused kernel is 4.4x faster per step on a CPU (zoo/train/optim.py); it must take the same steps.
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    ref = copy.deepcopy(net)
    opt = AdamWCosine(lr=0.01, weight_decay=0.1).configure(net, None)["optimizer"]
    assert opt.defaults["fused"] is True
    ref_opt = torch.optim.AdamW(param_groups(ref, 0.1), lr=0.01, foreach=False)
    for _ in range(5):
        x = torch.randn(4, 8)
        for model, o in ((net, opt), (ref, ref_opt)):
            o.zero_grad()
            model(x).square().mean().backward()
            o.step()
    for p, r in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
