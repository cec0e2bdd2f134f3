"""Configs as the hub publishes them, against transformers: deepseek-ai/DeepSeek-V3's own ``config.json`` (its exact
field set: ``auto_map`` to its modeling files, the old ``rope_scaling`` with YaRN, the FP8 ``quantization_config``,
the MoE and training fields) shrunk in its sizes, loaded by ``from_pretrained`` with logits and greedy continuations
equal to transformers', which loads the same folder without ``trust_remote_code``; YaRN on MHA (Llama) with the
attention factor from ``mscale``/``mscale_all_dim``; and what stays refused: custom code beside a model_type the zoo
does not implement, ``trust_remote_code``, quantized weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_gpt_pretrained import write_tokenizer

from zoo.errors import InputError
from zoo.gpt import from_pretrained
from zoo.gpt.formats.llama import export_hf, load_hf

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=1e-5)

# deepseek-ai/DeepSeek-V3's config.json, field for field, with its sizes shrunk (the original's in comments). The
# only other change: torch_dtype float32 (the tiny weights here are float32; the hub's are bfloat16).
HUB_DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 1,  # 3
    "hidden_act": "silu",
    "hidden_size": 64,  # 7168
    "initializer_range": 0.02,
    "intermediate_size": 96,  # 18432
    "kv_lora_rank": 16,  # 512
    "max_position_embeddings": 640,  # 163840 = 40 x 4096
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 24,  # 2048
    "moe_layer_freq": 1,
    "n_group": 4,  # 8
    "n_routed_experts": 8,  # 256
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,  # 128
    "num_experts_per_tok": 3,  # 8
    "num_hidden_layers": 3,  # 61
    "num_key_value_heads": 4,  # 128
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 24,  # 1536
    "qk_nope_head_dim": 12,  # 128
    "qk_rope_head_dim": 16,  # 64
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 16,  # 4096
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 2,  # 4
    "topk_method": "noaux_tc",
    "torch_dtype": "float32",  # bfloat16
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 10,  # 128
    "vocab_size": None,  # 129280: the tokenizer's, set when written
}
BF16 = {k: v for k, v in HUB_DEEPSEEK_V3.items() if k != "quantization_config"}  # as bf16 conversions publish it


def _perturb(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)
    return model.eval()


def write_hub_deepseek(folder: Path, config: dict) -> None:
    """A tiny random DeepSeek-V3 saved by transformers, its config.json then replaced by ``config`` (the hub's
    field set), with a tokenizer."""
    vocab = write_tokenizer(folder, "llama3")
    config = config | {"vocab_size": vocab}
    torch.manual_seed(0)
    ref = {k: v for k, v in config.items() if k not in ("auto_map", "quantization_config")}
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**ref))
    _perturb(model).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))


def reference(folder: Path):
    """transformers' model of ``folder`` as a user loads it: no trust_remote_code, so the auto_map is ignored."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert type(model) is transformers.DeepseekV3ForCausalLM  # its own class, not the folder's modeling file
    return model.eval()


@pytest.fixture(scope="module", params=["hub", "mscale-0.707"])
def hub(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepseek_v3")
    config = BF16
    if request.param != "hub":  # DeepSeek-V2-style mscale beside mscale_all_dim: cos and sin scaled too
        config = BF16 | {
            "rope_scaling": BF16["rope_scaling"] | {"mscale": 0.707, "factor": 4},
            "max_position_embeddings": 64,
        }
    write_hub_deepseek(folder, config)
    return reference(folder), from_pretrained(folder), folder


def test_the_hub_deepseek_v3_config_loads_with_transformers_logits(hub):
    """Past the original context (16) the YaRN frequencies, the tables' factor and the softmax's mscale^2 all count."""
    model, module, _ = hub
    x = torch.randint(0, model.config.vocab_size, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x).logits, **TOL)
    factor = model.config.rope_parameters["factor"]  # DeepSeek's mscale_all_dim 1: (0.1 ln factor + 1)^2
    assert module.net.blocks[0].attn.softmax_scale_factor == pytest.approx((0.1 * math.log(factor) + 1) ** 2)


