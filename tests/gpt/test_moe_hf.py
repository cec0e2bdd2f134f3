"""Mixture-of-experts nets against transformers: DeepSeek-V3 (MLA, sigmoid routing with groups, shared experts, dense
first layers) and Mixtral (GQA, softmax top-k) folders imported through ``zoo.gpt.formats.llama`` and compared with the
reference's full forward and cached greedy ``generate``; zoo MoE nets exported and loaded back by transformers and
by the zoo; and the configs that do not map refused by name.

Tiny random references, every weight perturbed and the routing bias set large enough to change the choices, so a
swapped gate/up, a dropped bias or scale, or a dense layer too many shows in the logits.
"""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from safetensors.torch import load_file

from zoo.errors import InputError
from zoo.gpt import GPT, MHA, MLA, MoE, RMSNorm
from zoo.gpt.formats.llama import export_hf, load_hf, net_kwargs

transformers = pytest.importorskip("transformers")

VOCAB, E, TOL = 101, 8, dict(atol=1e-5, rtol=1e-5)


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)  # large enough to change which experts are chosen
    return model.eval()


def deepseek(norm_topk_prob: bool = True):
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=24,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_nope_head_dim=12,
        qk_rope_head_dim=8,
        v_head_dim=10,
        first_k_dense_replace=1,
        n_routed_experts=E,
        num_experts_per_tok=3,
        n_shared_experts=2,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=norm_topk_prob,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 300.0},
        attn_implementation="eager",
    )
    return perturb(transformers.DeepseekV3ForCausalLM(config))


def mixtral():
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=E,
        num_experts_per_tok=2,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        router_aux_loss_coef=0.02,
        attn_implementation="eager",
    )
    return perturb(transformers.MixtralForCausalLM(config))


YARN = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 12}


def qwen3_moe(norm_topk_prob: bool, mlp_only_layers: list[int], step: int, rope: dict | None = None):
    """Qwen3-MoE: head_dim other than width/heads, dense layers where ``mlp_only_layers`` and ``decoder_sparse_step``
    say (layer i has experts when i is not listed and step divides i + 1)."""
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        num_experts=E,
        num_experts_per_tok=3,
        norm_topk_prob=norm_topk_prob,
        mlp_only_layers=mlp_only_layers,
        decoder_sparse_step=step,
        output_router_logits=norm_topk_prob,
        router_aux_loss_coef=0.02,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 500.0},
        attn_implementation="eager",
    )
    return perturb(transformers.Qwen3MoeForCausalLM(config))


# Imported and compared with the reference's full forward, chunked prefill with cached decode and greedy generate by
# test_gpt_llama.py's parity tests, beside the dense references. The sequences there (37 tokens) run past YaRN's
# original context (12).
REFERENCES = {
    "deepseek-v3-moe": deepseek,
    "deepseek-v3-unnormalised": lambda: deepseek(False),
    "mixtral": mixtral,
    "qwen3-moe-normalised-mlp-only": lambda: qwen3_moe(True, [0, 2], 1),  # experts in layers 1 and 3
    "qwen3-moe-sparse-step-yarn": lambda: qwen3_moe(False, [], 2, YARN),  # experts in layers 1 and 3, YaRN x4
}


def test_the_config_maps_onto_the_moe_settings():
    ds = net_kwargs(deepseek().config.to_dict())
    assert (ds["first_k_dense"], ds["dense_hidden"], ds["mlp_hidden"]) == (1, 96, 24)
    moe = ds["mlp"].keywords
    assert moe == dict(
        n_routed_experts=E,
        num_experts_per_tok=3,
        n_shared_experts=2,
        routing="sigmoid_bias",
        routed_scaling_factor=2.5,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
    )
    q = net_kwargs(qwen3_moe(True, [0, 2], 1).config.to_dict())
    assert (q["dense_layers"], q["dense_hidden"], q["mlp_hidden"]) == ([0, 2], 48, 16)
    assert q["mlp"].keywords == dict(
        n_routed_experts=E,
        num_experts_per_tok=3,
        n_shared_experts=0,
        routing="softmax",
        aux_loss_coef=0.02,  # transformers' balance term, which it adds with output_router_logits only
        norm_topk_prob=True,
    )
    q = net_kwargs(qwen3_moe(False, [3], 2).config.to_dict())  # layer 1 alone has experts
    assert q["dense_layers"] == [0, 2, 3] and q["mlp"].keywords["aux_loss_coef"] == 0.0
    mx = net_kwargs(mixtral().config.to_dict())
    assert mx["mlp"].keywords["routing"] == "softmax" and mx["mlp"].keywords["aux_loss_coef"] == 0.02
    assert mx["mlp"].keywords["n_shared_experts"] == 0 and mx["attention"].keywords == {"n_kv_head": 2}


def test_transformers_fused_expert_tensors_load_too(tmp_path):
    """transformers 5 holds experts as (E, 2F, D) gate_up_proj in memory and writes them so when asked."""
    model = deepseek()
    model.save_pretrained(tmp_path, save_original_format=False)
    assert "model.layers.1.mlp.experts.gate_up_proj" in load_file(tmp_path / "model.safetensors")
    x = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(load_hf(tmp_path).eval()(x), model(x).logits, **TOL)


