"""Multi-token prediction (DeepSeek-V3 section 2.2): alignment of each depth's targets, learnability, the net unchanged
without it, transformers' own MTP layer as a reference, weights in and out, gradients, and the tiny DeepSeek config."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from zoo.errors import InputError
from zoo.gpt import GPT, MHA, MLA, CausalLMModule, RMSNorm, SwiGLU
from zoo.gpt.formats.llama import export_hf, load_hf, load_hf_into
from zoo.gpt.generate import LayerCache
from zoo.gpt.losses import causal_lm_loss, mtp_loss

V = 29
MLA_ARGS = dict(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
LLAMA = dict(norm=RMSNorm, mlp=SwiGLU, position="rope", bias=False, tie_embeddings=False, rope_base=500.0)


def net_of(attention="mha", depth=2, seed=0, **kw):
    torch.manual_seed(seed)
    attn = partial(MLA, **MLA_ARGS, norm_eps=1e-6) if attention == "mla" else partial(MHA, n_kv_head=2)
    args = dict(vocab_size=V, block_size=32, n_layer=2, n_embd=64, n_head=4, attention=attn, mtp_depth=depth)
    return GPT(**(args | LLAMA | kw))


def perturbed(net):
    """Every weight moved off its init (norms included), so a swapped or missed weight shows."""
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return net.eval()


def sequence(x, y):
    """The whole token sequence t_0..t_T of a batch (inputs and the last target)."""
    return torch.cat((x, y[:, -1:]), dim=1)


# -- (a) alignment: a per-position reference ------------------------------------------------------------------------


def reference_mtp_losses(net, tokens):
    """L_k by the paper's equations, one position at a time: module k at position i reads h^{k-1}_i and Emb(t_{i+k})
    over positions 0..i only, and is scored on t_{i+k+1} of the raw sequence."""
    x = tokens[:, :-1]
    _, h = net(x, return_hidden=True)  # h^0 (B, T, D): what the main head reads
    t, losses = x.shape[1], []
    for k, module in enumerate(net.mtp, 1):
        rows, nll = [], []
        for i in range(t - k):
            emb = net.tok_emb(tokens[:, k : i + k + 1])  # Emb(t_{j+k}), j = 0..i
            h_in = torch.cat((module.enorm(emb), module.hnorm(h[:, : i + 1])), dim=-1)  # [embedding ; hidden]
            cos, sin = net.rope_cos[: i + 1], net.rope_sin[: i + 1]
            hk = module.norm(module.block(module.eh_proj(h_in), cos, sin)[0])[:, -1]  # h^k_i (B, D)
            rows.append(hk)
            logp = F.log_softmax(net.lm_head(hk), dim=-1)
            nll.append(-logp.gather(1, tokens[:, i + k + 1, None]).squeeze(1))  # target t_{i+k+1}
        losses.append(torch.stack(nll).mean())
        h = torch.stack(rows, dim=1)  # h^k at positions 0..T-k-1
    return losses


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_each_depth_loss_equals_a_per_position_reference(attention):
    net = perturbed(net_of(attention, depth=3))
    tokens = torch.randint(0, V, (2, 13))
    x, y = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        logits, mtp_logits = net(x, mtp=True)
        out = mtp_loss(mtp_logits, y)
        ref = reference_mtp_losses(net, tokens)
    assert [lg.shape for lg in mtp_logits] == [(2, 12 - k, V) for k in (1, 2, 3)]
    for k in (1, 2, 3):
        torch.testing.assert_close(out[f"loss_{k}"], ref[k - 1], atol=1e-5, rtol=1e-5)
        assert out[f"tokens_{k}"] == 2 * (12 - k)
    torch.testing.assert_close(out["loss"], sum(ref) / 3, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, net(x), atol=0, rtol=0)  # the main logits as a plain forward gives them


# -- (b) learnability: only the aligned target can be learned -------------------------------------------------------


def triples(n, t, generator, k=8):
    """Sequences of triples (a, r, f(a)), a and r uniform over k ids each, f a fixed permutation into a third range of
    k ids (disjoint ranges: a token tells its place in the triple). At a position i holding a, the token after next
    is f(t_i) although t_{i+1} is random; every other token is uniform given everything before it."""
    a = torch.randint(0, k, (n, t // 3 + 1), generator=generator)
    r = torch.randint(k, 2 * k, (n, t // 3 + 1), generator=generator)
    return torch.stack((a, r, 2 * k + (5 * a + 3) % k), dim=-1).flatten(1)[:, : t + 1]


def test_depth_one_learns_the_token_after_next_exactly_where_it_is_determined(one_thread):
    # Depth 1 at position i is scored on t_{i+2}: at i = 0 mod 3 that is f(a), learnable; at the other positions it
    # is uniform over k ids, so its loss cannot go below log k (on fresh data). A target shifted one way (t_{i+3}:
    # uniform at i = 0 mod 3), the other (t_{i+1}: the embedding the module is given, learnable everywhere) or a
    # module that predicts the next token again (t_{i+1} = r, uniform) breaks one of the two bounds.
    g = torch.Generator().manual_seed(0)
    net = net_of("mha", depth=1, seed=1, vocab_size=24, n_layer=1, n_embd=32, block_size=24).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in range(100):
        tokens = triples(16, 24, g)
        x, y = tokens[:, :-1], tokens[:, 1:]
        logits, mtp_logits = net(x, mtp=True)
        loss = causal_lm_loss(logits, y)["loss"] + mtp_loss(mtp_logits, y)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens = triples(256, 24, g)
    with torch.no_grad():
        (depth1,) = net.eval()(tokens[:, :-1], mtp=True)[1]  # (B, 23, V)
    nll = F.cross_entropy(depth1.transpose(1, 2), tokens[:, 2:], reduction="none")  # targets t_{i+2}
    determined = torch.arange(nll.shape[1]) % 3 == 0
    assert nll[:, determined].mean() < 0.1 * math.log(8)
    assert nll[:, ~determined].mean() > 0.9 * math.log(8)


def test_training_loss_adds_lambda_over_depth_times_the_depth_losses_and_validation_keeps_them_apart(monkeypatch):
    module = CausalLMModule(net_of("mha", depth=2), mtp_weight=0.5)
    monkeypatch.setattr("zoo.gpt.module.lightning_writes", lambda trainer: False)
    monkeypatch.setattr(CausalLMModule, "trainer", None)
    tokens = torch.randint(0, V, (2, 13))
    x, y = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        loss = module.training_step((x, y), 0)
        logits, (d1, d2) = module.net(x, mtp=True)
        main = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        depth = [F.cross_entropy(d.flatten(0, 1), tokens[:, k + 1 :].flatten()) for k, d in ((1, d1), (2, d2))]
        torch.testing.assert_close(loss, main + 0.5 / 2 * sum(depth))  # DeepSeek-V3 eq. 25, D = 2

        module.eval()
        short = torch.randint(0, V, (2, 6))
        for batch in ((x, y), (short[:, :-1], short[:, 1:])):
            module.validation_step(batch, 0)
        d1_short = module.net(short[:, :-1], mtp=True)[1][0]
        l1_short = F.cross_entropy(d1_short.flatten(0, 1), short[:, 2:].flatten())
        # token-weighted over batches (22 and 8 positions at depth 1); val/loss stays the next-token loss alone
        torch.testing.assert_close(module.val_mtp_loss[0].compute(), (22 * depth[0] + 8 * l1_short) / 30)
        main_short = F.cross_entropy(module.net(short[:, :-1]).flatten(0, 1), short[:, 1:].flatten())
        torch.testing.assert_close(module.val_loss.compute(), (24 * main + 10 * main_short) / 34)


# -- (c) without MTP the net is today's ------------------------------------------------------------------------------


def test_no_mtp_is_the_plain_net_and_mtp_leaves_the_main_model_as_a_seed_gives_it():
    plain, deep = net_of("mla", depth=0), net_of("mla", depth=2)
    assert not list(plain.mtp) and not any(k.startswith("mtp.") for k in plain.state_dict())
    main = {k: v for k, v in deep.state_dict().items() if not k.startswith("mtp.")}
    assert list(main) == list(plain.state_dict())  # same keys, same order
    for k, v in plain.state_dict().items():
        assert torch.equal(v, main[k]), k  # same seed, same main weights: runs with and without MTP start alike
    x = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        h = plain.tok_emb(x)
        for block in plain.blocks:
            h, _ = block(h, plain.rope_cos[:9], plain.rope_sin[:9])
        torch.testing.assert_close(plain(x), plain.lm_head(plain.norm_f(h)), atol=0, rtol=0)
        torch.testing.assert_close(deep(x), plain(x), atol=0, rtol=0)
    mtp_params = sum(p.numel() for p in deep.mtp.parameters())
    assert mtp_params == sum(p.numel() for p in deep.parameters()) - sum(p.numel() for p in plain.parameters())


def test_mtp_blocks_copy_the_last_block_and_count_in_flops_and_init():
    net = GPT(vocab_size=V, block_size=16, n_layer=3, n_embd=32, n_head=4, mtp_depth=2)
    plain = GPT(vocab_size=V, block_size=16, n_layer=3, n_embd=32, n_head=4)
    per_block = plain.flops_per_token(16) - GPT(
        vocab_size=V, block_size=16, n_layer=2, n_embd=32, n_head=4
    ).flops_per_token(16)
    eh_proj, head = 2 * 32 * 32, V * 32
    assert net.flops_per_token(16) == plain.flops_per_token(16) + 2 * (per_block + 6 * (eh_proj + head))
    for m in net.mtp:  # GPT-2's init: residual projections scaled by depth, the projection N(0, 0.02), norms 1
        assert type(m.block.attn) is type(net.blocks[-1].attn) and type(m.block.mlp) is type(net.blocks[-1].mlp)
        assert m.block.attn.proj.weight.std() < 0.02 / math.sqrt(6) * 1.2 < m.eh_proj.weight.std()
        assert all(torch.equal(n.weight, torch.ones(32)) for n in (m.enorm, m.hnorm, m.norm))


# -- (d) weights in and out ------------------------------------------------------------------------------------------


def hf_mtp_layer(model, sd, n_layer, k):
    """transformers' own ``MtpLayer`` for module k, its weights renamed from the exported folder as transformers'
    conversion mapping does (decoder keys under ``mtp_block``, ``shared_head.norm`` as ``post_norm``)."""
    from transformers.modeling_layers import MtpLayer

    layer = MtpLayer(model.config, type(model.model.layers[-1]), type(model.model.norm), 0).eval()
    pre, ours = f"model.layers.{n_layer + k - 1}.", {}
    for key, v in sd.items():
        rest = key.removeprefix(pre)
        if key.startswith(pre) and not rest.startswith(("embed_tokens.", "shared_head.head.")):
            own = rest.startswith(("enorm.", "hnorm.", "eh_proj."))
            ours["post_norm.weight" if rest == "shared_head.norm.weight" else rest if own else "mtp_block." + rest] = v
    layer.load_state_dict(ours, strict=True)
    return layer


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_exported_mtp_modules_equal_transformers_mtp_layer_and_the_folder_loads_in_transformers(tmp_path, attention):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    net = perturbed(net_of(attention, depth=2))
    folder = export_hf(net, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 2
    sd = load_file(folder / "model.safetensors")
    assert {"model.layers.2.eh_proj.weight", "model.layers.3.shared_head.head.weight"} <= set(sd)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    x = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        ref = model(x, output_hidden_states=True)
        logits, h = net(x, return_hidden=True)
        torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)  # the MTP layers left aside
        hidden, ids = ref.hidden_states[-1], x  # h^0: transformers' last hidden state, after model.norm
        for k in (1, 2):
            t = ids.shape[1] - 1
            emb, pos = model.model.embed_tokens(ids[:, 1:]), torch.arange(t)[None]
            hidden = hf_mtp_layer(model, sd, 2, k)(
                emb, hidden[:, :-1], model.model.rotary_emb(emb, pos), attention_mask=None, position_ids=pos, cache=None
            )
            mine, h = net.mtp_forward(h[:, :-1], ids[:, 1:], k)
            torch.testing.assert_close(mine, model.lm_head(hidden), atol=1e-5, rtol=1e-5)
            ids = ids[:, 1:]


def test_mtp_weights_round_trip_through_a_folder_and_a_folder_without_them_is_refused(tmp_path):
    net = perturbed(net_of("mla", depth=2))
    folder = export_hf(net, tmp_path / "hf")
    back = load_hf_into(net_of("mla", depth=2, seed=5), folder)
    for k, v in net.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, atol=0, rtol=0, msg=k)
    main_only = load_hf(folder)  # a net built from config.json alone takes the main model
    assert not list(main_only.mtp)
    torch.testing.assert_close(main_only(torch.arange(9)[None]), net(torch.arange(9)[None]), atol=1e-6, rtol=1e-6)
    plain = export_hf(net_of("mla", depth=0), tmp_path / "plain")
    assert json.loads((plain / "config.json").read_text())["num_nextn_predict_layers"] == 0
    with pytest.raises(InputError, match="mtp_depth=2.*model.layers.2"):
        load_hf_into(net_of("mla", depth=2), plain)


# -- (e) gradients ---------------------------------------------------------------------------------------------------


def test_the_mtp_loss_alone_trains_the_shared_embedding_head_and_main_model():
    net = net_of("mha", depth=1)
    x = torch.randint(0, V, (2, 10))
    mtp_loss(net(x, mtp=True)[1], torch.randint(0, V, (2, 10)))["loss"].backward()
    for name in (
        "tok_emb.weight",
        "lm_head.weight",
        "norm_f.weight",
        "blocks.0.attn.qkv.weight",
        "mtp.0.eh_proj.weight",
    ):
        assert net.get_parameter(name).grad.abs().sum() > 0, name
    # an id only at the last input position reaches no h^0 the loss reads (causal, and depth 1 stops at T-2): its
    # embedding row learns only as the MTP module's input Emb(t_{i+1}), through the shared table
    net.zero_grad()
    mtp_loss(net(torch.arange(1, 11)[None], mtp=True)[1], torch.randint(0, V, (1, 10)))["loss"].backward()
    assert net.tok_emb.weight.grad[10].abs().sum() > 0
    assert net.tok_emb.weight.grad[11:].abs().sum() == 0


# -- drafting: a module's cache --------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_mtp_forward_in_chunks_with_a_cache_equals_one_pass(attention):
    net = perturbed(net_of(attention, depth=2))
    x = torch.randint(0, V, (2, 14))
    with torch.no_grad():
        _, h = net(x[:, :-1], return_hidden=True)
        whole, _ = net.mtp_forward(h, x[:, 1:], 1)
        cache = LayerCache(2, 20, net.mtp[0].block.attn.cache_layout(), "cpu", torch.float32)
        parts = [
            net.mtp_forward(h[:, a:b], x[:, a + 1 : b + 1], 1, cache, a)[0] for a, b in ((0, 9), (9, 12), (12, 13))
        ]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)


def test_sequences_no_longer_than_the_depth_give_a_finite_loss_over_the_depths_that_have_targets():
    net = net_of("mha", depth=2)
    x2, y2 = torch.randint(0, V, (3, 2)), torch.randint(0, V, (3, 2))
    logits = net(x2, mtp=True)[1]  # T = 2: depth 1 has one position, depth 2 none
    out = mtp_loss([*logits, logits[0][:, :0]] if len(logits) == 1 else logits, y2)
    assert out["tokens_1"] == 3 and out["tokens_2"] == 0
    torch.testing.assert_close(out["loss"], out["loss_1"])  # the mean over the depth that has targets
    out["loss"].backward()
    x1 = torch.randint(0, V, (3, 1))  # T = 1: no depth has a target
    out = mtp_loss(net(x1, mtp=True)[1], torch.randint(0, V, (3, 1)))
    assert out["loss"] == 0
