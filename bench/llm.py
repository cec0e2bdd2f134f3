"""GPT family: training step time, cached and uncached decode speed, and KV-cache bytes for MHA, GQA, MLA.

One fixed shape for every variant: 4 layers, width 256, 4 heads of 64, byte vocabulary (257 ids),
learned positions, LayerNorm, GELU MLP 4x, tied head (``zoo.gpt.GPT``'s defaults). The variants:

  plain  a self-contained nanoGPT-style GPT written below (fused qkv Linear, SDPA with is_causal=True,
         GELU(tanh) MLP, learned positions, tied head), of the zoo MHA net's shape: the same parameter
         count (asserted) and the same parameter names, so it loads the zoo MHA's initial weights and
         the two must print the same loss (training only: the reference the zoo is timed against)
  mha    GPT(attention=MHA): 4 query heads, 4 key-value heads
  gqa    GPT(attention=partial(MHA, n_kv_head=2)): 4 query heads sharing 2 key-value heads
  mla    GPT(attention=partial(MLA, ...)) with DeepSeek-V2's proportions for head size 64: kv_lora_rank 256 (4 x 64),
         qk_rope_head_dim 32 (64 / 2), qk_nope_head_dim 64, v_head_dim 64; queries projected directly

Three parts:

  train   context 256, batch 8: forward, F.cross_entropy, zero_grad(set_to_none=True), backward,
          torch.optim.AdamW step (fused=True on CUDA; PyTorch's default implementation on a CPU), under
          torch.autocast(bf16) with --dtype bf16. Every variant sees the same random batches. Each is
          built and warmed up (untimed), then --repeats rounds time --steps steps of every variant in
          turn, in the order plain, mha, gqa, mla and reversed in every other round (ABBA): plain and
          mha always run next to each other and a linear drift in load cancels. ms/step and tokens/s
          (batch x context / step time) are medians over rounds, "range" the min-max, "x plain" the
          median of the per-round ratios of step time to plain's (> 1: slower than plain).
          Target: the zoo MHA no slower than plain, x plain <= 1.02 (2% for noise).
  decode  batch 1, block_size 512, greedy. The prompt (496 random ids) is prefilled untimed; then the
          tokens at positions 496..511 (16 by default, --decode-tokens) are fed one at a time and the
          clock covers those forwards and the argmax after each, the last attending to all 512
          positions. "cache": ``zoo.gpt.generate.make_cache`` and net(new id, cache, pos), as
          ``generate(use_cache=True)`` does (MLA reads its latent cache with absorbed up-projections);
          "recompute": net(all ids so far) per token, as ``generate(use_cache=False)``. One untimed
          run of each, then --repeats rounds in the same ABBA order, the two modes alternating too.
          "speedup" is the median of the per-round ratios. "same ids" checks that both modes and
          ``generate()`` itself chose the same tokens (an untrained net's near-equal logits could in
          principle tie differently). With --dtype bf16 the cache is allocated in the autocast dtype
          (bf16), as ``generate()`` does under autocast. Target: cache at least 5x the recompute tokens/s, every
          variant.
  cache   bytes per token per layer of the buffers ``make_cache(net, 1, 512)`` allocates (``.a`` and
          ``.b`` of each layer, nbytes / 512), in fp32 and bf16, for the benchmarked shape (4 heads) and
          for 16 heads of 64 (width 1024; GQA keeps 2 key-value heads). MHA caches 2 x heads x head size
          numbers per token and layer, MLA kv_lora_rank + qk_rope_head_dim = 4d + d/2, so
          MLA / MHA = 4.5 d / (2 H d) = 2.25 / H: the table prints the measured ratio beside it.
          The nets for this part are built on the meta device (no memory, no compute).

Figures, not tests: the script prints MET/MISSED beside each target and always exits 0. On a
shared CPU, a neighbour's burst of work can slow a 2-thread step several-fold for a few seconds (the
"range" columns show it); the medians of paired ratios absorb a round or two of that, and
``--threads 1`` trades speed for much steadier figures.

    python bench/llm.py                              # ~1.5 min on 2 idle CPU cores (fp32); 5.6 min seen
                                                     # while a neighbour's load made steps ~7x slower
    python bench/llm.py --device cuda --dtype bf16   # defaults there: 10 warm-up, 9 rounds x 20 steps
    python bench/llm.py --variants mha,mla --steps 2 --repeats 2 --parts train,cache
    python bench/llm.py --dtype bf16 --steps 1 --repeats 1 --warmup 0 --decode-tokens 2   # ~2 min here: a CPU
        without native bf16 (AVX2 only) takes ~17 s per bf16 training step and ~0.4 s per decoded token
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench._common import median, now, print_header, resolve_device, set_threads, spread, sync, table
from zoo.gpt import GPT, MHA, MLA, generate
from zoo.gpt.generate import make_cache

SEED = 0
VOCAB, N_LAYER, N_EMBD, N_HEAD, HEAD = 257, 4, 256, 4, 64
TRAIN_CONTEXT, TRAIN_BATCH = 256, 8
DECODE_CONTEXT, DECODE_TOKENS = 512, 16
MLA_ARGS = dict(kv_lora_rank=4 * HEAD, qk_rope_head_dim=HEAD // 2, qk_nope_head_dim=HEAD, v_head_dim=HEAD)
VARIANTS = {  # name: GPT keyword arguments on top of the shared shape
    "mha": dict(attention=MHA),
    "gqa": dict(attention=partial(MHA, n_kv_head=2)),
    "mla": dict(attention=partial(MLA, **MLA_ARGS)),
}
PARTS = ("train", "decode", "cache")
# (warmup steps, timed steps per round, rounds): a CPU step here is ~0.3-0.5 s, a GPU one a few ms.
DEFAULTS = {"cpu": (1, 2, 9), "cuda": (10, 20, 9)}
TRAIN_TARGET = 1.02  # zoo MHA step time / plain step time, median over rounds
DECODE_TARGET = 5.0  # cached / recomputed tokens/s at context 512


# ---------------------------------------------------------------- the plain reference (nanoGPT's model.py, trimmed)
class PlainAttention(nn.Module):
    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, H, T, d)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class PlainMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class PlainBlock(nn.Module):
    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), PlainAttention(dim, n_head)
        self.norm2, self.mlp = nn.LayerNorm(dim), PlainMLP(dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PlainGPT(nn.Module):
    """Token ids (B, T) -> logits (B, T, V). Parameter names follow ``zoo.gpt.GPT`` so its weights load."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(PlainBlock(n_embd, n_head) for _ in range(n_layer))
        self.norm_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx: Tensor) -> Tensor:
        x = self.tok_emb(idx) + self.pos_emb.weight[: idx.shape[1]]  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


