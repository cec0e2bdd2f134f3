"""A pretrained load never holds the weights twice (``zoo.io.meta_load``): the net is built on the meta device, each
tensor read from the file becomes a parameter as it is, and nothing is left empty or shared by mistake.

Cheap (a 2-layer, width-32 Llama): what a revert to build-then-copy would change is watched directly (the random
init runs on real memory, the parameters are copies), not through memory figures (``bench/pretrained_memory.py``).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models

from zoo.errors import InputError
from zoo.gpt import GPT, MoE, RMSNorm, from_pretrained
from zoo.gpt.pretrained import net_kwargs, read_folder
from zoo.io import meta_load

transformers = pytest.importorskip("transformers")


def write_llama(folder: Path, dtype: torch.dtype = torch.float32):
    """A tiny random Llama (GQA, untied head) with a three-token tokenizer; returns the transformers model."""
    config = transformers.LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(folder)
    Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>")).save(
        str(folder / "tokenizer.json")
    )
    return model


# The parameters a Llama load takes as read (the fused q/k/v and gate/up are new tensors, made from those read).
AS_READ = ["tok_emb.weight", "lm_head.weight", "norm_f.weight"] + [
    f"blocks.{i}.{k}.weight" for i in range(2) for k in ("norm1", "norm2", "attn.proj", "mlp.proj")
]


def test_from_pretrained_builds_on_meta_and_keeps_the_tensors_it_reads(tmp_path, monkeypatch):
    model = write_llama(tmp_path)
    inits, reads = [], set()
    normal, get = torch.nn.init.normal_, meta_load.TensorFiles.__getitem__

    def spied_normal(tensor, *args, **kwargs):
        inits.append(tensor.is_meta)
        return normal(tensor, *args, **kwargs)

    def spied_get(self, key):
        reads.add((tensor := get(self, key)).data_ptr())
        return tensor

    monkeypatch.setattr(torch.nn.init, "normal_", spied_normal)
    monkeypatch.setattr(meta_load.TensorFiles, "__getitem__", spied_get)
    net = from_pretrained(tmp_path).net
    assert inits and all(inits)  # the random init ran, on meta tensors only: no memory, no time
    params = dict(net.named_parameters())
    assert all(params[k].data_ptr() in reads for k in AS_READ)  # assigned, not copied into a net of its own
    # The net's memory is its own: the file rewritten in place under it changes nothing.
    before = {k: p.clone() for k, p in net.state_dict().items()}
    path = tmp_path / "model.safetensors"
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\0" * (path.stat().st_size // 2))
    assert all(torch.equal(p, before[k]) for k, p in net.state_dict().items())
    ids = torch.tensor([[1, 5, 9, 2]])
    assert torch.allclose(net(ids), model(ids).logits, atol=1e-5)


def test_a_bf16_folder_loads_as_fp32_equal_to_its_weights(tmp_path):
    model = write_llama(tmp_path, torch.bfloat16)
    net = from_pretrained(tmp_path, dtype="float32").net  # auto: bf16 (tests/gpt/test_gpt_dtype.py)
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    assert torch.equal(net.blocks[1].mlp.proj.weight, model.model.layers[1].mlp.down_proj.weight.float())
    built = GPT(**net_kwargs(read_folder(tmp_path)[1]))
    assert torch.equal(net.rope_cos, built.rope_cos) and torch.equal(net.rope_sin, built.rope_sin)  # computed


def _kwargs(**extra) -> dict:
    return dict(vocab_size=16, block_size=8, n_layer=1, n_embd=16, n_head=2, norm=RMSNorm, position="rope") | extra


def _on_meta(**kwargs) -> GPT:
    with torch.device("meta"):
        net = GPT(**_kwargs(**kwargs))
    net.init_buffers()
    return net


@pytest.mark.parametrize("tied", [True, False])
def test_assigned_parameters_share_memory_only_where_the_net_ties_them(tied):
    sd = GPT(**_kwargs(tie_embeddings=tied)).state_dict()
    sd["lm_head.weight"] = sd["tok_emb.weight"]  # one tensor for both names, as a file without a head gives
    net = meta_load.assign_weights(_on_meta(tie_embeddings=tied), sd, "test")
    assert (net.lm_head.weight is net.tok_emb.weight) == tied
    assert (net.lm_head.weight.data_ptr() == net.tok_emb.weight.data_ptr()) == tied  # untied: trained apart
    assert torch.equal(net.lm_head.weight, net.tok_emb.weight)


def test_a_tensor_left_on_meta_or_of_another_shape_is_refused_by_name():
    with torch.device("meta"):
        net = GPT(**_kwargs())  # its RoPE tables never computed
    with pytest.raises(InputError, match=r"left 2 tensors of the net unset \(rope_cos, rope_sin\)"):
        meta_load.assign_weights(net, GPT(**_kwargs()).state_dict(), "test")
    sd = GPT(**_kwargs()).state_dict()
    sd["norm_f.weight"] = torch.ones(17)
    with pytest.raises(InputError, match=r"norm_f.weight has shape \(17,\), the net's is \(16,\)"):
        meta_load.assign_weights(_on_meta(), sd, "test")


def test_an_expert_of_another_shape_is_refused_not_broadcast():
    moe = MoE(16, 8, bias=False, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=0, routing="softmax")
    sd = {"mlp.gate.weight": torch.zeros(2, 16)}
    for j, (name, shape) in itertools.product(range(2), (("w1", (8, 16)), ("w3", (8, 16)), ("w2", (16, 8)))):
        sd[f"mlp.experts.{j}.{name}.weight"] = torch.ones(shape)
    sd["mlp.experts.1.w3.weight"] = torch.ones(1, 16)  # copied into its slot, this would fill all 8 rows
    with pytest.raises(InputError, match=r"mlp.experts.1.w3.weight has shape \(1, 16\), expert 0's give \(8, 16\)"):
        moe.from_hf(sd)


def test_the_routers_statistics_are_computed_on_a_net_built_on_meta():
    moe = _on_meta(mlp=lambda d, h, b, p: MoE(d, 8, b, p, n_routed_experts=2, num_experts_per_tok=1), bias=False)
    stats = {k: b for k, b in moe.named_buffers() if k.endswith(("load", "prob", "tokens"))}
    assert len(stats) == 3 and all(not b.is_meta and not b.any() for b in stats.values())
