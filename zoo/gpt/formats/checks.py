"""What the Hugging Face converters (``zoo.gpt.formats.hf``, ``zoo.gpt.formats.llama``) check alike: a tensor the config
needs and the file lacks named in one line, and a tied head that the file does not tie."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.gpt import GPT

# The Hugging Face model types the zoo's GPT loads (``zoo.gpt.pretrained``): an ``auto_map`` beside one of these is
# ignored, as transformers ignores it for the types it implements itself.
MODEL_TYPES = (
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
    "phi3",
    "smollm3",
    "olmo2",
    "granite",
    "gemma2",
    "gemma3_text",
)
# What the zoo's GPT has not, for the MoE families it does not load.
REFUSED = {
    "qwen2_moe": "Qwen2-MoE has q/k/v-only attention biases and a sigmoid-gated shared expert (shared_expert_gate)",
}


def refused(kind: str) -> InputError:
    return InputError(f"{REFUSED[kind]}, which the zoo's GPT has not: model_type {kind!r} does not load")


@contextlib.contextmanager
def missing_tensors_named(name: str) -> Iterator[None]:
    """A converter's KeyError (a tensor the net's config needs that the file lacks) as one line naming it."""
    try:
        yield
    except KeyError as err:
        raise InputError(
            f"{name} lacks the tensor {err.args[0]!r} that the model its config.json describes has: the weights are "
            f"incomplete, or of another model than the config"
        ) from None


def check_tied_head(net: GPT, sd: dict[str, Tensor], name: str) -> None:
    """A tied net holds one matrix for the embedding and the head: a file whose two differ does not fit it."""
    if net.lm_head.weight is net.tok_emb.weight and not torch.equal(sd["lm_head.weight"], sd["tok_emb.weight"]):
        raise InputError(
            f"{name} has an output head that differs from its token embedding, but the net ties them "
            f"(tie_word_embeddings): set tie_word_embeddings (the net's tie_embeddings) to false to load both"
        )


def gemma_settings(net: GPT) -> list[str]:
    """The Gemma-style and windowing settings ``net`` has (``gemma.py``), which neither GPT-2's nor a Llama-family
    config holds: an exporter to those refuses a net that names any."""
    attn = net.blocks[0].attn
    named = [k for k in ("rope_local_base", "embed_scale", "logit_softcap") if getattr(net, k) is not None]
    named += [k for k in ("scale", "softcap") if getattr(attn, k, None) is not None and hasattr(attn, "qkv")]
    named += ["qk_norm_unit_offset"] * (getattr(getattr(attn, "q_norm", None), "hf_layout", None) == "gemma")
    return named + ["sandwich_norm"] * hasattr(net.blocks[0], "post_attn_norm")
