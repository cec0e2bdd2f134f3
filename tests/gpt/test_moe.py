"""The mixture-of-experts MLP: parity with transformers' DeepSeek-V3 and Mixtral blocks, dispatch against a
per-token loop, auxiliary-loss-free balancing, checkpoints, float32 bias under casts, export refused where Hugging
Face has no such net (the exports are in test_moe_hf.py), and a tiny MoE GPT through cli.py."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from conftest import CONFIGS, cli

from zoo.errors import InputError
from zoo.gpt import GPT, CausalLMModule, MoE, RMSNorm
from zoo.gpt.formats.hf import export_gpt2
from zoo.gpt.formats.llama import export_hf
from zoo.gpt.moe import balance_loss

D, FW, E = 32, 16, 8


def perturbed(module, scale=0.3):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return module.eval()


def deepseek_moe(n_group, topk_group, n_shared=1, scale=2.5):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    config = transformers.DeepseekV3Config(
        hidden_size=D,
        moe_intermediate_size=FW,
        n_routed_experts=E,
        num_experts_per_tok=2,
        n_shared_experts=n_shared,
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=True,
        routed_scaling_factor=scale,
    )
    torch.manual_seed(0)
    ref = perturbed(DeepseekV3MoE(config))
    ref.gate.e_score_correction_bias.copy_(torch.randn(E) * 0.3)  # large enough to change the choices
    ours = MoE(D, FW, n_routed_experts=E, num_experts_per_tok=2, n_shared_experts=n_shared, routed_scaling_factor=scale)
    ours.n_group, ours.topk_group = n_group, topk_group
    sd = {
        "router.weight": ref.gate.weight,
        "experts_fc": ref.experts.gate_up_proj,
        "experts_proj": ref.experts.down_proj,
        "expert_bias": ref.gate.e_score_correction_bias,
        "shared.fc.weight": torch.cat((ref.shared_experts.gate_proj.weight, ref.shared_experts.up_proj.weight)),
        "shared.proj.weight": ref.shared_experts.down_proj.weight,
    }
    ours.load_state_dict(sd)
    return ref, ours.eval()


@pytest.mark.parametrize("n_group,topk_group", [(1, 1), (4, 2)])
def test_sigmoid_routing_equals_transformers_deepseek_v3_moe(n_group, topk_group):
    ref, ours = deepseek_moe(n_group, topk_group)
    x = torch.randn(3, 10, D)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], ref(x), atol=1e-5, rtol=1e-5)
        _, w_ref, idx_ref = ref.gate(x)
        idx, w, _ = ours.route(x.view(-1, D))
    # same experts with the same weights (order within a token's k may differ)
    assert torch.equal(idx.sort(-1).values, idx_ref.sort(-1).values)
    torch.testing.assert_close(w.sum(-1), torch.full((30,), 2.5))
    # the bias changed the choices (so the test sees it), and groups limit them: with 2 of 4 groups, at most 2
    # groups hold a token's experts
    bias_free = (torch.sigmoid(x.view(-1, D) @ ours.router.weight.T)).topk(2).indices.sort(-1).values
    assert not torch.equal(bias_free, idx.sort(-1).values)
    if n_group > 1:
        assert ((idx // (E // n_group)).unique(dim=-1).shape[-1]) <= topk_group


def test_softmax_routing_and_balance_loss_equal_transformers_mixtral():
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

    config = transformers.MixtralConfig(hidden_size=D, intermediate_size=FW, num_local_experts=E, num_experts_per_tok=2)
    torch.manual_seed(0)
    ref = perturbed(MixtralSparseMoeBlock(config))
    ours = MoE(D, FW, n_routed_experts=E, num_experts_per_tok=2, n_shared_experts=0, routing="softmax")
    ours.load_state_dict(
        {
            "router.weight": ref.gate.weight,
            "experts_fc": ref.experts.gate_up_proj,
            "experts_proj": ref.experts.down_proj,
            "expert_bias": torch.zeros(E),  # unused by softmax routing
        }
    )
    x = torch.randn(3, 10, D)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x)[0], ref(x), atol=1e-5, rtol=1e-5)
        assert ours(x)[1] is None  # no balance term outside training
        logits = ref.gate(x)[0]
    _, balance = ours.train()(x)  # the router returns its term, times aux_loss_coef
    expected = load_balancing_loss_func((logits,), num_experts=E, top_k=2)
    torch.testing.assert_close(balance, ours.aux_loss_coef * expected)
    assert balance.requires_grad  # it trains the router


def naive(moe: MoE, x):
    """The same MoE one token at a time, from the routing: the reference the batched dispatch must equal."""
    flat = x.reshape(-1, x.shape[-1])
    idx, w, _ = moe.route(flat)
    out = torch.zeros_like(flat)
    for n in range(len(flat)):  # loops over tokens here only
        for j in range(moe.k):
            e = idx[n, j]
            gate, up = (moe.experts_fc[e] @ flat[n]).chunk(2)
            out[n] += w[n, j] * (moe.experts_proj[e] @ (F.silu(gate) * up))
        if moe.shared is not None:
            out[n] += moe.shared(flat[n])[0]
    return out.view_as(x)


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped_mm", "per_expert"])
@pytest.mark.parametrize("routing", ["sigmoid_bias", "softmax"])
def test_dispatch_equals_a_per_token_loop(routing, grouped, monkeypatch):
    monkeypatch.setattr("zoo.gpt.moe.grouped_mm_fits", lambda w: grouped)  # both kernels the dispatch may take
    torch.manual_seed(1)
    moe = perturbed(MoE(D, FW, n_routed_experts=E, num_experts_per_tok=3, routing=routing, n_group=2, topk_group=1))
    x = torch.randn(2, 7, D, requires_grad=True)
    moe(x)[0].square().sum().backward()
    grads = [x.grad, moe.experts_fc.grad, moe.experts_proj.grad]
    for t in (x, moe.experts_fc, moe.experts_proj):
        t.grad = None
    naive(moe, x).square().sum().backward()
    for a, b in zip(grads, [x.grad, moe.experts_fc.grad, moe.experts_proj.grad]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(moe(x)[0], naive(moe, x), atol=1e-5, rtol=1e-5)
        moe.router.weight[1:] = -10.0 * moe.router.weight[:1].abs().sum()  # expert 0 wins everywhere...
        moe.router.weight[0] = moe.router.weight[0].abs()
        x1 = x.abs()  # ...so some experts get no token: empty slices
        assert (torch.bincount(moe.route(x1.view(-1, D))[0].flatten(), minlength=E) == 0).any()
        torch.testing.assert_close(moe(x1)[0], naive(moe, x1), atol=1e-5, rtol=1e-5)


def test_bias_updates_balance_a_skewed_router_without_gradient(one_thread):
    torch.manual_seed(0)
    moe = MoE(D, FW, n_routed_experts=E, num_experts_per_tok=2, bias_update_rate=0.01).train()
    with torch.no_grad():
        moe.router.weight.normal_(0, 0.1)
        moe.router.weight[:2] += 0.5 * torch.randn(D)  # two experts every token prefers
    x = torch.randn(256, D) + torch.randn(D)  # a shared direction, so the preference is the same for all

    def imbalance():
        moe.reset_stats()
        with torch.no_grad():
            moe(x)
        return moe.stats()["load_max_over_mean"].item()

    before = imbalance()
    moe(x)[0].sum().backward()
    assert moe.expert_bias.grad is None and not moe.expert_bias.requires_grad
    assert moe.router.weight.grad is not None
    for _ in range(100):
        with torch.no_grad():
            moe(x)
        moe.update_bias()
    after = imbalance()
    assert before > 2.5 and after < 0.6 * before, (before, after)
    # the favoured experts were pushed down, the others up
    assert moe.expert_bias[:2].max() < moe.expert_bias[2:].min()


def test_balance_loss_is_k_when_balanced_and_grows_with_skew():
    n, e = 64, 4
    even = torch.full((n, e), 1 / e)
    idx = torch.arange(2 * n).view(n, 2) % e  # every expert picked equally
    torch.testing.assert_close(balance_loss(idx, even), torch.tensor(2.0))
    skewed = torch.tensor([0.7, 0.1, 0.1, 0.1]).expand(n, e)
    assert balance_loss(torch.zeros(n, 2, dtype=torch.long), skewed) > 2.0


def tiny_gpt(**moe):
    return GPT(
        vocab_size=50,
        block_size=16,
        n_layer=3,
        n_embd=D,
        n_head=4,
        bias=False,
        position="rope",
        first_k_dense=1,
        mlp=partial(MoE, n_routed_experts=E, num_experts_per_tok=2, **moe),
        mlp_hidden=FW,
    )


def test_gpt_counts_only_the_experts_a_token_visits_and_inits_every_down_projection():
    net = tiny_gpt()
    dense, moe = net.blocks[0].mlp, net.blocks[1].mlp
    assert type(dense).__name__ == "SwiGLU" and isinstance(moe, MoE)
    per_token = 6 * (E * D + 2 * 3 * FW * D) + 6 * 3 * FW * D  # router, 2 routed experts, 1 shared of width F
    assert moe.flops_per_token() == per_token
    all_experts = 6 * sum(p.numel() for p in moe.parameters())
    assert per_token < all_experts
    torch.testing.assert_close(moe.experts_proj.std(), torch.tensor(0.02 / 6**0.5), atol=2e-3, rtol=0)
    torch.testing.assert_close(moe.experts_fc.std(), torch.tensor(0.02), atol=2e-3, rtol=0)


def test_bias_is_saved_and_restored_with_the_state_dict():
    net = tiny_gpt()
    net.blocks[2].mlp.expert_bias.copy_(torch.linspace(-1, 1, E))
    sd = net.state_dict()
    assert "blocks.2.mlp.expert_bias" in sd and "blocks.2.mlp.load" not in sd
    other = tiny_gpt()
    other.load_state_dict(sd)
    torch.testing.assert_close(other.blocks[2].mlp.expert_bias, torch.linspace(-1, 1, E))


def test_export_of_a_moe_net_without_a_hugging_face_form_is_refused_naming_moe(tmp_path):
    """MHA with DeepSeek's sigmoid routing is neither Mixtral nor DeepSeek-V3 (which export: test_moe_hf.py)."""
    moe = partial(MoE, n_routed_experts=E, num_experts_per_tok=2)
    net = GPT(
        vocab_size=50,
        block_size=16,
        n_layer=2,
        n_embd=D,
        n_head=4,
        norm=RMSNorm,
        position="rope",
        bias=False,
        mlp=moe,
    )
    with pytest.raises(InputError, match="mixture-of-experts"):
        export_hf(net, tmp_path / "ds")
    with pytest.raises(InputError, match="mixture-of-experts"):
        export_gpt2(net, tmp_path / "gpt2")
    assert not (tmp_path / "ds").exists() and not (tmp_path / "gpt2").exists()  # refused before writing


