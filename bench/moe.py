"""The mixture-of-experts MLP against what it replaces and against transformers' own, in one process, arms alternating.

Rows (zoo time / peer time; below 1 the zoo is faster):
  step    one optimizer step of a 4-layer, width-192 GPT (MLA attention, byte vocabulary, context 128, batch 16):
          DeepSeek-V3-style MoE (first block dense, then 16 routed experts of width 128, 3 per token, 1 shared) against
          the dense SwiGLU GPT of equal active parameters (hidden 512 = (3 + 1) x 128). The FLOPs ratio beside it
          (``GPT.flops_per_token``) is what the step would cost if dispatch were free: the router and the sort/gather
          /scatter are the rest.
  layer   forward and backward of one MoE layer over 16 x 128 tokens: the zoo's ``MoE`` against transformers'
          ``DeepseekV3MoE`` holding the same weights (outputs checked equal first), with transformers' default
          per-expert loop ("eager") and with its "grouped_mm" experts.

    python bench/moe.py --clock cpu           # ~2 min on a 2-core CPU, 1 thread
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from bench._common import RATIO_HEADERS, add_clock_arg, alternate, missing, peer_header, ratio_row, table
from zoo.gpt import GPT, MLA, MoE, RMSNorm, SwiGLU
from zoo.train.optim import AdamWCosine

V, L, D, H, T, B = 256, 4, 192, 6, 128, 16
E, K, SHARED, FW = 16, 3, 1, 128


def gpt(moe: bool) -> GPT:
    torch.manual_seed(0)
    mla = partial(MLA, kv_lora_rank=128, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
    mlp = partial(MoE, n_routed_experts=E, num_experts_per_tok=K, n_shared_experts=SHARED) if moe else SwiGLU
    return GPT(
        V,
        T,
        L,
        D,
        H,
        attention=mla,
        norm=RMSNorm,
        mlp=mlp,
        mlp_hidden=FW if moe else (K + SHARED) * FW,
        first_k_dense=1,
        dense_hidden=(K + SHARED) * FW,
        position="rope",
        bias=False,
        tie_embeddings=False,
    )


def train_step(net: GPT, x, y):
    opt = AdamWCosine(lr=1e-4).configure(net, None)["optimizer"]

    def step():
        loss = F.cross_entropy(net(x).view(-1, V), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def step_rows(args) -> list:
    x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    moe, dense = gpt(True), gpt(False)
    flops = moe.flops_per_token(T) / dense.flops_per_token(T)
    arms = {"moe": train_step(moe, x, y), "dense": train_step(dense, x, y)}
    label = f"step {L}L/{D} T{T} B{B}: MoE {E}x{FW} top-{K}+{SHARED} vs dense {(K + SHARED) * FW} (FLOPs x{flops:.3f})"
    return [ratio_row(label, alternate(arms, args.rounds), "moe", "dense")]


def fwd_bwd(layer, x):
    def run():
        layer(x).square().mean().backward()

    return run


def layer_rows(args) -> list:
    try:
        import transformers
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    except ImportError:
        missing("transformers", "pip install transformers")
        return []
    config = transformers.DeepseekV3Config(
        hidden_size=D,
        moe_intermediate_size=FW,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_shared_experts=SHARED,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
    )
    torch.manual_seed(0)
    ours = MoE(D, FW, n_routed_experts=E, num_experts_per_tok=K, n_shared_experts=SHARED)
    for p in ours.parameters():
        torch.nn.init.normal_(p, 0.0, 0.05)
    x = torch.randn(B, T, D)
    rows = []
    for impl in ("eager", "grouped_mm"):
        config._experts_implementation = impl
        ref = DeepseekV3MoE(config)
        with torch.no_grad():
            ref.gate.weight.copy_(ours.router.weight)
            ref.experts.gate_up_proj.copy_(ours.experts_fc)
            ref.experts.down_proj.copy_(ours.experts_proj)
            gate, up = ours.shared.fc.weight.chunk(2)
            ref.shared_experts.gate_proj.weight.copy_(gate)
            ref.shared_experts.up_proj.weight.copy_(up)
            ref.shared_experts.down_proj.weight.copy_(ours.shared.proj.weight)
            torch.testing.assert_close(ours(x), ref(x), atol=1e-4, rtol=1e-4)  # the same layer, or no race
        times = alternate({"zoo": fwd_bwd(ours, x), impl: fwd_bwd(ref, x)}, args.rounds)
        rows.append(
            ratio_row(f"layer fwd+bwd {B * T} tokens vs transformers DeepseekV3MoE ({impl})", times, "zoo", impl)
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    add_clock_arg(ap)
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per arm (after one untimed)")
    ap.add_argument("--parts", default="step,layer")
    args = ap.parse_args()
    peer_header(
        "MoE: the zoo's mixture of experts vs the dense GPT and transformers' DeepseekV3MoE", args.threads, args.clock
    )
    rows = []
    if "step" in args.parts:
        rows += step_rows(args)
    if "layer" in args.parts:
        rows += layer_rows(args)
    print(table(RATIO_HEADERS, rows))


if __name__ == "__main__":
    main()
