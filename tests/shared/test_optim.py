"""The optimizer written once: every AdamW module takes one AdamWCosine and splits its net's parameters in one place."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS

from zoo.errors import InputError
from zoo.train.optim import AdamOrRMSprop, AdamWCosine, MuonSettings, param_groups

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


# -- the RL agents' AdamOrRMSprop ------------------------------------------------------------------------------


def _steps(opt: torch.optim.Optimizer, net: torch.nn.Module, x: torch.Tensor) -> None:
    for _ in range(3):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()


@pytest.mark.parametrize(
    ("settings", "reference"),
    [
        (AdamOrRMSprop("rmsprop", lr=0.01, alpha=0.9, eps=0.01), (torch.optim.RMSprop, {"alpha": 0.9, "eps": 0.01})),
        (AdamOrRMSprop(lr=0.01, betas=(0.8, 0.9), eps=1e-5), (torch.optim.Adam, {"betas": (0.8, 0.9), "eps": 1e-5})),
    ],
)
def test_adam_or_rmsprop_steps_a_list_of_tensors_as_torchs_own_optimizer(settings, reference):
    torch.manual_seed(0)
    net, x = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)), torch.randn(8, 3)
    ref, start = copy.deepcopy(net), copy.deepcopy(net)
    opt = settings.build(list(net.parameters()))
    assert len(opt.param_groups) == 1  # one group: the agents' checkpoints hold their optimizer state so
    cls, kwargs = reference
    _steps(opt, net, x)
    _steps(cls(ref.parameters(), lr=0.01, **kwargs), ref, x)
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert not torch.equal(net[0].weight, start[0].weight)  # the steps moved the weights


@pytest.mark.parametrize("algorithm", ["adam", "rmsprop"])
def test_adam_or_rmsprop_splits_a_net_by_the_decay_rule_and_a_list_takes_no_decay(algorithm):
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    opt = AdamOrRMSprop(algorithm, weight_decay=0.1).build(net)
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay == {id(p): 0.1 if p.ndim >= 2 else 0.0 for p in net.parameters()}
    with pytest.raises(InputError, match="weight_decay and optimizer.muon need a net"):
        AdamOrRMSprop(algorithm, weight_decay=0.1).build(list(net.parameters()))


def test_adam_or_rmsprop_settings_are_checked_when_read_and_rebuilt_from_a_checkpoints_dict():
    with pytest.raises(InputError, match=r"muon=.* must be null with rmsprop"):
        AdamOrRMSprop("rmsprop", muon=MuonSettings())
    with pytest.raises(InputError, match=r"optimizer alpha=1.0 must be in \[0, 1\): set model.init_args.optimizer"):
        AdamOrRMSprop("rmsprop", alpha=1.0)
    stored = dataclasses.asdict(AdamOrRMSprop(lr=0.1, muon=MuonSettings(lr=0.03)))  # as save_hparams keeps it
    assert AdamOrRMSprop.of(stored) == AdamOrRMSprop(lr=0.1, muon=MuonSettings(lr=0.03))
