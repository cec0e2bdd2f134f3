"""Every net with dropout > 0 gives bitwise-identical outputs twice in eval mode, and different ones in train mode
(so the check can fail); every family class that takes a dropout is built here, so a new one must join."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from functools import partial

import pytest
import torch
from torch import nn

from zoo.cnn import ConvNet
from zoo.diffusion.unet import UNet
from zoo.gpt import GPT, MHA, MLA, MoE, SwiGLU
from zoo.gpt.mlp import GeGLU

GPT_ARGS = dict(vocab_size=50, block_size=16, n_layer=2, n_embd=32, n_head=4, dropout=0.3)
MLA_ARGS = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
NETS = {
    "gpt_mha": lambda: (GPT(**GPT_ARGS), (torch.randint(0, 50, (2, 12)),)),
    "gpt_mla_swiglu": lambda: (
        GPT(**GPT_ARGS, attention=partial(MLA, **MLA_ARGS), mlp=SwiGLU, position="rope", bias=False),
        (torch.randint(0, 50, (2, 12)),),
    ),
    "gpt_moe": lambda: (
        GPT(**GPT_ARGS, mlp=partial(MoE, n_routed_experts=4, num_experts_per_tok=2), bias=False, first_k_dense=1),
        (torch.randint(0, 50, (2, 12)),),
    ),
    "gpt_gemma": lambda: (  # GeGLU, soft-capped attention (written out, its own dropout), sandwich norms, windows
        GPT(
            **GPT_ARGS,
            attention=partial(MHA, softcap=20.0),
            mlp=GeGLU,
            position="rope",
            bias=False,
            sandwich_norm=True,
            sliding_window=4,
            logit_softcap=30.0,
        ),
        (torch.randint(0, 50, (2, 12)),),
    ),
    "unet": lambda: (
        UNet(
            in_channels=3,
            image_size=8,
            base_channels=16,
            channel_mults=(1, 2),
            num_res_blocks=1,
            attention_resolutions=(4,),
            dropout=0.3,
            num_classes=3,
            norm_groups=8,
        ),
        (torch.randn(2, 3, 8, 8), torch.tensor([3, 7]), torch.tensor([0, 2])),
    ),  # fmt: skip
    "convnet": lambda: (
        ConvNet(num_classes=4, in_channels=1, width=8, depth=2, dropout=0.3),
        (torch.randn(2, 1, 8, 8),),
    ),
}
# The family classes these nets build that take a dropout argument (the GPT's blocks, attentions and MLPs, the
# UNet's levels and residual blocks). CLIP's towers, DiT and the RL nets take none.
COVERED = {"GPT", "Block", "MHA", "MLA", "GeluMLP", "SwiGLU", "GeGLU", "MoE", "UNet", "Level", "ResBlock", "ConvNet"}


@pytest.mark.parametrize("name", NETS)
def test_two_eval_forwards_are_bitwise_equal_and_train_forwards_differ(name):
    torch.manual_seed(0)
    net, inputs = NETS[name]()
    with torch.no_grad():  # zero-initialised outputs (the UNet's last conv, as DDPM's) would hide any difference
        for p in net.parameters():
            if not p.any():
                p.normal_(0, 0.1)
    assert any(isinstance(m, nn.Dropout) and m.p > 0 for m in net.modules()) or name == "convnet"
    with torch.no_grad():
        net.eval()
        assert torch.equal(net(*inputs), net(*inputs))
        net.train()
        assert not torch.equal(net(*inputs), net(*inputs)), "dropout does nothing in train mode: the check is void"


def test_every_family_class_taking_a_dropout_is_covered():
    taking = set()
    for package in ("zoo.gpt", "zoo.diffusion", "zoo.clip", "zoo.cnn", "zoo.rl", "zoo.nn"):
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__, f"{package}."):
            module = importlib.import_module(info.name)
            for cls in vars(module).values():
                if inspect.isclass(cls) and issubclass(cls, nn.Module) and cls.__module__ == info.name:
                    if "dropout" in inspect.signature(cls.__init__).parameters:
                        taking.add(cls.__name__)
    assert taking <= COVERED, f"classes taking a dropout that this test builds nowhere: {taking - COVERED}"
    assert {"GPT", "UNet", "ConvNet", "MoE"} <= taking
