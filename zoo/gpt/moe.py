"""A fine-grained mixture of experts as the GPT's MLP, chosen by config like any other MLP class:

    mlp:
      class_path: zoo.gpt.MoE
      init_args: {n_routed_experts: 8, num_experts_per_tok: 2, n_shared_experts: 1, routing: sigmoid_bias}

Each token goes through ``n_shared_experts`` always-on experts (one SwiGLU of their summed width, as DeepSeek
builds them) and the ``num_experts_per_tok`` routed experts its router picks, weighted by the router. Experts
are SwiGLUs stored as stacked tensors; dispatch sorts the (token, choice) slots by expert and runs one grouped
matmul (``F.grouped_mm``) over the experts' contiguous slices, or where that kernel does not run (fp32 on a GPU)
one matmul per expert: a Python loop over experts, never over tokens.

Two routers:
  "sigmoid_bias" (DeepSeek-V3, sec. 2.1.2): sigmoid affinities s; the top k of s + b are chosen (optionally
    only inside the ``topk_group`` groups whose two best biased scores sum highest); the weights are the chosen
    s (without b) normalised to sum 1, times ``routed_scaling_factor``. The bias b has no gradient: after each
    training step b_i += bias_update_rate * sign(mean load - load_i) (auxiliary-loss-free balancing).
  "softmax" (Switch Transformer, Mixtral): softmax over experts, top k renormalised to sum 1, and the
    load-balancing loss N * sum_i f_i P_i (Switch eq. 4; f_i counts all k choices, as Mixtral's
    ``load_balancing_loss_func``, so a balanced router scores k): in training ``forward`` returns it times
    ``aux_loss_coef`` beside its output, and ``losses.causal_lm_objective`` adds it to the loss.
``norm_topk_prob: false`` keeps the chosen weights as the router gave them (Qwen-MoE's default).

Hugging Face layouts (``hf_layout`` follows the routing): "sigmoid_bias" is DeepSeek-V3's MoE layer
(``mlp.gate.weight``, ``mlp.gate.e_score_correction_bias``, ``mlp.experts.{j}.{gate,up,down}_proj.weight``,
``mlp.shared_experts.*``), "softmax" without shared experts is Mixtral's (``block_sparse_moe.gate.weight``,
``block_sparse_moe.experts.{j}.w1/w3/w2.weight`` = gate/up/down). Both are read and written per expert, as
released and as transformers 5's ``save_pretrained`` writes them; transformers 5's in-memory fused tensors
(``mlp.experts.gate_up_proj`` (E, 2F, D) = [gate | up], ``mlp.experts.down_proj``) are read too.

References:
  Shazeer et al. 2017 (sparsely-gated MoE); Fedus et al. 2021, "Switch Transformers" (eq. 4);
  Jiang et al. 2024, "Mixtral of Experts"; Dai et al. 2024, "DeepSeekMoE" (fine-grained and shared experts);
  Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing"; DeepSeek-AI 2024, "DeepSeek-V3" (sec. 2.1.2).

Notation: B batch, T tokens, N = B*T, D model width, F expert width, E routed experts, k experts per token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.compat import apply_keeping_float32
from zoo.errors import InputError
from zoo.gpt.mlp import SwiGLU
from zoo.io.meta_load import Renamed

# Per-expert weight names inside a layer's MoE: (gate, up, down) in DeepSeek-V3/Qwen and in Mixtral files.
_EXPERT_NAMES = {"deepseek_v3": ("gate_proj", "up_proj", "down_proj"), "mixtral": ("w1", "w3", "w2")}


class MoE(nn.Module):
    """Shared SwiGLU experts plus ``num_experts_per_tok`` of ``n_routed_experts`` routed SwiGLU experts."""

    def __init__(
        self,
        dim: int,
        hidden: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
        n_routed_experts: int = 8,
        num_experts_per_tok: int = 2,
        n_shared_experts: int = 1,
        routing: Literal["sigmoid_bias", "softmax"] = "sigmoid_bias",
        routed_scaling_factor: float = 1.0,
        n_group: int = 1,
        topk_group: int = 1,
        bias_update_rate: float = 1e-3,
        aux_loss_coef: float = 0.01,
        norm_topk_prob: bool = True,
    ) -> None:
        """
        Args:
            dim: model width D (given by the GPT).
            hidden: width F of each routed expert (given by the GPT's ``mlp_hidden``); None: the width at which the
                k routed and the shared experts a token visits hold a dense SwiGLU's 8D/3 (rounded up to 8).
            bias: must be False (given by the GPT's ``bias``): experts and router have no biases, as DeepSeek's.
            dropout: dropout on the output (given by the GPT).
            n_routed_experts: routed experts E.
            num_experts_per_tok: routed experts k each token visits.
            n_shared_experts: always-on experts, built as one SwiGLU of width n_shared_experts * F (0: none).
            routing: "sigmoid_bias" (DeepSeek-V3, auxiliary-loss-free balancing) or "softmax" (Switch/Mixtral,
                with the auxiliary balance loss).
            routed_scaling_factor: scale of the routed experts' weights (DeepSeek-V3 uses 2.5; sigmoid_bias only).
            n_group: expert groups for group-limited routing (DeepSeek-V3: 8; sigmoid_bias only); 1: none.
            topk_group: groups a token's experts may come from (DeepSeek-V3: 4).
            bias_update_rate: step of the balancing bias per training step (DeepSeek-V3's gamma, 0.001).
            aux_loss_coef: weight of the balance loss in the training loss (softmax only; Switch uses 0.01).
            norm_topk_prob: normalise the k chosen weights to sum 1 (DeepSeek-V3, Mixtral); False: the router's own
                (sigmoid affinities or softmax probabilities, as Qwen-MoE's), times ``routed_scaling_factor``.
        """
        super().__init__()
        if bias:
            raise InputError("MoE experts have no biases (as DeepSeek-V3's): set the GPT's bias: false")
        if not 0 < num_experts_per_tok <= n_routed_experts or n_routed_experts % n_group:
            raise InputError(
                f"MoE needs 0 < num_experts_per_tok <= n_routed_experts and n_group dividing n_routed_experts, "
                f"got num_experts_per_tok={num_experts_per_tok}, n_routed_experts={n_routed_experts}, n_group={n_group}"
            )
        if not 0 < topk_group <= n_group or topk_group * (n_routed_experts // n_group) < num_experts_per_tok:
            raise InputError(
                f"MoE's topk_group={topk_group} groups of {n_routed_experts // n_group} experts cannot hold "
                f"num_experts_per_tok={num_experts_per_tok}: raise topk_group (at most n_group={n_group})"
            )
        k, e = num_experts_per_tok, n_routed_experts
        hidden = hidden or 8 * math.ceil(8 * dim / 3 / (k + n_shared_experts) / 8)
        self.k, self.n_group, self.topk_group = k, n_group, topk_group
        self.routing, self.routed_scaling_factor = routing, routed_scaling_factor
        self.bias_update_rate, self.aux_loss_coef = bias_update_rate, aux_loss_coef
        self.norm_topk_prob, self.n_shared_experts = norm_topk_prob, n_shared_experts
        self.hf_layout = "deepseek_v3" if routing == "sigmoid_bias" else "mixtral"  # its Hugging Face MoE layer
        self.router = nn.Linear(dim, e, bias=False)
        self.experts_fc = nn.Parameter(torch.empty(e, 2 * hidden, dim))  # [gate | up] per expert, as SwiGLU.fc
        self.experts_proj = nn.Parameter(torch.empty(e, dim, hidden))
        self.shared = SwiGLU(dim, n_shared_experts * hidden, bias=False) if n_shared_experts else None
        self.drop = nn.Dropout(dropout)
        # A buffer, so checkpoints save and resume it; float32 whatever the weights' precision.
        self.register_buffer("expert_bias", torch.zeros(e, dtype=torch.float32))
        self.init_buffers()
        for w in (self.experts_fc, self.experts_proj):
            nn.init.normal_(w, 0.0, 0.02)  # the GPT re-initialises; this keeps a lone MoE finite

    def init_buffers(self) -> None:
        """Routing statistics since the last reset (not saved): picks per expert, summed probabilities, tokens, on
        the default device (``GPT.init_buffers``). Counts are integers, so a net cast to bf16 keeps them exact."""
        e = self.router.out_features
        self.register_buffer("load", torch.zeros(e, dtype=torch.long), persistent=False)
        self.register_buffer("prob", torch.zeros(e), persistent=False)
        self.register_buffer("tokens", torch.zeros((), dtype=torch.long), persistent=False)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Tokens (N, D) -> chosen experts (N, k), their weights (N, k), each expert's probability (N, E)."""
        logits = F.linear(x.float(), self.router.weight.float())  # (N, E) in float32, as DeepSeek routes
        if self.routing == "softmax":
            probs = logits.softmax(-1)
            w, idx = probs.topk(self.k, dim=-1)  # (N, k)
            return idx, w / w.sum(-1, keepdim=True) if self.norm_topk_prob else w, probs
        scores = logits.sigmoid()  # (N, E) affinities s
        choice = scores + self.expert_bias  # the bias only decides who is chosen
        if self.n_group > 1:
            grouped = choice.view(len(x), self.n_group, -1)  # (N, G, E/G)
            group_score = grouped.topk(2, dim=-1).values.sum(-1)  # (N, G)
            keep = torch.zeros_like(group_score, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(self.topk_group, dim=-1).indices, True)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).view_as(choice)
        idx = choice.topk(self.k, dim=-1).indices  # (N, k)
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.routed_scaling_factor
        else:
            w = w * self.routed_scaling_factor
        return idx, w, scores / scores.sum(-1, keepdim=True)

    def experts(self, x: Tensor, idx: Tensor, w: Tensor) -> Tensor:
        """sum_j w[n, j] * expert_{idx[n, j]}(x[n]) for tokens (N, D): slots sorted by expert, each expert's slice one
        matmul (one grouped matmul for all of them where the kernel exists)."""
        order = idx.flatten().argsort(stable=True)  # (N*k,) slots grouped by expert
        token = order // self.k  # the token of each sorted slot
        counts = torch.bincount(idx.flatten(), minlength=len(self.experts_fc))  # (E,)
        xs = x[token]  # (N*k, D)
        if grouped_mm_fits(self.experts_fc):
            # One kernel over the jagged slices, and no host sync for the counts (offsets stay on the device).
            offs = counts.cumsum(0).to(torch.int32)
            gate, up = F.grouped_mm(xs.to(self.experts_fc.dtype), self.experts_fc.mT, offs=offs).chunk(2, dim=-1)
            y = F.grouped_mm(F.silu(gate) * up, self.experts_proj.mT, offs=offs).to(x.dtype)  # (N*k, D)
        else:
            out = []
            for e, xe in enumerate(xs.split(counts.tolist())):  # xe (n_e, D): the tokens routed to expert e
                gate, up = F.linear(xe, self.experts_fc[e]).chunk(2, dim=-1)  # (n_e, F) each
                out.append(F.linear(F.silu(gate) * up, self.experts_proj[e]))  # (n_e, D)
            y = torch.cat(out)
        y = y * w.flatten()[order, None].to(x.dtype)  # (N*k, D)
        return torch.zeros_like(x).index_add_(0, token, y)  # (N, D)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Output (B, T, D) and, training with softmax routing, the balance term aux_loss_coef * Switch eq. 4."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, D)
        idx, w, probs = self.route(x)
        y = self.experts(x, idx, w)
        if self.shared is not None:
            y = y + self.shared(x)[0]
        with torch.no_grad():
            self.load += torch.bincount(idx.flatten(), minlength=len(self.load))
            self.prob += probs.sum(0).to(self.prob.dtype)
            self.tokens += len(x)
        balance = None
        if self.training and self.routing == "softmax":
            balance = self.aux_loss_coef * balance_loss(idx, probs)
        return self.drop(y).view(shape), balance  # (B, T, D), scalar or None

    # -- balancing ---------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Tensor]:
        """Routing since the last ``reset_stats``: max/mean expert load, the balance loss, the bias range."""
        load, n = self.load.float(), self.tokens.clamp_min(1).float()
        f, p = load / n, self.prob.float() / n  # (E,) picks per token, mean probability
        out = {"load_max_over_mean": load.max() / load.mean().clamp_min(1e-9), "balance_loss": len(f) * (f * p).sum()}
        if self.routing == "sigmoid_bias":
            out |= {"bias_min": self.expert_bias.min(), "bias_max": self.expert_bias.max()}
        return {k: v.float() for k, v in out.items()}

    def reset_stats(self) -> None:
        for t in (self.load, self.prob, self.tokens):
            t.zero_()

    @torch.no_grad()
    def update_bias(self) -> None:
        """b_i += rate * sign(mean load - load_i) over the loads since the last reset (summed over ranks, so every
        rank keeps the same bias), then reset. Called once per optimizer step by ``CausalLMModule``: outside
        forward, so gradient accumulation and activation checkpointing's recompute never step it twice (a recompute
        counts every load twice, which leaves the signs as they are)."""
        if self.routing == "sigmoid_bias":
            load = self.load.float()
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(load)
            self.expert_bias += self.bias_update_rate * torch.sign(load.mean() - load).float()
        self.reset_stats()

    # -- the MLP protocol --------------------------------------------------------------------------------

    def flops_per_token(self) -> int:
        """Training FLOPs per token: the router and the experts a token visits (k routed and the shared)."""
        per_expert = self.experts_fc[0].numel() + self.experts_proj[0].numel()
        shared = 0 if self.shared is None else self.shared.flops_per_token()
        return 6 * (self.router.weight.numel() + self.k * per_expert) + shared

    def residual_projections(self) -> list[Tensor]:
        """The weights writing into the residual stream (every expert's down projection)."""
        return [self.experts_proj] + ([] if self.shared is None else self.shared.residual_projections())

    # -- precision ---------------------------------------------------------------------------------------

    def _apply(self, fn, recurse=True):
        """Casts (``.to(torch.bfloat16)``, ``.half()``, Lightning's ``bf16-true``) move ``expert_bias`` but keep it
        float32: in bf16 its 1e-3 steps round away beside a bias of order 0.1."""
        return apply_keeping_float32(self, fn, recurse, ("expert_bias",))

    # -- Hugging Face ------------------------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, config: dict) -> Callable[..., MoE]:
        """This class with the MoE settings of a Hugging Face DeepSeek-V3 or Mixtral config dict."""
        SwiGLU.from_hf_config(config)  # experts are SwiGLUs: refuses another hidden_act
        kind = config.get("model_type")
        if kind == "mixtral":
            return partial(
                cls,
                n_routed_experts=config["num_local_experts"],
                num_experts_per_tok=config["num_experts_per_tok"],
                n_shared_experts=0,
                routing="softmax",
                aux_loss_coef=config.get("router_aux_loss_coef", 0.001),
            )
        if kind == "qwen3_moe":  # the defaults are transformers' Qwen3MoeConfig's
            # transformers adds the balance loss only with output_router_logits (Qwen3's release: false)
            coef = config.get("router_aux_loss_coef", 0.001) if config.get("output_router_logits", False) else 0.0
            return partial(
                cls,
                n_routed_experts=cls.hf_experts(config),
                num_experts_per_tok=config.get("num_experts_per_tok", 8),
                n_shared_experts=0,
                routing="softmax",
                aux_loss_coef=coef,
                norm_topk_prob=config.get("norm_topk_prob", False),
            )
        if kind != "deepseek_v3":
            raise InputError(f"zoo.gpt.MoE reads DeepSeek-V3, Mixtral and Qwen3-MoE configs, not model_type {kind!r}")
        method = (config.get("scoring_func", "sigmoid"), config.get("topk_method", "noaux_tc"))
        if method != ("sigmoid", "noaux_tc") or config.get("moe_layer_freq", 1) != 1:
            raise InputError(
                f"DeepSeek MoE with scoring_func/topk_method {method} and moe_layer_freq "
                f"{config.get('moe_layer_freq', 1)} is not DeepSeek-V3's (sigmoid, noaux_tc, 1): not supported"
            )
        return partial(  # the defaults are transformers' DeepseekV3Config's
            cls,
            n_routed_experts=config.get("n_routed_experts", 256),
            num_experts_per_tok=config.get("num_experts_per_tok", 8),
            n_shared_experts=config.get("n_shared_experts", 1) or 0,
            routing="sigmoid_bias",
            routed_scaling_factor=config.get("routed_scaling_factor", 2.5),
            n_group=config.get("n_group") or 1,
            topk_group=config.get("topk_group") or 1,
            norm_topk_prob=config.get("norm_topk_prob", True),
        )

    @staticmethod
    def hf_experts(config: dict) -> int:
        """A Qwen3-MoE config's expert count: ``num_experts`` as released, ``num_local_experts`` as transformers 5
        saves it (its attribute_map); both, differing, refused."""
        named = {config[k] for k in ("num_experts", "num_local_experts") if k in config}
        if len(named) > 1:
            raise InputError(f"num_experts and num_local_experts differ ({sorted(named)}): fix config.json")
        return named.pop() if named else 128

    def hf_config(self, layout: str | None = None) -> dict:
        """The config.json keys of this MoE in ``layout`` (its ``hf_layout``, DeepSeek-V3's or Mixtral's; or
        "qwen3_moe", which a softmax MoE beside Qwen3's attention takes), or a refusal."""
        e, width = self.experts_proj.shape[0], self.experts_proj.shape[-1]
        if layout == "qwen3_moe":
            if self.shared is not None or self.routing != "softmax":
                raise InputError("A Qwen3-MoE layer routes by softmax, with no shared experts: set n_shared_experts: 0")
            return dict(
                hidden_act="silu",
                moe_intermediate_size=width,
                num_experts=e,
                num_experts_per_tok=self.k,
                norm_topk_prob=self.norm_topk_prob,
                router_aux_loss_coef=self.aux_loss_coef,
                output_router_logits=self.aux_loss_coef > 0,  # transformers' switch for the balance loss
            )
        if self.hf_layout == "mixtral":
            if self.shared is not None or not self.norm_topk_prob:
                raise InputError(
                    "A softmax-routed zoo.gpt.MoE exports as Mixtral, which has no shared experts and renormalises "
                    "its top-k weights: set n_shared_experts: 0 and norm_topk_prob: true"
                )
            return dict(
                hidden_act="silu",
                intermediate_size=width,
                num_local_experts=e,
                num_experts_per_tok=self.k,
                router_aux_loss_coef=self.aux_loss_coef,
                router_jitter_noise=0.0,
            )
        return dict(
            hidden_act="silu",
            moe_intermediate_size=width,
            n_routed_experts=e,
            num_experts_per_tok=self.k,
            n_shared_experts=self.n_shared_experts,
            routed_scaling_factor=self.routed_scaling_factor,
            n_group=self.n_group,
            topk_group=self.topk_group,
            norm_topk_prob=self.norm_topk_prob,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        )

    def to_hf(self, sd: dict[str, Tensor], layout: str | None = None) -> dict[str, Tensor]:
        """Our keys -> the released per-expert layout of ``layout`` (``hf_config``'s) inside a layer (transformers
        reads it)."""
        layout = layout or self.hf_layout
        pre = "block_sparse_moe." if layout == "mixtral" else "mlp."
        out = {f"{pre}gate.weight": sd["router.weight"]}
        if layout == "deepseek_v3":
            out[f"{pre}gate.e_score_correction_bias"] = sd["expert_bias"]
        gate, up = sd["experts_fc"].chunk(2, dim=1)  # (E, F, D) each
        names = _EXPERT_NAMES["mixtral" if layout == "mixtral" else "deepseek_v3"]  # Qwen's are DeepSeek's
        for j, tensors in enumerate(zip(gate, up, sd["experts_proj"])):
            out.update({f"{pre}experts.{j}.{n}.weight": w for n, w in zip(names, tensors)})
        if self.shared is not None:
            shared = {k.removeprefix("shared."): v for k, v in sd.items() if k.startswith("shared.")}
            out.update({k.replace("mlp.", "mlp.shared_experts.", 1): v for k, v in self.shared.to_hf(shared).items()})
        elif layout == "deepseek_v3":  # transformers builds shared experts of width 0: give it their weights
            d = sd["router.weight"].shape[1]
            empty = {"gate_proj": (0, d), "up_proj": (0, d), "down_proj": (d, 0)}
            out.update({f"mlp.shared_experts.{n}.weight": sd["router.weight"].new_empty(s) for n, s in empty.items()})
        return out

    def from_hf(self, sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """A layer's DeepSeek-V3 or Mixtral MoE keys (per expert, or transformers 5's fused tensors) -> ours. ``sd``
        may read its tensors as asked (``zoo.io.meta_load``): each expert's are copied into the stacked ones in turn,
        so no more than one is held beside them."""
        aliases = {"mlp." + k.removeprefix("block_sparse_moe."): k for k in sd if k.startswith("block_sparse_moe.")}
        sd = Renamed(sd, aliases | {k: k for k in sd})
        e = len(self.experts_fc)
        out = {"router.weight": sd["mlp.gate.weight"]}
        out["expert_bias"] = sd.get("mlp.gate.e_score_correction_bias", torch.zeros(e))  # Mixtral's router has none
        if "mlp.experts.gate_up_proj" in sd:
            out["experts_fc"], out["experts_proj"] = sd["mlp.experts.gate_up_proj"], sd["mlp.experts.down_proj"]
        else:
            names = next((n for n in _EXPERT_NAMES.values() if f"mlp.experts.0.{n[0]}.weight" in sd), None)
            if names is None:
                raise InputError(f"No expert weights (mlp.experts.0.gate_proj.weight or w1) among {sorted(sd)}")
            out["experts_fc"], out["experts_proj"] = _stacked_experts(sd, names, e)
        if self.shared is not None:
            shared = Renamed(sd, {k.replace("mlp.shared_experts.", "mlp.", 1): k for k in sd if "shared_experts." in k})
            out.update({f"shared.{k}": v for k, v in self.shared.from_hf(shared).items()})
        return out


def _stacked_experts(sd: Mapping[str, Tensor], names: tuple[str, str, str], e: int) -> tuple[Tensor, Tensor]:
    """Experts 0..e-1's (gate, up, down) matrices as our (E, 2F, D) [gate | up] and (E, D, F), each copied into its
    slot in turn; an expert whose shape differs from expert 0's is refused by name (a copy would broadcast it)."""
    gate, up, down = (f"mlp.experts.{{}}.{n}.weight" for n in names)
    first = sd[gate.format(0)]
    f, d = first.shape
    fc, proj = first.new_empty(e, 2 * f, d), first.new_empty(e, d, f)
    for j in range(e):
        for slot, key in ((fc[j, :f], gate), (fc[j, f:], up), (proj[j], down)):
            w = sd[key.format(j)]
            if w.shape != slot.shape:
                raise InputError(f"{key.format(j)} has shape {tuple(w.shape)}, expert 0's give {tuple(slot.shape)}")
            slot.copy_(w)
    return fc, proj


def grouped_mm_fits(w: Tensor) -> bool:
    """Whether ``F.grouped_mm`` runs these expert weights: any dtype on a CPU, bf16 on CUDA GPUs of compute
    capability 8.0 or more (its documented range); elsewhere the experts run one matmul each."""
    if not hasattr(F, "grouped_mm"):
        return False
    if w.device.type == "cpu":
        return True
    on_cuda = w.device.type == "cuda" and w.dtype == torch.bfloat16
    return on_cuda and torch.cuda.get_device_capability(w.device) >= (8, 0)


def balance_loss(idx: Tensor, probs: Tensor) -> Tensor:
    """Switch Transformer's eq. 4, N * sum_i f_i P_i: f_i the share of tokens routing a choice to expert i (no
    gradient), P_i the mean router probability of expert i; chosen indices (N, k), probabilities (N, E)."""
    n, e = probs.shape
    f = torch.bincount(idx.flatten(), minlength=e).to(probs.dtype) / n  # (E,)
    return e * (f * probs.mean(0)).sum()


def routers(net: nn.Module) -> list[MoE]:
    """The mixture-of-experts MLPs of ``net``, in order (none for a dense net)."""
    return [m for m in net.modules() if isinstance(m, MoE)]