def test_softmax_aux_loss_joins_the_training_loss(monkeypatch):
    torch.manual_seed(0)
    module = CausalLMModule(tiny_gpt(routing="softmax", aux_loss_coef=0.5))
    monkeypatch.setattr("zoo.gpt.module.lightning_writes", lambda trainer: False)
    monkeypatch.setattr(CausalLMModule, "trainer", None)
    x = torch.randint(0, 50, (2, 16))
    seen = []  # each router's input, to score its routing here
    for r in module.routers:
        r.register_forward_hook(lambda m, args, out: seen.append((m, args[0].reshape(-1, args[0].shape[-1]))))
    loss = module.training_step((x, x), 0)
    assert len(seen) == 2
    aux = sum(balance_loss(*m.route(inp)[::2]) for m, inp in seen)  # Switch eq. 4 from each router's own choice
    plain = F.cross_entropy(module.net(x).flatten(0, 1), x.flatten())
    torch.testing.assert_close(loss, plain + 0.5 * aux)
    assert len(module.routers) == 2


def test_bias_misconfigurations_are_named():
    with pytest.raises(InputError, match="bias: false"):
        MoE(D, FW, bias=True)
    with pytest.raises(InputError, match="topk_group"):
        MoE(D, FW, n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=1)


def test_tiny_moe_fits_and_reloads_with_its_bias_then_generates(one_thread):
    config = str(CONFIGS / "gpt" / "moe_tiny.yaml")
    steps = ["--data.init_args.samples_per_epoch=48", "--trainer.limit_val_batches=1"]  # 6 steps an epoch
    c = cli("fit", "--config", config, *steps)
    metrics = c.trainer.callback_metrics
    assert {"val/moe_load_max_over_mean", "val/moe_balance_loss", "val/moe_bias_min"} <= set(metrics)
    bias = c.model.net.blocks[1].mlp.expert_bias.clone()
    assert bias.abs().sum() > 0 and metrics["val/moe_bias_max"] == bias.max()  # 6 steps moved it
    last = c.trainer.checkpoint_callback.last_model_path

    module = CausalLMModule.load_from_checkpoint(last).eval()  # MoE rebuilt from the checkpoint alone
    torch.testing.assert_close(module.net.blocks[1].mlp.expert_bias, bias)
    ids = torch.randint(0, 257, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(module(ids), c.model.eval()(ids))
    assert len(module.generate(["ROMEO:"], max_new_tokens=8, temperature=0)[0]) > 0


def test_expert_bias_stays_float32_when_the_net_is_cast_to_bf16_or_half():
    """Lightning's ``bf16-true`` casts the whole module: the bias keeps float32, so 1e-3 steps do not round away."""
    from lightning.pytorch.plugins import HalfPrecision

    net = tiny_gpt()
    moe = net.blocks[1].mlp
    moe.expert_bias.copy_(torch.linspace(-0.5, 0.5, E) + 1e-4)  # not representable in bf16
    exact = moe.expert_bias.clone()
    HalfPrecision("bf16-true").convert_module(net)
    assert moe.experts_fc.dtype == torch.bfloat16 and moe.expert_bias.dtype == torch.float32
    assert torch.equal(moe.expert_bias, exact)
    for cast in (lambda m: m.half(), lambda m: m.to("cpu", torch.float16), lambda m: m.to(torch.bfloat16)):
        cast(net)
        assert moe.expert_bias.dtype == torch.float32 and torch.equal(moe.expert_bias, exact)
    assert moe.router.weight.dtype == torch.bfloat16
    moe.load.copy_(torch.arange(E))  # the first half below the mean load, the rest above
    moe.update_bias()
    torch.testing.assert_close(moe.expert_bias - exact, torch.tensor([1e-3] * 4 + [-1e-3] * 4), rtol=0, atol=1e-7)
    with torch.no_grad():
        logits = net.eval()(torch.randint(0, 50, (2, 16)))  # routing runs on bf16 activations and the fp32 bias
    assert logits.dtype == torch.bfloat16 and logits.isfinite().all() and moe.load.sum() == 2 * 16 * 2
