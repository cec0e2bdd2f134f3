"""The CNN nets and loss against references written elsewhere, on tiny random weights.

ResNet: timm's ResNet (an independent implementation with torchvision's key layout) with the same weights,
every batch-norm affine and statistic randomised so no residual branch starts at zero: eval and train forward,
gradients and the running statistics a train step leaves. ConvNet: a functional forward from the state dict
(conv, batch norm, ReLU, max-pool, channel dropout, global average pool, linear) written from the description.
Cross-entropy with label smoothing: the closed form (Szegedy et al. 2016, eq. for q'). torchvision weights
into ``TorchvisionNet``: same outputs, or the same backbone under a new head.

Notation: B batch, C channels, H/W height/width, K classes.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from zoo.cnn import ConvNet, ResNet, TorchvisionNet
from zoo.cnn.module import classification_loss
from zoo.io.weights import load_weights

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.usefixtures("one_thread")  # small convolutions: a second thread only waits


def randomise_batch_norms(net: nn.Module, seed: int = 0) -> nn.Module:
    """Affine weights away from the zero residual init, statistics away from (0, 1): every branch counts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                for t, (lo, hi) in (
                    (m.weight, (0.5, 1.5)),
                    (m.bias, (-0.3, 0.3)),
                    (m.running_mean, (-0.2, 0.2)),
                    (m.running_var, (0.5, 2.0)),
                ):
                    t.copy_(torch.rand(t.shape, generator=g, dtype=t.dtype) * (hi - lo) + lo)
    return net


def timm_resnet(depth: int, stem: str, in_channels: int, num_classes: int) -> nn.Module:
    """timm's ResNet; the CIFAR stem of He et al. 2016 section 4.2 (3x3 stride-1 conv, no max-pool) put in by hand."""
    ref = timm.create_model(f"resnet{depth}", pretrained=False, in_chans=in_channels, num_classes=num_classes)
    if stem == "cifar":
        ref.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        ref.maxpool = nn.Identity()
    return ref


# (depth, stem, in_channels, K): the 1- and 2-channel stem convs are the zoo's own, not torchvision's
RESNETS = [(18, "cifar", 3, 10), (34, "imagenet", 1, 5), (50, "cifar", 2, 7)]


