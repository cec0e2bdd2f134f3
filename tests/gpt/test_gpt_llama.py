"""The zoo's GPT against transformers' LlamaForCausalLM (MHA/GQA/MQA) and DeepseekV3ForCausalLM (MLA).

Tiny random references (every weight perturbed, norms included, so a missed key, a transposed block or
an eps off shows), saved with ``save_pretrained`` and imported through ``zoo.gpt.formats.llama``; and the other
way, a zoo net exported and loaded by transformers. Full forward, chunked prefill and cached decode are
compared with the reference's full forward at every position.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from test_moe_hf import REFERENCES as MOE_REFERENCES

from zoo.gpt import GPT, MHA, MLA, RMSNorm, SwiGLU
from zoo.gpt.formats.llama import export_hf, load_hf
from zoo.gpt.generate import make_cache

transformers = pytest.importorskip("transformers")

VOCAB, TOL = 101, dict(atol=1e-5, rtol=1e-5)


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def llama(kv_heads: int, tie: bool = False):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        attn_implementation="eager",
    )
    return perturb(transformers.LlamaForCausalLM(config))


def deepseek(q_lora_rank: int | None, interleave: bool = True):
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=q_lora_rank,
        qk_nope_head_dim=12,
        qk_rope_head_dim=8,
        v_head_dim=10,
        first_k_dense_replace=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 300.0},
        rope_interleave=interleave,
        attn_implementation="eager",
    )
    return perturb(transformers.DeepseekV3ForCausalLM(config))


REFERENCES = {
    "llama-mha": lambda: llama(4),
    "llama-gqa": lambda: llama(2),
    "llama-mqa-tied": lambda: llama(1, tie=True),
    "deepseek-qlora": lambda: deepseek(24),
    "deepseek-direct-q": lambda: deepseek(None),
    "deepseek-halfrope": lambda: deepseek(24, interleave=False),
    **MOE_REFERENCES,  # DeepSeek-V3 with MoE layers, Mixtral (test_moe_hf.py)
}


@pytest.fixture(params=list(REFERENCES))
def pair(request, tmp_path):
    model = REFERENCES[request.param]()
    model.save_pretrained(tmp_path)
    return model, load_hf(tmp_path).eval()


def test_imported_net_matches_the_reference_logits(pair):
    model, net = pair
    x = torch.randint(0, VOCAB, (2, 37))
    with torch.no_grad():
        torch.testing.assert_close(net(x), model(x).logits, **TOL)


def test_chunked_prefill_and_cached_decode_match_the_reference(pair):
    """Prefill in chunks of 5 and 4 tokens, then one token at a time, against the reference's full pass."""
    model, net = pair
    x = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        ref = model(x).logits
        cache = make_cache(net, 2, 16)
        bounds = [0, 5, 9] + list(range(10, 17))
        got = torch.cat([net(x[:, a:b], cache, a) for a, b in zip(bounds, bounds[1:])], dim=1)
    torch.testing.assert_close(got, ref, **TOL)


def test_greedy_generation_matches_transformers_generate(pair):
    from zoo.gpt.generate import generate

    model, net = pair
    prompt = torch.randint(0, VOCAB, (7,))
    ours = generate(net, [prompt], max_new_tokens=12, temperature=0.0)[0]
    theirs = model.generate(
        prompt[None], max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=0, eos_token_id=None
    )[0, 7:]
    assert torch.equal(ours, theirs)


ZOO_NETS = {
    "gqa": dict(attention=partial(MHA, n_kv_head=2)),
    "mla": dict(
        attention=partial(
            MLA, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, norm_eps=1e-6
        )
    ),
}


@pytest.mark.parametrize("variant", list(ZOO_NETS))
def test_exported_net_loads_in_transformers_with_the_same_logits(tmp_path, variant):
    torch.manual_seed(1)
    net = GPT(
        vocab_size=VOCAB,
        block_size=32,
        n_layer=2,
        n_embd=64,
        n_head=4,
        norm=RMSNorm,
        mlp=SwiGLU,
        position="rope",
        rope_base=700.0,
        bias=False,
        tie_embeddings=False,
        **ZOO_NETS[variant],
    )
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    net.eval()
    export_hf(net, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, VOCAB, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, net(x), **TOL)
    torch.testing.assert_close(load_hf(tmp_path)(x), net(x), atol=0, rtol=0)


def test_what_the_gpt_cannot_hold_is_refused_by_name(tmp_path):
    from zoo.gpt.formats.llama import deepseek_net_kwargs, llama_net_kwargs

    base = dict(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    with pytest.raises(ValueError, match="dynamic"):  # YaRN loads now (test_gpt_hub_configs.py)
        llama_net_kwargs(dict(base, rope_parameters={"rope_type": "dynamic", "rope_theta": 5e5, "factor": 4.0}))
    with pytest.raises(ValueError, match="sets mrope_section"):
        llama_net_kwargs(dict(base, rope_parameters={"rope_type": "yarn", "factor": 4.0, "mrope_section": [2]}))
    mla = dict(base, kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
    with pytest.raises(ValueError, match="MoE"):  # MoE layers load now (test_moe_hf.py); not DeepSeek-V2's routing
        deepseek_net_kwargs(dict(mla, first_k_dense_replace=1, scoring_func="softmax"))


def test_export_refuses_a_part_llama_has_not_as_its_class_states(tmp_path):
    from zoo.gpt import GeluMLP, LayerNorm, RMSNorm, SwiGLU

    for mlp, norm in ((GeluMLP, RMSNorm), (SwiGLU, LayerNorm)):
        net = GPT(vocab_size=VOCAB, block_size=8, n_layer=1, n_embd=16, n_head=2, norm=norm, mlp=mlp, position="rope")
        with pytest.raises(ValueError, match="Llama-shaped"):
            export_hf(net, tmp_path)


def test_causal_lm_module_init_weights_takes_a_llama_folder(tmp_path):
    from zoo.gpt import CausalLMModule
    from zoo.gpt.formats.hf import load_pretrained
    from zoo.gpt.formats.llama import llama_net_kwargs

    model = llama(2)
    model.save_pretrained(tmp_path)
    net = load_pretrained(GPT(**llama_net_kwargs(model.config.to_dict())), tmp_path).eval()
    x = torch.randint(0, VOCAB, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(net(x), model(x).logits, **TOL)
    assert CausalLMModule(net=net, init_weights=str(tmp_path)).hparams.init_weights == str(tmp_path)