# ---------------------------------------------------------------- building
def zoo_net(variant: str, block_size: int, n_head: int = N_HEAD) -> GPT:
    torch.manual_seed(SEED)
    return GPT(
        vocab_size=VOCAB,
        block_size=block_size,
        n_layer=N_LAYER,
        n_embd=n_head * HEAD,
        n_head=n_head,
        **VARIANTS[variant],
    )


def n_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())  # parameters() lists the tied head once


def train_nets(names: list[str]) -> tuple[dict[str, nn.Module], dict[str, int]]:
    """plain and the named zoo variants, and each one's training FLOPs per token (plain counted as mha)."""
    nets = {v: zoo_net(v, TRAIN_CONTEXT) for v in VARIANTS if v in names or v == "mha"}
    plain = PlainGPT(VOCAB, TRAIN_CONTEXT, N_LAYER, N_EMBD, N_HEAD)
    assert n_params(plain) == n_params(nets["mha"]), (n_params(plain), n_params(nets["mha"]))
    plain.load_state_dict(nets["mha"].state_dict())  # same names, same shapes: the same function
    flops = {v: n.flops_per_token(TRAIN_CONTEXT) for v, n in nets.items()}
    flops["plain"] = flops["mha"]
    return {"plain": plain, **{v: nets[v] for v in names}}, flops


# ---------------------------------------------------------------- train
@dataclass
class Run:
    name: str
    step: Callable[[], Tensor]  # one training step, returning the loss
    params: int
    flops_per_token: int
    times: list[float] = field(default_factory=list)  # seconds per round of --steps steps
    loss: float = float("nan")


