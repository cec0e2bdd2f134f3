"""TimmNet: timm models by name, built by timm, with timm's weights from a local file: logits equal timm's own model's
with the same weights (a ViT and a ResNet), a new head for other classes, names timm would resolve remotely refused,
and one line naming the extra when timm is missing."""

from __future__ import annotations

import sys

import pytest
import torch

from zoo.cnn import TimmNet
from zoo.errors import InputError
from zoo.train.optim import param_groups

timm = pytest.importorskip("timm")

# name -> (TimmNet's arguments beyond name and classes, input size): a ViT at 32 x 32 (4 patches) and a ResNet.
MODELS = {"vit_tiny_patch16_224": ({"img_size": 32}, 32), "resnet18": ({}, 32)}


def timm_reference(name: str, num_classes: int, **kwargs) -> torch.nn.Module:
    """timm's model with every tensor random (norms' statistics too), as a published checkpoint's would be."""
    torch.manual_seed(0)
    ref = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    with torch.no_grad():
        for key, t in ref.state_dict().items():
            if key.endswith("running_var"):
                t.uniform_(0.5, 2.0)
            elif t.is_floating_point():  # norms' scales around 1, everything else around 0
                t.copy_(torch.randn_like(t) * 0.1 + (key.endswith("weight") and t.ndim == 1))
    return ref.eval()


@pytest.mark.parametrize("name", MODELS)
def test_timm_weights_give_timms_logits(tmp_path, name):
    kwargs, size = MODELS[name]
    ref = timm_reference(name, 7, **kwargs)
    torch.save(ref.state_dict(), tmp_path / "weights.pth")
    ours = TimmNet(name, num_classes=7, weights_path=str(tmp_path / "weights.pth"), **kwargs).eval()
    x = torch.randn(3, 3, size, size)
    with torch.no_grad():
        want = ref(x)
        torch.testing.assert_close(ours(x), want, rtol=0, atol=1e-6)
    assert want.std() > 0.1  # not a constant: random weights reach the logits


@pytest.mark.parametrize("name", MODELS)
def test_weights_for_other_classes_keep_the_backbone_under_a_new_head(tmp_path, name, caplog):
    kwargs, size = MODELS[name]
    ref = timm_reference(name, 1000, **kwargs)
    torch.save(ref.state_dict(), tmp_path / "weights.pth")
    ours = TimmNet(name, num_classes=5, weights_path=str(tmp_path / "weights.pth"), **kwargs).eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(ours.model.forward_features(x), ref.forward_features(x), rtol=0, atol=1e-6)
        assert ours(x).shape == (2, 5)


def test_a_weights_file_with_a_tensor_too_many_is_refused_naming_it(tmp_path):
    ref = timm_reference("resnet18", 5)
    torch.save({**ref.state_dict(), "extra.weight": torch.ones(2)}, tmp_path / "weights.pth")
    with pytest.raises(ValueError, match=r"extra\.weight: not in model"):
        TimmNet("resnet18", num_classes=5, weights_path=str(tmp_path / "weights.pth"))


@pytest.mark.parametrize("name", ["hf-hub:someone/model", "local-dir:/tmp/x", "no_such_net"])
def test_a_name_timm_would_resolve_from_outside_or_does_not_know_is_refused(name):
    with pytest.raises(InputError, match="not an architecture timm registers"):
        TimmNet(name, num_classes=3)


def test_without_timm_it_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    with pytest.raises(
        InputError, match=r'TimmNet needs timm, which is not installed: pip install -c constraints.txt -e "\.\[timm\]"'
    ):
        TimmNet("resnet18", num_classes=3)


def test_timms_preprocessing_and_no_decay_names_come_along():
    net = TimmNet("vit_tiny_patch16_224", num_classes=3, img_size=32)
    pre = net.preprocessing()
    assert pre["input_size"] == (3, 32, 32) and pre["interpolation"] == "bicubic" and len(pre["mean"]) == 3
    decay, no_decay = param_groups(net, 0.1)
    names = {id(p): n for n, p in net.named_parameters()}
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert {"model.pos_embed", "model.cls_token"} <= skipped
    assert all(p.ndim >= 2 for p in decay["params"]) and net.io_layers()[-1] == "model.head"


@pytest.mark.parametrize(
    ("name", "stem"), [("resnet18", "model.conv1"), ("vit_tiny_patch16_224", "model.patch_embed.proj")]
)
def test_the_stem_and_the_head_are_io_layers_that_muon_leaves_to_adamw(name, stem):
    from zoo.train.optim import muon_param_groups

    net = TimmNet(name, num_classes=3, **MODELS[name][0])
    assert net.io_layers() == (stem, "model.head" if name.startswith("vit") else "model.fc")
    muon, adamw = muon_param_groups(net, 0.1)
    to_muon = {id(p) for g in muon for p in g["params"]}
    for layer in net.io_layers():
        assert not to_muon & {id(p) for p in net.get_submodule(layer).parameters()}, layer
    assert to_muon  # the layers between


def test_the_timm_vit_config_fits_through_the_cli_and_builds_the_net_timm_builds():
    from conftest import CONFIGS, cli

    c = cli("fit", "--config", str(CONFIGS / "cnn" / "timm_vit_shapes.yaml"), *FAST)
    net = c.model.net
    assert isinstance(net.model, timm.models.VisionTransformer) and net.num_classes == 6
    assert torch.isfinite(c.trainer.callback_metrics["test/loss"])


FAST = ["--trainer.fast_dev_run=2", "--trainer.enable_progress_bar=false"]
