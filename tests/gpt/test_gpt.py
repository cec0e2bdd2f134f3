"""GPT net, objective and decoding: invariants, closed forms, and parity with Hugging Face's GPT-2."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from zoo.gpt import GPT, MHA, MLA, GeluMLP, RMSNorm, SwiGLU, generate
from zoo.gpt.generate import filter_logits, make_cache, sample_next
from zoo.gpt.losses import IGNORE_INDEX, causal_lm_loss
from zoo.train.optim import param_groups

V = 97
MLA_ARGS = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
VARIANTS = {
    "mha": dict(),
    "gqa": dict(attention=partial(MHA, n_kv_head=2), position="rope", norm=RMSNorm, mlp=SwiGLU, bias=False),
    "mqa": dict(attention=partial(MHA, n_kv_head=1), position="rope"),
    "mla": dict(attention=partial(MLA, **MLA_ARGS)),
    "mla_qlora": dict(attention=partial(MLA, **MLA_ARGS, q_lora_rank=12), position="rope", norm=RMSNorm),
}


def tiny(variant: str, **kw) -> GPT:
    torch.manual_seed(0)
    return GPT(**{**dict(vocab_size=V, block_size=48, n_layer=2, n_embd=32, n_head=4), **VARIANTS[variant], **kw})


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_at_init_is_log_vocab(variant):
    net = tiny(variant)
    x = torch.randint(0, V, (8, 32))
    loss = causal_lm_loss(net(x), torch.roll(x, -1, 1))["loss"]
    assert abs(loss.item() - math.log(V)) < 0.1


@pytest.mark.parametrize("variant", VARIANTS)
def test_future_tokens_do_not_change_past_logits(variant):
    net = tiny(variant).eval()
    x = torch.randint(0, V, (2, 24))
    y = x.clone()
    y[:, 12:] = torch.randint(0, V, (2, 12))
    a, b = net(x), net(y)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-6)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3  # and the future does change


@pytest.mark.parametrize("variant", ["mha", "mla"])
def test_one_batch_overfits(variant):
    net = tiny(variant)
    x = torch.randint(0, V, (4, 32))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(150):
        loss = causal_lm_loss(net(x[:, :-1]), x[:, 1:])["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_ignored_targets_do_not_count():
    logits = torch.randn(2, 5, V)
    y = torch.randint(0, V, (2, 5))
    y_pad = y.clone()
    y_pad[:, 3:] = IGNORE_INDEX
    out = causal_lm_loss(logits, y_pad)
    expected = torch.nn.functional.cross_entropy(logits[:, :3].reshape(-1, V), y[:, :3].reshape(-1))
    torch.testing.assert_close(out["loss"], expected)
    assert out["tokens"] == 6


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_full_sequence_logits_at_every_step(variant):
    net = tiny(variant).double().eval()
    x = torch.randint(0, V, (3, 30))
    full = net(x)
    cache = make_cache(net, 3, 30)
    steps = [net(x[:, :7], cache, 0)]  # prefill, then one token at a time
    steps += [net(x[:, i : i + 1], cache, i) for i in range(7, 30)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", ["mha", "gqa", "mla_qlora"])
def test_generation_cached_equals_uncached_and_batch_equals_single(variant):
    net = tiny(variant).double()
    prompts = [torch.randint(0, V, (n,)) for n in (3, 9, 5)]
    cached = generate(net, prompts, 12, temperature=0)
    uncached = generate(net, prompts, 12, temperature=0, use_cache=False)
    single = [generate(net, [p], 12, temperature=0)[0] for p in prompts]
    for a, b, c in zip(cached, uncached, single):
        assert torch.equal(a, b) and torch.equal(a, c) and len(a) == 12
    # the same seed gives the same samples, with or without the cache
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    s1 = generate(net, prompts, 8, temperature=1.0, top_k=20, generator=g())
    s2 = generate(net, prompts, 8, temperature=1.0, top_k=20, generator=g(), use_cache=False)
    assert all(torch.equal(a, b) for a, b in zip(s1, s2))


def test_generation_stops_at_eos_and_slides_past_block_size():
    net = tiny("mha")
    prompt = torch.randint(0, V, (5,))
    greedy = generate(net, [prompt], 10, temperature=0)[0]
    first = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i])  # pretend it is EOS
    eos = int(greedy[first])
    assert torch.equal(generate(net, [prompt], 10, temperature=0, stop_ids=(eos,))[0], greedy[:first])
    # any of several stop ids ends it (Llama 3's generation_config.json lists three EOS ids)
    assert len(generate(net, [prompt], 10, temperature=0, stop_ids=(eos, int(greedy[0])))[0]) == 0
    # Issue 13: 500 tokens asked past block_size 48 are 500 given (it stopped at 43 before), or a clear error.
    assert len(generate(net, [prompt], 500, temperature=0)[0]) == 500
    with pytest.raises(ValueError, match="exceed the model.s block_size 48.*ask for at most 43"):
        generate(net, [prompt], 500, temperature=0, past_block_size="error")
    with pytest.raises(ValueError, match="block_size"):
        generate(net, [torch.zeros(48, dtype=torch.long)], 1)


@pytest.mark.parametrize("variant", ["mha", "gqa", "mla"])
def test_generation_past_block_size_predicts_from_the_last_block_size_tokens(variant):
    net = tiny(variant, block_size=16).double().eval()
    prompts = [torch.randint(0, V, (n,)) for n in (3, 11)]
    out = generate(net, prompts, 40, temperature=0)
    assert [len(o) for o in out] == [40, 40]
    assert all(torch.equal(a, b) for a, b in zip(out, generate(net, prompts, 40, temperature=0, use_cache=False)))
    for p, o in zip(prompts, out):  # nanoGPT's rule written out: each token the argmax after the last 16 ids
        seq = torch.cat((p, o))
        expected = [int(net(seq[None, max(0, i - 16) : i])[0, -1].argmax()) for i in range(len(p), len(seq))]
        assert o.tolist() == expected


def test_unequal_prompts_prefill_in_one_pass():
    net = tiny("mha", block_size=64)
    calls = []
    net.register_forward_hook(lambda m, args, out: calls.append(args[0].shape))
    short, long = torch.randint(0, V, (5,)), torch.randint(0, V, (40,))
    out = generate(net, [short, long], 4, temperature=0)
    assert calls == [(2, 40), (2, 1), (2, 1), (2, 1)]  # one prefill of both prompts, then one token per step
    assert all(torch.equal(o, generate(net, [p], 4, temperature=0)[0]) for o, p in zip(out, (short, long)))


@pytest.mark.parametrize("heads", [4, 16])
def test_mla_cache_holds_latent_and_rope_key_only(heads):
    d = 64  # head size; DeepSeek-V2's proportions: r = 4d, p = d/2
    mla = GPT(
        vocab_size=V,
        block_size=16,
        n_layer=3,
        n_embd=heads * d,
        n_head=heads,
        attention=partial(MLA, kv_lora_rank=4 * d, qk_rope_head_dim=d // 2, qk_nope_head_dim=d, v_head_dim=d),
    )
    mha = GPT(vocab_size=V, block_size=16, n_layer=3, n_embd=heads * d, n_head=heads)
    b, n = 2, 16

    def numbers(net):  # every element of every buffer, per token and layer
        caches = make_cache(net, b, n)
        return sum(c.a.numel() + (0 if c.b is None else c.b.numel()) for c in caches) / (b * n * 3)

    mla_numbers, mha_numbers = numbers(mla), numbers(mha)
    assert mla_numbers == 4 * d + d // 2
    assert mha_numbers == 2 * heads * d
    assert mla_numbers / mha_numbers == pytest.approx(2.25 / heads)


def test_sampling_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # nucleus 0.7: 0.5 alone is short of it, 0.5 + 0.3 reaches it; the rest goes
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.4)).tolist() == [[False, True, True, True]]
    assert sample_next(logits, temperature=0).item() == 0
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits.expand(4000, 4), 1.0, generator=g)]).flatten()
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    torch.testing.assert_close(freq, logits.exp()[0], atol=0.03, rtol=0)


def test_activation_checkpointing_gives_the_same_gradients():
    x = torch.randint(0, V, (2, 16))
    grads = []
    for ckpt in (False, True):
        net = tiny("gqa", activation_checkpointing=ckpt)
        causal_lm_loss(net(x[:, :-1]), x[:, 1:])["loss"].backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("variant", ["mha", "mla_qlora"])
def test_every_parameter_in_exactly_one_group_and_embeddings_do_not_decay(variant):
    net = tiny(variant)
    groups = param_groups(net, weight_decay=0.1)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(net.parameters()))
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    assert id(net.tok_emb.weight) in no_decay
    assert id(net.blocks[0].mlp.fc.weight) not in no_decay


def test_gpt2_init_scales_residual_projections():
    net = GPT(vocab_size=V, block_size=16, n_layer=12, n_embd=256, n_head=4)
    assert net.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert net.blocks[0].attn.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(24), rel=0.05)
    assert net.lm_head.weight is net.tok_emb.weight


class TwoExperts(torch.nn.Module):
    """A stand-in for a mixture of experts, written as a new MLP is: one class stating its FLOPs and init."""

    def __init__(self, dim: int, hidden: int | None, bias: bool, dropout: float) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(GeluMLP(dim, hidden, bias, dropout) for _ in range(2))

    def forward(self, x):
        return self.experts[0](
            x
        )  # (output, no auxiliary loss): every token to expert 0: routing is not what this test is about

    def flops_per_token(self) -> int:
        return self.experts[0].flops_per_token()  # a token visits one expert

    def residual_projections(self):
        return [e.proj.weight for e in self.experts]


@pytest.mark.parametrize("mlp", [GeluMLP, SwiGLU, TwoExperts])
def test_flops_and_init_are_what_each_mlp_class_states(mlp):
    torch.manual_seed(0)
    net = GPT(vocab_size=V, block_size=16, n_layer=12, n_embd=256, n_head=4, mlp=mlp)
    # nanoGPT's estimate: 6 x the matmul weights a token goes through, plus the attention scores (MHA: 12 L D T).
    weights = sum(
        p.numel() for n, p in net.named_parameters() if p.dim() >= 2 and "emb" not in n and "experts.1" not in n
    )
    assert net.flops_per_token(16) == 6 * (weights + V * 256) + 12 * 12 * 256 * 16
    last = net.blocks[0].mlp.residual_projections()[-1]
    assert last.std().item() == pytest.approx(0.02 / math.sqrt(24), rel=0.05)  # GPT-2's depth-scaled init
    net(torch.randint(0, V, (2, 16))).sum().backward()


def test_gelu_is_chosen_by_config_exact_for_new_models_tanh_for_gpt2_weights():
    x = torch.randn(3, 32)
    exact, tanh = (
        GPT(vocab_size=V, block_size=8, n_layer=1, n_embd=32, n_head=4, mlp=partial(GeluMLP, approximate=g))
        .blocks[0]
        .mlp
        for g in ("exact", "tanh")
    )
    tanh.load_state_dict(exact.state_dict())
    h = exact.fc(x)
    torch.testing.assert_close(exact(x)[0], exact.proj(0.5 * h * (1 + torch.erf(h / math.sqrt(2)))))
    torch.testing.assert_close(tanh(x)[0], tanh.proj(torch.nn.functional.gelu(h, approximate="tanh")))
    # A checkpoint saved before the option existed rebuilds with the GELU it was trained with.
    assert GPT(vocab_size=V, block_size=8, n_layer=1, n_embd=32, n_head=4).blocks[0].mlp.approximate == "tanh"
    import yaml
    from conftest import CONFIGS

    for path in sorted((CONFIGS / "gpt").glob("*.yaml")):
        model = yaml.safe_load(path.read_text())["model"]["init_args"]
        if "init_args" not in model["net"]:  # the net is the imported folder's (grpo_arithmetic_llama.yaml)
            continue
        mlp = model["net"]["init_args"].get("mlp", {"class_path": "zoo.gpt.GeluMLP"})
        if isinstance(mlp, dict) and mlp["class_path"].endswith("GeluMLP"):  # GPT-2's weights keep tanh; new: exact
            expected = "tanh" if model.get("init_weights") == "gpt2" else "exact"
            assert mlp.get("init_args", {}).get("approximate") == expected, path.name


def test_mla_decode_attends_all_heads_in_one_single_head_call_on_the_cache_itself(monkeypatch):
    # DeepSeek-V2's absorbed decode: the H heads' queries are rows of one attention over the shared latent,
    # which is read in place (a GQA-style call with H query heads copied the latent per head on the CPU).
    net = tiny("mla").eval()
    cache = make_cache(net, 2, 20)
    x = torch.randint(0, V, (2, 12))
    net(x, cache, 0)
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda q, k, v, **kw: seen.append((q.shape, k, kw)) or sdpa(q, k, v, **kw),
    )
    net(x[:, :1], cache, 12)
    r_p = MLA_ARGS["kv_lora_rank"] + MLA_ARGS["qk_rope_head_dim"]
    assert len(seen) == net.n_layer
    for (q_shape, k, kw), layer in zip(seen, cache):
        assert q_shape == (2, 1, 4, r_p) and not kw.get("enable_gqa")  # 4 heads x 1 token as query rows
        assert k.data_ptr() == layer.a.data_ptr() and k.shape == (2, 1, 13, r_p)  # the cache buffer, not a copy


@pytest.mark.parametrize("dim, hidden", [(96, 256), (64, 192), (4096, 10944)])
def test_default_hidden_widths_are_the_papers(dim, hidden):
    """SwiGLU: 8D/3 rounded up to a multiple of 64 (LLaMA's rule, multiple_of = 64: a 4D GELU MLP's parameters);
    GELU: 4D (GPT-2)."""
    assert SwiGLU(dim).fc.out_features == 2 * hidden and SwiGLU(dim).proj.in_features == hidden
    assert GeluMLP(dim).fc.out_features == 4 * dim
