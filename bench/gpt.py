"""The GPT against its peers, in one process, arms alternating: nanoGPT's model and litgpt.

Rows (zoo time / peer time; below 1 the zoo is faster; issue 16's targets beside them):
  train   one optimizer step, 4 layers, width 256, 4 heads, context 256, batch 8, byte vocabulary: forward,
  F.cross_entropy outside the net,
          zero_grad, backward, AdamW step, each project as its users get it: the zoo's AdamWCosine (fused
          AdamW on a CPU too), nanoGPT's configure_optimizers (fused only on CUDA), litgpt's torch.optim.AdamW
          defaults. vs nanoGPT: zoo GPT(mlp=GeluMLP(approximate="exact")), learned positions, tied head, against
          bench/nanogpt_ref.py (nanoGPT is a single file, not a package: an equivalent kept here).
          vs litgpt: zoo GPT(position="rope", tie_embeddings=False) against litgpt.model.GPT of the same
          shape (RoPE on all head channels, sequential residual, LayerNorm, GELU MLP 4x): same parameter count.
  decode  batch 1, a 2048-token prompt prefilled untimed, then --decode-tokens tokens fed one at a time
          with the KV cache, greedy argmax included, as tokens/s. MHA and MLA (q_lora_rank 128,
          kv_lora_rank 256, rope 32, nope 64, v 64) against litgpt's KV cache (which stores MLA's per-head
          keys and values; the zoo stores the latent). Then zoo MLA against zoo MHA at 16 heads of 64
          (2 layers, width 1024), where the latent cache is 7x smaller: the MLA target.
litgpt is not in the zoo's `bench` extra (its pins conflict with the zoo's): `pip install --no-deps litgpt psutil`.

    python bench/gpt.py                      # ~4 min on a 2-core CPU, 1 thread
    python bench/gpt.py --threads 2 --rounds 9 --parts train
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from bench import nanogpt_ref
from bench._common import RATIO_HEADERS, add_clock_arg, alternate, missing, peer_header, ratio_row, table
from zoo.gpt import GPT, MLA, GeluMLP
from zoo.gpt.generate import make_cache
from zoo.train.optim import AdamWCosine

V, L, D, H, T = 257, 4, 256, 4, 256
MLA_ARGS = dict(q_lora_rank=128, kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64)

try:
    from litgpt.config import Config as LitConfig
    from litgpt.model import GPT as LitGPT
except ImportError:
    LitGPT = None


def lit_gpt(block_size: int, mla: bool = False, n_layer: int = L, n_embd: int = D, n_head: int = H):
    cfg = LitConfig(
        block_size=block_size,
        vocab_size=V,
        padded_vocab_size=V,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        bias=True,
        norm_class_name="LayerNorm",
        parallel_residual=False,
        rotary_percentage=1.0,
        mlp_class_name="GptNeoxMLP",
        intermediate_size=4 * n_embd,
        gelu_approximate="none",
        n_query_groups=n_head,
        latent_attention=MLA_ARGS if mla else None,
    )
    return LitGPT(cfg)


def zoo_gpt(block_size: int, mla: bool = False, n_layer: int = L, n_embd: int = D, n_head: int = H, **kw) -> GPT:
    attn = {"attention": partial(MLA, **MLA_ARGS)} if mla else {}
    return GPT(
        vocab_size=V,
        block_size=block_size,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        mlp=partial(GeluMLP, approximate="exact"),
        **attn,
        **kw,
    )


def n_params(net) -> int:
    return sum(p.numel() for p in {id(p): p for p in net.parameters()}.values())


def train_step(net, opt, x, y, bf16: bool):
    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            logits = net(x)
        loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def train_rows(args) -> list:
    rows = []
    for bf16 in (False, True):
        b = 8
        x, y = torch.randint(0, V, (b, T)), torch.randint(0, V, (b, T))
        tag = f"train 4L/4H/256 T{T} B{b} {'bf16 autocast' if bf16 else 'fp32'}"
        torch.manual_seed(0)
        zoo = zoo_gpt(T)
        nano = nanogpt_ref.GPT(V, T, L, H, D)
        assert n_params(zoo) == n_params(nano), (n_params(zoo), n_params(nano))
        arms = {
            "zoo": train_step(zoo, AdamWCosine(lr=1e-4).configure(zoo, None)["optimizer"], x, y, bf16),
            "nanoGPT": train_step(nano, torch.optim.AdamW(nano.parameters(), lr=1e-4), x, y, bf16),
        }
        rows.append(ratio_row(f"{tag} vs nanoGPT", alternate(arms, args.rounds), "zoo", "nanoGPT", 0.95))
        if LitGPT is None:
            continue
        zoo_r, lit = zoo_gpt(T, position="rope", tie_embeddings=False), lit_gpt(T)
        assert n_params(zoo_r) == n_params(lit), (n_params(zoo_r), n_params(lit))
        arms = {
            "zoo": train_step(zoo_r, AdamWCosine(lr=1e-4).configure(zoo_r, None)["optimizer"], x, y, bf16),
            "litgpt": train_step(lit, torch.optim.AdamW(lit.parameters(), lr=1e-4), x, y, bf16),
        }
        rows.append(ratio_row(f"{tag} vs litgpt", alternate(arms, args.rounds), "zoo", "litgpt", 0.9))
    return rows


def zoo_decoder(net: GPT, ctx: int, n: int):
    ids = torch.randint(0, V, (1, ctx + n))
    cache = make_cache(net, 1, ctx + n)
    with torch.inference_mode():
        net(ids[:, :ctx], cache, 0)

    @torch.inference_mode()
    def decode():
        for i in range(ctx, ctx + n):
            net(ids[:, i : i + 1], cache, i)[:, -1].argmax(-1)

    return decode, cache


def lit_decoder(net, ctx: int, n: int):
    ids = torch.randint(0, V, (1, ctx + n))
    net.max_seq_length = ctx + n
    net.set_kv_cache(batch_size=1)
    with torch.inference_mode():
        net(ids[:, :ctx], input_pos=torch.arange(ctx), input_pos_maxp1=ctx)

    @torch.inference_mode()
    def decode():
        for i in range(ctx, ctx + n):
            net(ids[:, i : i + 1], input_pos=torch.tensor([i]), input_pos_maxp1=i + 1)[:, -1].argmax(-1)

    return decode


def cache_bytes(cache) -> int:
    """fp32 bytes per token per layer of a zoo cache."""
    return cache[0].numbers_per_token() * 4


def decode_rows(args) -> list:
    ctx, n, rows = 2048, args.decode_tokens, []
    block = ctx + n
    if LitGPT is not None:
        for mla in (False, True):
            torch.manual_seed(0)
            zoo, lit = zoo_gpt(block, mla, position="rope", tie_embeddings=False).eval(), lit_gpt(block, mla).eval()
            name = "MLA" if mla else "MHA"
            zoo_decode, cache = zoo_decoder(zoo, ctx, n)
            times = alternate({"zoo": zoo_decode, "litgpt": lit_decoder(lit, ctx, n)}, args.rounds)
            times = {k: [t / n for t in v] for k, v in times.items()}  # ms per token
            lit_bytes = 2 * H * (MLA_ARGS["qk_nope_head_dim"] + MLA_ARGS["qk_rope_head_dim"] if mla else D // H) * 4
            if mla:
                lit_bytes = (
                    H * (MLA_ARGS["qk_nope_head_dim"] + MLA_ARGS["qk_rope_head_dim"] + MLA_ARGS["v_head_dim"]) * 4
                )
            rows.append(
                ratio_row(
                    f"decode {name} ctx {ctx}, ms/token (cache B/token/layer: zoo {cache_bytes(cache)}, "
                    f"litgpt {lit_bytes})",
                    times,
                    "zoo",
                    "litgpt",
                    round(1 / 1.3, 3),
                )
            )
    torch.manual_seed(0)
    wide = dict(n_layer=2, n_embd=1024, n_head=16, position="rope", tie_embeddings=False)
    mha, mla = zoo_gpt(block, **wide).eval(), zoo_gpt(block, True, **wide).eval()
    (mha_decode, mha_cache), (mla_decode, mla_cache) = zoo_decoder(mha, ctx, n), zoo_decoder(mla, ctx, n)
    times = alternate({"mla": mla_decode, "mha": mha_decode}, args.rounds)
    times = {k: [t / n for t in v] for k, v in times.items()}
    ratio = cache_bytes(mha_cache) / cache_bytes(mla_cache)
    rows.append(
        ratio_row(
            f"decode zoo MLA vs zoo MHA, 2L/16H/1024 ctx {ctx}, ms/token (cache {ratio:.1f}x smaller)",
            times,
            "mla",
            "mha",
            1.0,
        )
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    add_clock_arg(ap)
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per arm (after one untimed)")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--parts", default="train,decode")
    args = ap.parse_args()
    peer_header("GPT: zoo vs nanoGPT (reference copy in bench/nanogpt_ref.py) and litgpt", args.threads, args.clock)
    if LitGPT is None:
        missing("litgpt", "pip install --no-deps litgpt psutil")
    rows = []
    if "train" in args.parts:
        rows += train_rows(args)
    if "decode" in args.parts:
        rows += decode_rows(args)
    print(table(RATIO_HEADERS, rows))


if __name__ == "__main__":
    main()