def test_the_hub_deepseek_v3_greedy_continuation_is_transformers(hub):
    model, module, folder = hub
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    ids = transformers.AutoTokenizer.from_pretrained(folder)(prompt, return_tensors="pt").input_ids
    assert ids.shape[1] > 16  # the continuation runs past the original context
    theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8)
    ours = module.generate([prompt], max_new_tokens=8, temperature=0.0)[0]
    assert ours == module.tokenizer.decode(theirs[0, ids.shape[1] :].tolist())


def test_the_hub_deepseek_v3_exports_back_with_yarn(hub, tmp_path):
    model, module, _ = hub
    export_hf(module.net, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, model.config.vocab_size, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, **TOL)


def test_the_fp8_quantization_config_is_refused_naming_what_to_use(tmp_path):
    write_hub_deepseek(tmp_path, HUB_DEEPSEEK_V3)
    with pytest.raises(InputError, match="quantization_config .quant_method 'fp8'.*bf16") as err:
        from_pretrained(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"trust_remote_code": True}, "trust_remote_code"),  # asks for the folder's code outright
        ({"model_type": "deepseek_v32"}, "auto_map"),  # a model_type the zoo does not build: its code is needed
    ],
)
def test_custom_code_is_still_refused_beside_what_the_zoo_does_not_build(tmp_path, change, named):
    write_hub_deepseek(tmp_path, BF16)
    (tmp_path / "config.json").write_text(json.dumps(json.loads((tmp_path / "config.json").read_text()) | change))
    for load in (from_pretrained, load_hf):
        with pytest.raises(InputError, match=f"names custom code .*{named}"):
            load(tmp_path)


def test_llama_with_yarn_and_an_attention_factor_matches_transformers(tmp_path):
    """YaRN on MHA: the ramp over a head of 16 channels (base 500) and the tables' factor mscale/mscale_all_dim; no
    softmax factor (transformers' Llama has none)."""
    torch.manual_seed(0)
    rope = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 16}
    rope |= {"mscale": 0.8, "mscale_all_dim": 0.5, "beta_fast": 16}
    config = transformers.LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_parameters=rope,
    )  # fmt: skip
    model = _perturb(transformers.LlamaForCausalLM(config))
    model.save_pretrained(tmp_path)
    net = load_hf(tmp_path).eval()
    x = torch.randint(0, 101, (2, 50))
    export_hf(net, tmp_path / "out")  # and back, the tables' factor as stated
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(net(x), model(x).logits, **TOL)
        torch.testing.assert_close(back(x).logits, model(x).logits, **TOL)


def test_the_cli_fine_tunes_from_a_qwen3_moe_folder_with_yarn(tmp_path):
    """``init_weights: <folder>`` through cli.py, no net block: the recorded net (its YaRN scaling and dense layers
    among the arguments) is parsed back by the CLI, and its logits are transformers'."""
    from cli import main

    folder = tmp_path / "qwen3_moe"
    vocab = write_tokenizer(folder, "llama3")
    torch.manual_seed(0)
    rope = {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 12}
    config = transformers.Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=40, moe_intermediate_size=8, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=24, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, mlp_only_layers=[1], max_position_embeddings=48, rope_parameters=rope,
    )  # fmt: skip
    model = _perturb(transformers.Qwen3MoeForCausalLM(config))
    model.save_pretrained(folder)
    (tmp_path / "text.txt").write_text("the cat sat. " * 50)
    net = {"class_path": "zoo.gpt.CausalLMModule", "init_args": {"net": "zoo.gpt.GPT", "init_weights": str(folder)}}
    text = {"path": str(tmp_path / "text.txt"), "block_size": 16}
    data = {"class_path": "datamodules.TextDataModule", "init_args": text}
    c = main([f"--model={json.dumps(net)}", f"--data={json.dumps(data)}", "--trainer.logger=false"], run=False)
    c.model.trainer = None
    c.model.setup("fit")
    assert c.model.hparams.net["init_args"]["dense_layers"] == [1]
    x = torch.randint(0, vocab, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(c.model.eval()(x), model(x).logits, **TOL)
