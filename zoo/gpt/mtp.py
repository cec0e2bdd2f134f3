"""Multi-token prediction (DeepSeek-V3, section 2.2): D sequential modules that each predict one token further ahead.

Module k (1..D) reads, at every position i, the representation h^{k-1}_i the output head read at depth k-1 and the
embedding of token t_{i+k}, and predicts t_{i+k+1}:

    h'^k_i = M_k [enorm(Emb(t_{i+k})) ; hnorm(h^{k-1}_i)]     M_k: 2D -> D, no bias (``eh_proj``)
    h^k    = norm_k(TRM_k(h'^k))  over positions 0..T-k-1, causal (TRM_k: a full decoder block, MoE included)
    P^k    = OutHead(h^k)                                      OutHead and Emb: the main model's, shared

h^0 is what the main model's head reads, i.e. its last hidden state after the final norm, and each depth passes on
its own normed output. The training loss adds lambda / D * sum_k L_k to the next-token loss (``losses.mtp_loss``);
at inference the modules are dropped (the main model needs none of them) or draft tokens for speculative decoding
(``GPT.mtp_forward`` takes one depth at a time, with the same per-layer cache as the main blocks).

Two choices follow DeepSeek's released weights and the code that runs them rather than the paper's equation 21:
  - the concatenation is [embedding ; hidden], not [hidden ; embedding]: vLLM's ``deepseek_mtp.py``
    (``torch.cat([inputs_embeds, previous_hidden_states])``), SGLang's ``deepseek_nextn.py``, Megatron-LM's
    ``multi_token_prediction.py`` (``torch.cat((decoder_input, hidden_states))``) and transformers' ``MtpLayer``
    (whose ``mtp_hidden_states_first`` flag exists for checkpoints that differ) all put the embedding first.
  - h^0 is taken after the main model's final norm and h^k after ``shared_head.norm``: Megatron-LM feeds the decoder
    output (its final layernorm applied) to the first MTP layer and each layer's normed output to the next, and
    transformers' ``MTPCandidateGenerator`` feeds ``hidden_states[-1]``, the last hidden state after ``model.norm``.

Hugging Face layout (DeepSeek-V3 folders, as DeepSeek's ``README_WEIGHTS.md`` describes it): module k is
``model.layers.{L + k - 1}.*`` for L main layers, holding the decoder layer's usual keys plus ``enorm``, ``hnorm``,
``eh_proj``, ``shared_head.norm`` (norm_k) and copies of the shared ``embed_tokens`` and ``shared_head.head``;
``config.json`` counts them in ``num_nextn_predict_layers``. The zoo's module k is its block like the GPT's last (in
transformers' ``MtpModel`` a DeepSeek-V3 MTP block is always a mixture of experts).

Notation: B batch, T tokens, D model width, V vocabulary, k depth.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor, nn

from zoo.errors import InputError
from zoo.io.meta_load import Renamed

# (ours inside mtp.{k-1}., theirs inside model.layers.{L + k - 1}.), beside the decoder layer's own keys
_MTP_KEYS = [
    ("enorm.weight", "enorm.weight"),
    ("hnorm.weight", "hnorm.weight"),
    ("eh_proj.weight", "eh_proj.weight"),
    ("norm.weight", "shared_head.norm.weight"),
]


class MTPModule(nn.Module):
    """One depth k: (h^{k-1} (B, T, D), Emb(t_{.+k}) (B, T, D)) -> h^k (B, T, D), the input of the shared head."""

    def __init__(self, block: nn.Module, norm, dim: int, eps: float) -> None:
        """
        Args:
            block: TRM_k, a decoder block built as the GPT's last one (given by the GPT).
            norm: the GPT's norm class, for enorm, hnorm and the module's own final norm (``shared_head.norm``).
            dim: model width D.
            eps: the norms' epsilon.
        """
        super().__init__()
        self.enorm, self.hnorm = norm(dim, eps=eps), norm(dim, eps=eps)
        self.eh_proj = nn.Linear(2 * dim, dim, bias=False)  # M_k
        self.block = block
        self.norm = norm(dim, eps=eps)

    def combine(self, h: Tensor, emb: Tensor) -> Tensor:
        """h'^k = M_k [enorm(emb) ; hnorm(h)] (B, T, D): the embedding first, as DeepSeek's weights expect."""
        return self.eh_proj(torch.cat((self.enorm(emb), self.hnorm(h)), dim=-1))


def mtp_to_zoo(sd: dict[str, Tensor], net, interleave: bool, layers_to_zoo) -> dict[str, Tensor]:
    """The MTP modules of a DeepSeek-V3 state dict in ``net``'s keys (``mtp.{k}.*``); {} for a net without MTP.

    ``layers_to_zoo`` is ``llama.hf_to_zoo``: a module's block is a decoder layer, so it maps as layers 0..D-1 of a
    net whose blocks are the MTP blocks (the shared embedding and head it maps too are dropped here).
    """
    depth, n = len(net.mtp), net.n_layer
    if not depth:
        return {}
    missing = [n + k for k in range(depth) if f"model.layers.{n + k}.eh_proj.weight" not in sd]
    if missing:
        raise InputError(
            f"The net has mtp_depth={depth} but the folder has no multi-token prediction layer "
            f"model.layers.{missing[0]} (num_nextn_predict_layers too small or 0): set mtp_depth to the folder's "
            f"num_nextn_predict_layers, or 0 to load the main model alone"
        )
    names = {key: key for key in sd if not key.startswith("model.layers.")}
    for k in range(depth):
        pre = f"model.layers.{n + k}."
        names.update({f"model.layers.{k}.{key[len(pre) :]}": key for key in sd if key.startswith(pre)})
    view = SimpleNamespace(n_layer=depth, blocks=[m.block for m in net.mtp], mtp=[])
    out = {}
    for key, v in layers_to_zoo(Renamed(sd, names), view, interleave).items():
        if key.startswith("blocks."):
            k, rest = key.removeprefix("blocks.").split(".", 1)
            out[f"mtp.{k}.block.{rest}"] = v
    for k in range(depth):
        out.update({f"mtp.{k}.{ours}": sd[f"model.layers.{n + k}.{theirs}"] for ours, theirs in _MTP_KEYS})
    return out


def mtp_to_hf(sd: dict[str, Tensor], net, layers_to_hf) -> dict[str, Tensor]:
    """The inverse of ``mtp_to_zoo``, with the shared embedding and head copied into each module as DeepSeek's folders
    hold them (copies: safetensors refuses tensors sharing memory). ``layers_to_hf`` is ``llama.zoo_to_hf``."""
    depth, n = len(net.mtp), net.n_layer
    if not depth:
        return {}
    view_sd = {k: sd[k] for k in ("tok_emb.weight", "norm_f.weight", "lm_head.weight")}
    for k in range(depth):
        pre = f"mtp.{k}.block."
        view_sd.update({f"blocks.{k}.{key[len(pre) :]}": v for key, v in sd.items() if key.startswith(pre)})
    view = SimpleNamespace(n_layer=depth, blocks=[m.block for m in net.mtp], mtp=[])
    out = {}
    for key, v in layers_to_hf(view_sd, view).items():
        if key.startswith("model.layers."):
            k, rest = key.removeprefix("model.layers.").split(".", 1)
            out[f"model.layers.{n + int(k)}.{rest}"] = v
    for k in range(depth):
        pre = f"model.layers.{n + k}."
        out.update({pre + theirs: sd[f"mtp.{k}.{ours}"] for ours, theirs in _MTP_KEYS})
        out[pre + "embed_tokens.weight"] = sd["tok_emb.weight"].clone()
        out[pre + "shared_head.head.weight"] = sd["lm_head.weight"].clone()
    return out


def hf_mtp_depth(config: dict) -> int:
    """The MTP modules a DeepSeek-V3 ``config.json`` declares (``num_nextn_predict_layers``; transformers' alias
    ``num_mtp_layers``)."""
    return int(config.get("num_nextn_predict_layers", config.get("num_mtp_layers", 0)) or 0)