ZOO_NETS = {
    "deepseek-v3": dict(
        attention=partial(
            MLA, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, norm_eps=1e-6
        ),
        first_k_dense=1,
        dense_hidden=48,
        mlp=partial(
            MoE,
            n_routed_experts=E,
            num_experts_per_tok=3,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.5,
        ),
    ),
    "mixtral": dict(
        attention=partial(MHA, n_kv_head=2),
        mlp=partial(MoE, n_routed_experts=E, num_experts_per_tok=2, n_shared_experts=0, routing="softmax"),
    ),
}


def zoo_net(variant: str) -> GPT:
    torch.manual_seed(1)
    net = GPT(
        vocab_size=VOCAB,
        block_size=32,
        n_layer=3,
        n_embd=64,
        n_head=4,
        norm=RMSNorm,
        position="rope",
        rope_base=700.0,
        bias=False,
        tie_embeddings=False,
        mlp_hidden=16,
        **ZOO_NETS[variant],
    )
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for block in net.blocks[1:]:
            if block.mlp.routing == "sigmoid_bias":  # softmax routing has no bias (nor has Mixtral's file)
                block.mlp.expert_bias.copy_(torch.randn(E) * 0.3)
    return net.eval()


@pytest.mark.parametrize("variant", list(ZOO_NETS))
def test_exported_moe_net_loads_in_transformers_and_back_unchanged(tmp_path, variant):
    net = zoo_net(variant)
    export_hf(net, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == {"deepseek-v3": "deepseek_v3", "mixtral": "mixtral"}[variant]
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert {"model.layers.2.mlp.experts.7.up_proj.weight", "model.layers.2.block_sparse_moe.experts.7.w3.weight"} & keys
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, VOCAB, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, net(x), **TOL)
    back = load_hf(tmp_path)
    ours, theirs = net.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(theirs[k], ours[k], atol=0, rtol=0, msg=k)


def test_moe_configs_the_gpt_cannot_hold_are_refused_by_name(tmp_path):
    from safetensors.torch import save_file

    from zoo.gpt.formats.hf import load_pretrained

    base = dict(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    with pytest.raises(InputError, match="shared_expert_gate"):
        net_kwargs(dict(base, model_type="qwen2_moe"))
    (tmp_path / "config.json").write_text(json.dumps(dict(base, model_type="qwen2_moe")))
    save_file({"model.norm.weight": torch.ones(16)}, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match="shared_expert_gate"):  # init_weights into a net built from YAML too
        load_pretrained(GPT(vocab_size=10, n_layer=2, n_embd=16, n_head=2), tmp_path)
    with pytest.raises(InputError, match="decoder_sparse_step 0"):
        net_kwargs(dict(base, model_type="qwen3_moe", decoder_sparse_step=0))
    with pytest.raises(InputError, match="num_experts and num_local_experts differ"):
        net_kwargs(dict(base, model_type="qwen3_moe", num_experts=4, num_local_experts=8))
    windowed = net_kwargs(
        dict(base, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=8)
    )
    assert windowed["sliding_window"] == 8  # held since issue 53, in every layer as MixtralModel masks them
    mla = dict(base, model_type="deepseek_v3", kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
    with pytest.raises(InputError, match="scoring_func"):
        net_kwargs(dict(mla, first_k_dense_replace=1, scoring_func="softmax", topk_method="greedy"))
    assert net_kwargs(dict(mla, first_k_dense_replace=1, n_routed_experts=4, n_group=2))["first_k_dense"] == 1


def test_export_of_a_moe_net_without_a_hugging_face_form_is_refused(tmp_path):
    for attention, routing in ((MHA, "sigmoid_bias"), (partial(MLA, kv_lora_rank=8), "softmax")):
        net = GPT(
            vocab_size=VOCAB, block_size=8, n_layer=2, n_embd=16, n_head=2, norm=RMSNorm, position="rope",
            bias=False, attention=attention, mlp=partial(MoE, n_routed_experts=4, routing=routing, n_shared_experts=0),
        )  # fmt: skip
        with pytest.raises(InputError, match="mixture-of-experts layers export as DeepSeek-V3"):
            export_hf(net, tmp_path / "out")
    net = GPT(
        vocab_size=VOCAB, block_size=8, n_layer=1, n_embd=16, n_head=2, norm=RMSNorm, position="rope", bias=False,
        mlp=partial(MoE, n_routed_experts=4, routing="softmax", n_shared_experts=1),
    )  # fmt: skip
    with pytest.raises(InputError, match="n_shared_experts: 0"):
        export_hf(net, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before writing


@pytest.mark.parametrize("name", ["qwen3-moe-normalised-mlp-only", "qwen3-moe-sparse-step-yarn"])
def test_an_imported_qwen3_moe_exports_back_to_qwen3_moe_with_the_same_logits(tmp_path, name):
    model = REFERENCES[name]()
    model.save_pretrained(tmp_path / "in")
    net = load_hf(tmp_path / "in")
    export_hf(net, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is transformers.Qwen3MoeForCausalLM
    assert back.config.mlp_only_layers == [0, 2] and back.config.norm_topk_prob == model.config.norm_topk_prob
    x = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, **TOL)
    ours, again = net.state_dict(), load_hf(tmp_path / "out").state_dict()
    assert all(torch.equal(again[k], v) for k, v in ours.items())
