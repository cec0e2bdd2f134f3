"""GPT behaviour that only shows through use: what generate samples, that it decodes in eval mode whatever mode the
net is in, and what checkpointing saves.

Sampling is checked through ``generate`` itself (one new token for many copies of one prompt), against
a distribution computed here by hand from the net's logits: softmax(logits / T), renormalised over the
top-k ids or over the smallest most-likely set whose mass reaches top_p (Holtzman et al. 2020).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from zoo.gpt import GPT, MHA, CausalLMModule, RMSNorm, SwiGLU, generate

V, N = 8, 6000


def tiny_net(**kw) -> GPT:
    torch.manual_seed(0)
    net = GPT(
        vocab_size=V,
        block_size=16,
        n_layer=2,
        n_embd=32,
        n_head=4,
        norm=RMSNorm,
        mlp=SwiGLU,
        position="rope",
        attention=partial(MHA, n_kv_head=2),
        **kw,
    )
    with torch.no_grad():  # a spread-out next-token distribution, so temperature and filters matter
        net.lm_head.weight.mul_(4.0)
    return net.eval()


def expected(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """The specified sampling distribution, computed step by step here, independently of generate.py."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    keep = torch.ones(V, dtype=torch.bool)
    order = torch.argsort(p, descending=True)
    if top_k is not None:
        keep[order[top_k:]] = False
    if top_p is not None:  # applied after top-k, to the renormalised survivors (as transformers' warpers)
        p = torch.where(keep, p, 0.0) / p[keep].sum()
        mass = 0.0
        for i in order.tolist():
            keep[i] &= mass < top_p  # keep until the mass before this id reaches top_p
            mass += float(p[i])
    p = torch.where(keep, p, 0.0)
    return p / p.sum()


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, None, None), (0.5, None, None), (2.0, None, None), (1.0, 3, None), (1.0, None, 0.6), (0.8, 5, 0.9)],
)
def test_generated_token_frequencies_follow_the_specified_distribution(temperature, top_k, top_p):
    net = tiny_net()
    prompt = torch.tensor([3, 1, 4, 1, 5])
    with torch.no_grad():
        logits = net(prompt[None])[0, -1]
    p = expected(logits, temperature, top_k, top_p)
    assert p.max() < 0.9 and (p > 0.02).sum() >= 2, "the test needs a spread-out distribution"
    g = torch.Generator().manual_seed(0)
    draws = torch.cat(
        generate(net, [prompt] * N, max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, generator=g)
    )
    freq = torch.bincount(draws, minlength=V).double() / N
    # 5 standard errors per id, plus exact zeros where the filters remove an id.
    bound = 5 * (p * (1 - p) / N).sqrt() + 1e-3
    assert ((freq - p).abs() <= bound).all(), f"freq {freq.tolist()} vs p {p.tolist()}"
    assert (freq[p == 0] == 0).all()


@pytest.mark.parametrize("speculative", [False, True])
def test_decoding_a_net_in_train_mode_with_dropout_is_deterministic_and_leaves_its_mode_as_found(speculative):
    torch.manual_seed(0)
    module = CausalLMModule(tiny_net(dropout=0.5))
    draft = tiny_net(dropout=0.5, tie_embeddings=False) if speculative else None  # another head: it disagrees
    nets = [module, draft] if speculative else [module]
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]

    def decoded() -> tuple[list[list[int]], list[list[int]]]:
        greedy = module.generate(prompts, 12, temperature=0, draft=draft, num_draft_tokens=2)
        sampled = module.generate(prompts, 12, seed=0, draft=draft, num_draft_tokens=2)
        return [g.tolist() for g in greedy], [s.tolist() for s in sampled]

    for m in nets:
        m.eval()
    expected = decoded()  # dropout off
    for mode in (True, False, True):
        for m in nets:
            m.train(mode)
        assert decoded() == expected, f"decoding a net in {'train' if mode else 'eval'} mode"
        assert all(sub.training == mode for m in nets for sub in m.modules()), "every submodule's mode kept"
    net = module.net
    with pytest.raises(IndexError):  # a token past the vocabulary fails in the first forward, after the switch
        generate(net, [torch.tensor([V + 1])], 3, temperature=0)
    assert all(sub.training for sub in net.modules()), "a decode that fails leaves the mode as found too"


def saved_bytes(net: GPT, x: torch.Tensor) -> int:
    """Bytes of tensors autograd keeps for backward during one training forward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    net.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x).sum().backward()
    return total


def test_activation_checkpointing_saves_less_for_backward():
    x = torch.randint(0, V, (4, 16))
    plain = saved_bytes(GPT(vocab_size=V, block_size=16, n_layer=4, n_embd=64, n_head=4), x)
    ckpt = saved_bytes(
        GPT(vocab_size=V, block_size=16, n_layer=4, n_embd=64, n_head=4, activation_checkpointing=True), x
    )
    # What the blocks keep (attention, MLP activations) is recomputed; only block inputs stay.
    assert ckpt < 0.5 * plain, (ckpt, plain)
