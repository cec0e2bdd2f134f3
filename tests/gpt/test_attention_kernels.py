"""Every attention path of the configs' nets runs on a fused SDPA kernel (flash or memory-efficient).

With SDPA restricted to those backends, an input layout they cannot take (e.g. heads strided along the
head dimension, as the UNet's once were) raises "No available kernel" instead of silently falling back
to the math kernel, which materialises the T x T scores. On a CPU the flash kernel exists for fp32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import CONFIGS
from jsonargparse import ArgumentParser
from torch.nn.attention import SDPBackend, sdpa_kernel

from zoo.gpt.generate import generate
from zoo.nn.attention import SelfAttention

pytestmark = pytest.mark.usefixtures("one_thread")
FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def config_net(path: str) -> tuple[torch.nn.Module, dict]:
    """The net of a config file, built by jsonargparse as the CLI builds it (injected classes included)."""
    torch.manual_seed(0)
    config = yaml.safe_load((CONFIGS / path).read_text())
    parser = ArgumentParser()
    parser.add_argument("--net", type=torch.nn.Module)
    net = config["model"]["init_args"]["net"]
    if net["class_path"] == "zoo.gpt.GPT":  # a GPT config leaves the vocabulary to the tokenizer (cli.py sizes it)
        net["init_args"].setdefault("vocab_size", 257)
    cfg = parser.parse_object({"net": net})
    return parser.instantiate(cfg).net, config


def run_denoiser(net, config: dict) -> None:
    s, c = net.image_size, net.in_channels
    y = torch.tensor([0, 1]) if net.num_classes else None
    net(torch.randn(2, c, s, s), torch.tensor([3, 700]), y).square().mean().backward()
    with torch.no_grad():  # sampling: the UNet's channels-last activations
        net(torch.randn(2, c, s, s), torch.tensor([3, 700]), y)


def run_clip(net, config: dict) -> None:
    text, s = net.text_encoder, config["data"]["init_args"]["image_size"]
    ids = torch.randint(0, text.vocab_size, (2, text.context_length))
    out = net(torch.randn(2, 3, s, s), ids)
    (out["image_features"] @ out["text_features"].T).sum().backward()


def run_gpt(net, config: dict) -> None:
    t = min(net.block_size, 64)
    net(torch.randint(0, net.vocab_size, (2, t))).logsumexp(-1).mean().backward()
    # Decoding: a prefill over the shortest prompt, one token at a time with a cache after it (the longer
    # prompt's tail included), and the masked multi-token step that a cache with new tokens takes.
    prompts = [torch.randint(0, net.vocab_size, (n,)) for n in (3, 6)]
    generate(net, prompts, max_new_tokens=4)
    generate(net, prompts, max_new_tokens=2, use_cache=False)


CASES = {
    "diffusion/tiny.yaml": run_denoiser,
    "diffusion/ddpm_unet_shapes.yaml": run_denoiser,
    "diffusion/dit_tiny_shapes16.yaml": run_denoiser,
    "clip/tiny.yaml": run_clip,
    "clip/vit_shapes.yaml": run_clip,
    "clip/convnet_shapes.yaml": run_clip,
    "gpt/gpt_tiny.yaml": run_gpt,
    "gpt/mla_shakespeare.yaml": run_gpt,
}


@pytest.mark.parametrize("config", CASES)
def test_config_nets_attend_with_a_fused_kernel(config):
    net, cfg = config_net(config)
    with sdpa_kernel(FUSED):
        CASES[config](net, cfg)


def test_strided_heads_are_refused_by_the_fused_kernels():
    # The guard itself: the UNet's old layout, heads taken from (B, 3C, HW) with d strided, finds no kernel.
    qkv = torch.randn(2, 3, 1, 16, 64)  # (B, 3, h, d, HW)
    q, k, v = qkv.transpose(-1, -2).unbind(1)  # (B, h, HW, d), stride 64 along d
    with sdpa_kernel(FUSED), pytest.raises(RuntimeError, match="No available kernel"), pytest.warns(UserWarning) as why:
        F.scaled_dot_product_attention(q, k, v)
    assert any("require the last dimension of the input to have stride 1" in str(w.message) for w in why), why.list


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_equals_per_head_softmax_attention(causal):
    torch.manual_seed(0)
    attn = SelfAttention(12, 3, causal=causal)
    x = torch.randn(2, 5, 12)
    q, k, v = attn.qkv(x).split(12, dim=-1)
    outs = []
    for h in range(3):  # written out per head from Vaswani et al.'s definition
        sl = slice(4 * h, 4 * h + 4)
        scores = q[..., sl] @ k[..., sl].transpose(-1, -2) / 2.0  # sqrt(d) = 2
        if causal:
            scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(scores.softmax(-1) @ v[..., sl])
    torch.testing.assert_close(attn(x), attn.proj(torch.cat(outs, dim=-1)))