def make_train_step(
    net: nn.Module, batches: list[tuple[Tensor, Tensor]], device: torch.device, bf16: bool
) -> Callable[[], Tensor]:
    net.to(device).train()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, fused=device.type == "cuda")
    state = {"i": 0}

    def step() -> Tensor:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = net(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def bench_train(names: list[str], device: torch.device, bf16: bool, warmup: int, steps: int, repeats: int) -> None:
    tokens = TRAIN_BATCH * TRAIN_CONTEXT
    print(
        f"\n-- train: batch {TRAIN_BATCH} x context {TRAIN_CONTEXT} = {tokens} tokens/step; {warmup} warm-up "
        f"step(s), then {repeats} rounds of {steps} steps"
    )
    g = torch.Generator().manual_seed(SEED + 1)
    batches = []
    for _ in range(4):  # a few distinct batches, cycled; targets are the inputs shifted by one
        ids = torch.randint(0, VOCAB, (TRAIN_BATCH, TRAIN_CONTEXT + 1), generator=g)
        batches.append((ids[:, :-1].to(device), ids[:, 1:].to(device)))
    nets, flops = train_nets(names)
    runs = [Run(v, make_train_step(n, batches, device, bf16), n_params(n), flops[v]) for v, n in nets.items()]
    for r in runs:
        t = now(device)
        for _ in range(warmup):
            r.step()
        print(f"   {r.name}: warmed up ({warmup} step(s), {now(device) - t:.1f} s)", flush=True)

    for i in range(repeats):
        for r in runs if i % 2 == 0 else runs[::-1]:
            t0 = now(device)
            for _ in range(steps):
                loss = r.step()
            r.times.append(now(device) - t0)
            r.loss = float(loss)
        print(
            f"   round {i + 1}/{repeats} ms/step: "
            + ", ".join(f"{r.name} {r.times[-1] / steps * 1e3:.0f}" for r in runs),
            flush=True,
        )

    plain = runs[0]
    rows = []
    for r in runs:
        ms = [t / steps * 1e3 for t in r.times]
        ratio = median([t / p for t, p in zip(r.times, plain.times)])
        tps = tokens / (median(ms) / 1e3)
        rows.append(
            [
                r.name,
                f"{r.params / 1e6:.3f}M",
                f"{median(ms):.1f}",
                spread(ms, 1),
                f"{tps:,.0f}",
                f"{ratio:.3f}",
                f"{tps * r.flops_per_token / 1e9:.1f}",
                f"{r.loss:.4f}",
            ]
        )
    print(table(["variant", "params", "ms/step", "range", "tokens/s", "x plain", "GFLOP/s", "loss"], rows))
    print(
        "   (GFLOP/s from GPT.flops_per_token: 6 x matmul weights + attention; plain counted as mha. "
        "plain and mha start from the same weights and see the same batches, so their losses should agree.)"
    )
    mha = next((r for r in runs if r.name == "mha"), None)
    if mha is not None:
        ratios = [t / p for t, p in zip(mha.times, plain.times)]
        value = median(ratios)
        verdict = "MET" if value <= TRAIN_TARGET else "MISSED"
        print(
            f"target train: zoo mha step time <= {TRAIN_TARGET:.2f} x plain -> {value:.3f} "
            f"(rounds {spread(ratios)}; {median([t / steps * 1e3 for t in mha.times]):.1f} vs "
            f"{median([t / steps * 1e3 for t in plain.times]):.1f} ms/step): {verdict}"
        )


# ---------------------------------------------------------------- decode
@dataclass
class Decode:
    name: str
    net: GPT
    prompt: Tensor  # (1, P)
    times: dict[str, list[float]] = field(default_factory=lambda: {"cache": [], "recompute": []})
    ids: dict[str, Tensor] = field(default_factory=dict)


@torch.inference_mode()
def decode_once(d: Decode, use_cache: bool, n_new: int, device: torch.device, bf16: bool) -> tuple[float, Tensor]:
    """Prefill the prompt (untimed), then time n_new single-token steps; returns (seconds, the ids fed)."""
    p = d.prompt.shape[1]
    tokens = torch.zeros(1, p + n_new, dtype=torch.long, device=device)
    tokens[:, :p] = d.prompt
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        cache = make_cache(d.net, 1, p + n_new) if use_cache else None
        logits = d.net(d.prompt, cache, 0)[:, -1]  # (1, V)
        t0 = now(device)
        for pos in range(p, p + n_new):
            tokens[:, pos] = logits.argmax(dim=-1)
            if use_cache:
                logits = d.net(tokens[:, pos : pos + 1], cache, pos)[:, -1]
            else:
                logits = d.net(tokens[:, : pos + 1])[:, -1]
        elapsed = now(device) - t0
    return elapsed, tokens[0, p:].clone()


def bench_decode(names: list[str], device: torch.device, bf16: bool, repeats: int, n_new: int) -> None:
    p = DECODE_CONTEXT - n_new
    print(
        f"\n-- decode: batch 1, greedy, prompt {p} ids prefilled untimed, then {n_new} timed steps at positions "
        f"{p}..{DECODE_CONTEXT - 1} (block_size {DECODE_CONTEXT}); 1 warm-up, then {repeats} rounds"
    )
    g = torch.Generator().manual_seed(SEED + 2)
    prompt = torch.randint(0, VOCAB, (1, p), generator=g).to(device)
    runs = [Decode(v, zoo_net(v, DECODE_CONTEXT).to(device).eval(), prompt) for v in names]
    modes = ("cache", "recompute")
    for d in runs:
        for m in modes:
            _, d.ids[m] = decode_once(d, m == "cache", n_new, device, bf16)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            d.ids["generate"] = generate(d.net, [prompt[0]], n_new, temperature=0.0, use_cache=True)[0]
    for i in range(repeats):
        for d in runs if i % 2 == 0 else runs[::-1]:
            for m in modes if i % 2 == 0 else modes[::-1]:
                d.times[m].append(decode_once(d, m == "cache", n_new, device, bf16)[0])
        print(
            f"   round {i + 1}/{repeats} tokens/s cache/recompute: "
            + ", ".join(
                f"{d.name} {n_new / d.times['cache'][-1]:.0f}/{n_new / d.times['recompute'][-1]:.1f}" for d in runs
            ),
            flush=True,
        )

    rows, speedup = [], {}
    for d in runs:
        tps = {m: [n_new / t for t in d.times[m]] for m in modes}
        speedups = [r / c for c, r in zip(d.times["cache"], d.times["recompute"])]  # paired within a round
        speedup[d.name] = median(speedups)
        same = all(torch.equal(d.ids["cache"], d.ids[k]) for k in ("recompute", "generate"))
        rows.append(
            [
                d.name,
                f"{median(tps['cache']):.1f}",
                spread(tps["cache"], 1),
                f"{median(d.times['cache']) / n_new * 1e3:.2f}",
                f"{median(tps['recompute']):.1f}",
                spread(tps["recompute"], 1),
                f"{median(d.times['recompute']) / n_new * 1e3:.1f}",
                f"{speedup[d.name]:.1f}x",
                spread(speedups, 1),
                "yes" if same else "NO",
            ]
        )
    print(
        table(
            [
                "variant",
                "cache tok/s",
                "range",
                "ms/tok",
                "recompute tok/s",
                "range",
                "ms/tok",
                "speedup",
                "range",
                "same ids",
            ],
            rows,
        )
    )
    verdict = "MET" if all(x >= DECODE_TARGET for x in speedup.values()) else "MISSED"
    print(
        f"target decode: cached >= {DECODE_TARGET:.0f}x recompute tokens/s at context {DECODE_CONTEXT} -> "
        + ", ".join(f"{v} {x:.1f}x" for v, x in speedup.items())
        + f": {verdict}"
    )


# ---------------------------------------------------------------- cache bytes
def cache_bytes_per_token(net: GPT, dtype: torch.dtype) -> float:
    """Bytes per token per layer of the buffers make_cache allocates (batch 1, block_size tokens)."""
    caches = make_cache(net, 1, net.block_size, dtype=dtype)
    total = sum(c.a.nbytes + (0 if c.b is None else c.b.nbytes) for c in caches)
    return total / (net.block_size * len(caches))


def bench_cache(names: list[str]) -> None:
    print(
        f"\n-- cache: make_cache(net, 1, {DECODE_CONTEXT}) buffers, bytes per token per layer "
        f"(head size {HEAD}; nets on the meta device)"
    )
    rows, checks = [], []
    for heads in (N_HEAD, 16):
        with torch.device("meta"):
            nets = {v: zoo_net(v, DECODE_CONTEXT, n_head=heads) for v in dict.fromkeys(["mha", *names])}
        per = {v: {dt: cache_bytes_per_token(n, dt) for dt in (torch.float32, torch.bfloat16)} for v, n in nets.items()}
        for v in names:
            b32, b16 = per[v][torch.float32], per[v][torch.bfloat16]
            ratio = b32 / per["mha"][torch.float32]
            net = nets[v]
            kv = "1 latent" if v == "mla" else f"{net.blocks[0].attn.n_kv_head}"
            whole = b16 * N_LAYER * DECODE_CONTEXT / 2**10
            rows.append(
                [
                    v,
                    heads,
                    heads * HEAD,
                    kv,
                    f"{b32 / 4:.0f}",
                    f"{b32:.0f}",
                    f"{b16:.0f}",
                    f"{whole:.0f}",
                    f"{ratio:.4f}",
                    f"{2.25 / heads:.4f}" if v == "mla" else "",
                ]
            )
            if v == "mla":
                checks.append((heads, ratio))
    print(
        table(
            [
                "variant",
                "heads",
                "width",
                "kv heads",
                "numbers",
                "fp32 B",
                "bf16 B",
                f"bf16 KiB at {DECODE_CONTEXT} tok x {N_LAYER} layers",
                "x mha",
                "2.25/heads",
            ],
            rows,
        )
    )
    for heads, ratio in checks:
        verdict = "MET" if math.isclose(ratio, 2.25 / heads, rel_tol=1e-9) else "MISSED"
        print(f"target cache: mla / mha at {heads} heads = 2.25/{heads} = {2.25 / heads:.4f} -> {ratio:.4f}: {verdict}")


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="See the module docstring for how to read the figures."
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: PyTorch's)")
    parser.add_argument("--steps", type=int, default=None, help="timed train steps per round (default: cpu 2, cuda 20)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed train steps per variant (default: cpu 1, cuda 10)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds, train and decode (default: 9)")
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=DECODE_TOKENS,
        help=f"timed decode steps, ending at position {DECODE_CONTEXT} (default: {DECODE_TOKENS})",
    )
    parser.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="fp32, or torch.autocast(bfloat16) around forward and loss (default: fp32)",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, from: " + ", ".join(PARTS))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    parts = [n.strip() for n in args.parts.split(",") if n.strip()]
    for given, known, what in ((names, VARIANTS, "variant"), (parts, PARTS, "part")):
        unknown = [n for n in given if n not in known]
        if unknown or not given:
            parser.error(f"unknown or no {what}(s) {unknown}; choose from {list(known)}")
    if not 1 <= args.decode_tokens < DECODE_CONTEXT:
        parser.error(f"--decode-tokens must be in 1..{DECODE_CONTEXT - 1}")

    sys.stdout.reconfigure(line_buffering=True)
    set_threads(args.threads)
    device = resolve_device(args.device)
    d_warmup, d_steps, d_repeats = DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    warmup = d_warmup if args.warmup is None else args.warmup
    steps, repeats = args.steps or d_steps, args.repeats or d_repeats
    bf16 = args.dtype == "bf16"
    t_start = time.perf_counter()
    print_header("bench/llm.py: GPT (MHA, GQA, MLA) training step, decode with and without cache, cache bytes", device)
    print(
        f"shape: {N_LAYER} layers, width {N_EMBD}, {N_HEAD} heads of {HEAD}, vocab {VOCAB}; gqa: 2 kv heads; "
        f"mla: kv_lora_rank {MLA_ARGS['kv_lora_rank']}, qk_rope_head_dim {MLA_ARGS['qk_rope_head_dim']}, "
        f"qk_nope_head_dim {MLA_ARGS['qk_nope_head_dim']}, v_head_dim {MLA_ARGS['v_head_dim']}; dtype {args.dtype}"
        + (" (autocast)" if bf16 else "")
    )
    if "train" in parts:
        bench_train(names, device, bf16, warmup, steps, repeats)
        gc.collect()
    if "decode" in parts:
        bench_decode(names, device, bf16, repeats, args.decode_tokens)
    if "cache" in parts:
        bench_cache(names)
    sync(device)
    print(f"\nwall time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
