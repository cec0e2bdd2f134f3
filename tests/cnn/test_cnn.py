"""CNN family: every net trains a step, parameter groups and schedule are right, accuracy is real."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import CONFIGS, cli
from torch import nn

from zoo.cnn import ClassifierModule, ConvNet, ResNet, TorchvisionNet
from zoo.train.optim import WarmupCosine, param_groups

pytestmark = pytest.mark.usefixtures("one_thread")  # small convolutions: threads waiting on each other cost ~4x

NETS = {
    "convnet": lambda: ConvNet(num_classes=10, in_channels=1, width=8, depth=2),
    "resnet18-cifar": lambda: ResNet(18, num_classes=10, in_channels=3, stem="cifar"),
    "resnet34-imagenet-1ch": lambda: ResNet(34, num_classes=5, in_channels=1, stem="imagenet"),
    "resnet50-cifar": lambda: ResNet(50, num_classes=10, in_channels=3, stem="cifar"),
    "tv-mobilenet_v3_small": lambda: TorchvisionNet("mobilenet_v3_small", num_classes=10),
    "tv-vit": lambda: TorchvisionNet("vit_b_16", num_classes=3),
}


@pytest.mark.parametrize("name", NETS)
def test_every_net_forward_backward_finite(name):
    net = NETS[name]()
    c = net.conv1.in_channels if isinstance(net, ResNet) else (1 if name == "convnet" else 3)
    size = 224 if name == "tv-vit" else 32
    x = torch.randn(2, c, size, size)
    logits = net(x)
    assert logits.shape == (2, net.num_classes)
    logits.logsumexp(-1).mean().backward()
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", NETS)
def test_param_groups_partition_every_parameter(name):
    net = NETS[name]()
    decay, no_decay = param_groups(net, weight_decay=0.1)
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(ids) == len(set(ids)) == sum(1 for p in net.parameters() if p.requires_grad)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in net.named_parameters()}
    for p in decay["params"]:
        assert p.ndim >= 2 and "pos_embedding" not in names[id(p)] and "class_token" not in names[id(p)]
    norms = [m for m in net.modules() if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm))]
    no_decay_ids = {id(p) for p in no_decay["params"]}
    assert all(id(p) in no_decay_ids for m in norms for p in m.parameters())


def test_embeddings_do_not_decay():
    net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
    decay, no_decay = param_groups(net, 0.1)
    assert [p.shape for p in no_decay["params"]] == [(10, 4), (4,)]
    assert [p.shape for p in decay["params"]] == [(4, 4)]


def test_warmup_cosine_matches_closed_form():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = WarmupCosine(opt, warmup_steps=4, total_steps=20, min_lr_ratio=0.1)
    seen = []
    for _ in range(25):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for t, lr in enumerate(seen):
        want = (
            2.0 * (t + 1) / 4 if t < 4 else 2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (t - 4) / 16))))
        )
        assert lr == pytest.approx(want), t
    assert seen[-1] == pytest.approx(0.2)


def _switches_match_eager() -> None:
    torch.manual_seed(0)
    net = ConvNet(num_classes=10, in_channels=3, width=8, depth=2).eval()
    x = torch.randn(4, 3, 16, 16)
    ref = net(x)
    for kwargs in ({"channels_last": True}, {"compile": True}):
        module = ClassifierModule(net, **kwargs).eval()
        module.configure_model()
        assert (module._compiled is not None) == ("compile" in kwargs)
        torch.testing.assert_close(module(x), ref, rtol=1e-4, atol=1e-4)
        assert not any(k.startswith("_compiled") for k in module.state_dict())


def test_channels_last_and_compile_switches_match_eager(monkeypatch):
    """The switches' wiring, with torch.compile tracing through Dynamo and AOTAutograd but generating no kernels:
    inductor's C++ build takes a minute or more on a loaded CPU (the slow test below runs it)."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile_(model, **{**kw, "backend": "aot_eager"}))
    _switches_match_eager()


@pytest.mark.slow
def test_channels_last_and_compile_switches_match_eager_with_inductor():
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(3))
    except Exception as e:
        pytest.skip(f"torch.compile cannot build kernels on this machine: {e}")
    _switches_match_eager()


@pytest.mark.slow  # ~14 s of learning (CI's slow pass; CI's first command trains MNIST to its accuracy too)
def test_shapes_accuracy_far_above_chance():
    """A short CPU fit on the generated shapes: 6 classes, chance is 1/6."""
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "cnn" / "convnet_shapes.yaml"),
        "--trainer.max_epochs=1",
        "--data.init_args.num_train=4000",
    )
    acc = float(c.trainer.callback_metrics["test/acc"])
    assert acc > SHAPES_MIN_ACC, acc


SHAPES_MIN_ACC = 0.6


@pytest.mark.slow
def test_main_job_reaches_99_percent_on_mnist():
    """The README's main job, as written: >= 99% on the official 10k MNIST test set."""
    c = cli("fit", "--config", str(CONFIGS / "cnn" / "convnet_mnist.yaml"))
    assert float(c.trainer.callback_metrics["test/acc"]) >= 0.99