@pytest.mark.parametrize("depth,stem,in_channels,k", RESNETS)
def test_resnet_equals_timms_with_its_weights_in_eval_and_train_mode(tmp_path, depth, stem, in_channels, k):
    torch.manual_seed(depth)
    ref = randomise_batch_norms(timm_resnet(depth, stem, in_channels, k))
    torch.save(ref.state_dict(), tmp_path / "timm.pth")  # timm weights imported through the zoo's loader
    ours = load_weights(ResNet(depth, num_classes=k, in_channels=in_channels, stem=stem), tmp_path / "timm.pth")
    size = 8 if stem == "cifar" else 32  # 1x1 at layer4 either way: the CIFAR stem divides by 8, ImageNet's by 32
    x = torch.randn(3, in_channels, size, size)

    torch.testing.assert_close(ours.eval()(x), ref.eval()(x), rtol=1e-5, atol=1e-5)
    w = torch.randn(3, k)  # a fixed readout, so every logit's gradient differs
    out_ours, out_ref = ours.train()(x), ref.train()(x)
    torch.testing.assert_close(out_ours, out_ref, rtol=1e-5, atol=1e-5)
    (out_ours * w).sum().backward()
    (out_ref * w).sum().backward()
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, rtol=1e-4, atol=1e-5, msg=name)
    buffers = dict(ref.named_buffers())
    for name, b in ours.named_buffers():  # batch-norm running statistics moved alike
        torch.testing.assert_close(b, buffers[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("stem,size,layer1_side", [("cifar", 32, 32), ("imagenet", 64, 16)])
def test_resnet_stem_keeps_or_divides_the_resolution(stem, size, layer1_side):
    """CIFAR stem: layer1 sees the full image; ImageNet stem: stride-2 conv and stride-2 pool, a quarter."""
    net = ResNet(18, num_classes=3, stem=stem).eval()
    seen = []
    net.layer1.register_forward_hook(lambda m, i, o: seen.append(o.shape[-2:]))
    net(torch.randn(1, 3, size, size))
    assert tuple(seen[0]) == (layer1_side, layer1_side)


@pytest.mark.parametrize("depth,last_bn", [(18, "bn2"), (50, "bn3")])
def test_resnet_init_zeroes_each_residual_branch_and_scales_the_stem(depth, last_bn):
    """Goyal et al. 2017: the last BN of each block starts at zero, so each block starts as its shortcut; the
    stem conv is He-initialised (fan-out, ReLU gain), std sqrt(2 / (64 * k * k))."""
    torch.manual_seed(0)
    net = ResNet(depth, num_classes=3, stem="cifar")
    blocks = [b for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for b in layer]
    assert all(torch.all(getattr(b, last_bn).weight == 0) for b in blocks)
    assert float(net.conv1.weight.detach().std()) == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.08)
    plain = ResNet(depth, num_classes=3, stem="cifar", zero_init_residual=False)
    assert all(torch.all(getattr(b, last_bn).weight == 1) for b in (plain.layer1[0], plain.layer4[-1]))
    block = net.layer1[1].eval()  # no downsampling: the block is relu(x + 0)
    x = torch.randn(2, block.conv1.in_channels, 4, 4)
    torch.testing.assert_close(block(x), x.relu())


def convnet_reference(state: dict, x: torch.Tensor, depth: int, training: bool, dropout: float = 0.0) -> torch.Tensor:
    """The ConvNet forward from its state dict: per stage two (3x3 conv, batch norm, ReLU), 2x2 max-pool, channel
    dropout; then the mean over H, W and a linear head. Running statistics in ``state`` update in place."""
    for i in range(depth):
        for conv, bn in ((0, 1), (3, 4)):
            x = F.conv2d(x, state[f"features.{i}.{conv}.weight"], padding=1)
            p = f"features.{i}.{bn}."
            x = F.batch_norm(
                x,
                state[p + "running_mean"],
                state[p + "running_var"],
                state[p + "weight"],
                state[p + "bias"],
                training=training,
                momentum=0.1,
                eps=1e-5,
            )
            x = F.relu(x)
        x = F.max_pool2d(x, 2)  # (B, C, H / 2, W / 2)
        if dropout > 0:
            x = F.dropout2d(x, dropout, training=training)
    return F.linear(x.mean(dim=(2, 3)), state["head.weight"], state["head.bias"])  # (B, K)


@pytest.mark.parametrize("training,dropout", [(False, 0.0), (True, 0.0), (True, 0.3), (False, 0.3)])
def test_convnet_equals_a_functional_forward(training, dropout):
    torch.manual_seed(0)
    net = randomise_batch_norms(ConvNet(num_classes=6, in_channels=3, width=4, depth=3, dropout=dropout)).double()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    torch.manual_seed(1)  # the same channel-dropout draws on both sides
    ours = net.train(training)(x)
    torch.manual_seed(1)
    ref = convnet_reference(state, x, depth=3, training=training, dropout=dropout)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    for name, b in net.state_dict().items():
        if "running" in name:
            torch.testing.assert_close(b, state[name], rtol=1e-10, atol=1e-12, msg=name)


def test_convnet_widths_double_per_stage_and_dropout_drops_whole_channels():
    net = ConvNet(num_classes=3, in_channels=2, width=5, depth=3, dropout=0.5)
    convs = [m for m in net.features.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(2, 5), (5, 5), (5, 10), (10, 10), (10, 20), (20, 20)]
    assert net.head.in_features == 20
    stage = net.features[0].train()
    out = stage(torch.randn(64, 2, 8, 8))  # (B, C, 4, 4): a channel map is dropped whole or kept whole
    dropped = (out == 0).flatten(2).all(-1)
    assert 0.3 < dropped.float().mean() < 0.7
    kept = stage.eval()(torch.randn(64, 2, 8, 8)).flatten(2).eq(0).all(-1)  # no dropout in eval mode
    assert kept.float().mean() < 0.1


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.35])
def test_classification_loss_is_the_label_smoothed_cross_entropy(eps):
    """q'(k) = (1 - eps) [k = y] + eps / K, loss = -sum_k q'(k) log p(k), averaged over the batch."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=g, dtype=torch.float64) * 3
    y = torch.tensor([0, 4, 2, 2, 1, 3])
    p = logits.exp() / logits.exp().sum(-1, keepdim=True)
    q = torch.full_like(p, eps / 5)
    q[torch.arange(6), y] += 1 - eps
    want = -(q * p.log()).sum(-1).mean()
    torch.testing.assert_close(classification_loss(logits, y, eps)["loss"], want, rtol=1e-12, atol=1e-12)


def test_torchvision_weights_give_torchvisions_outputs_or_its_backbone_under_a_new_head(tmp_path):
    torch.manual_seed(0)
    ref = randomise_batch_norms(torchvision.models.resnet18(num_classes=1000)).eval()
    torch.save(ref.state_dict(), tmp_path / "resnet18.pth")
    from safetensors.torch import save_file

    save_file(ref.state_dict(), tmp_path / "resnet18.safetensors")
    x = torch.randn(2, 3, 64, 64)
    for file in ("resnet18.pth", "resnet18.safetensors"):
        same = TorchvisionNet("resnet18", num_classes=1000, weights_path=str(tmp_path / file)).eval()
        torch.testing.assert_close(same(x), ref(x), rtol=1e-5, atol=1e-5)
    five = TorchvisionNet("resnet18", num_classes=5, weights_path=str(tmp_path / "resnet18.pth")).eval()
    assert five(x).shape == (2, 5) and five.num_classes == 5
    for key, value in ref.state_dict().items():
        if not key.startswith("fc."):
            torch.testing.assert_close(five.model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    backbone, ref_backbone = copy.deepcopy(five.model), copy.deepcopy(ref)
    backbone.fc = ref_backbone.fc = nn.Identity()
    torch.testing.assert_close(backbone(x), ref_backbone(x), rtol=1e-5, atol=1e-5)
