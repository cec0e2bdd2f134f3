"""Batched decoding (``zoo.gpt.serve.engine``) against ``generate`` one request at a time, same net, same requests.

Rows: aggregate tokens/s of the engine with 1, 8 and 32 clients at once (each client sends its requests one after
another, the engine's ``max_batch`` is the concurrency), and of ``generate`` called once per request in turn (what
a hand-written server does), by the elapsed (wall) clock and by this process's CPU time; time to first token (p50,
p99) from submission. Every request is greedy, and the engine's tokens are checked equal to ``generate``'s. Given a
checkpoint (``--ckpt``, a CausalLMModule) its net is measured; without one a demonstration net (6 layers, width
384, vocabulary 257, random weights) is built.

    python bench/serve_engine.py                                       # about a minute of CPU
    python bench/serve_engine.py --requests 4 --new-tokens 4 --concurrency 1 2   # a smoke run of seconds

``run_engine`` and ``run_sequential`` are what another benchmark (the HTTP server's) calls for these rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench._common import cpu_model, table
from zoo.gpt import GPT, CausalLMModule, generate
from zoo.gpt.serve.engine import Engine, SamplingParams


@dataclass
class Figures:
    """One arm's run: tokens generated, wall and CPU seconds, each request's time to first token and its tokens."""

    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    ttft: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    def row(self, name: str, base: Figures | None = None) -> list[str]:
        tps, cps = self.tokens / self.wall, self.tokens / self.cpu
        ttft = sorted(self.ttft)
        p99 = ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))] if ttft else float("nan")
        return [
            name,
            f"{tps:.1f}",
            f"{cps:.1f}",
            "-" if base is None else f"{tps / (base.tokens / base.wall):.2f}x",
            "-" if base is None else f"{cps / (base.tokens / base.cpu):.2f}x",
            f"{1e3 * statistics.median(ttft):.0f} / {1e3 * p99:.0f}" if ttft else "-",
        ]


HEADERS = ["arm", "tok/s wall", "tok/s CPU", "vs generate wall", "vs generate CPU", "TTFT ms p50 / p99"]


def run_sequential(net: GPT, prompts: list[list[int]], new_tokens: int) -> Figures:
    """``generate`` once per request, in turn."""
    out = Figures()
    cpu, wall = time.process_time(), time.perf_counter()
    for p in prompts:
        start = time.perf_counter()
        ids = generate(net, [torch.tensor(p)], new_tokens, temperature=0)[0].tolist()
        out.ttft.append(time.perf_counter() - start)  # generate gives its first token with its last
        out.outputs.append(ids)
        out.tokens += len(ids)
    out.cpu, out.wall = time.process_time() - cpu, time.perf_counter() - wall
    return out


def run_engine(net: GPT, prompts: list[list[int]], new_tokens: int, concurrency: int) -> Figures:
    """``concurrency`` clients on one engine (``max_batch`` = concurrency), client i sending requests i, i + c, ..."""
    out = Figures(outputs=[[] for _ in prompts], ttft=[0.0] * len(prompts))
    params = SamplingParams(new_tokens, temperature=0)

    def client(first: int) -> None:
        for i in range(first, len(prompts), concurrency):
            start = time.perf_counter()
            for token in engine.submit(prompts[i], params):
                if not out.outputs[i]:
                    out.ttft[i] = time.perf_counter() - start
                out.outputs[i].append(token)

    with Engine(net, max_batch=concurrency, max_queue=max(concurrency, 1)) as engine:
        cpu, wall = time.process_time(), time.perf_counter()
        clients = [threading.Thread(target=client, args=(c,)) for c in range(min(concurrency, len(prompts)))]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        out.cpu, out.wall = time.process_time() - cpu, time.perf_counter() - wall
    out.tokens = sum(map(len, out.outputs))
    return out


def demo_net() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=257, block_size=512, n_layer=6, n_embd=384, n_head=6).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", help="a CausalLMModule checkpoint; none: the demonstration net")
    ap.add_argument("--requests", type=int, default=32, help="requests per arm (prompts of 8 to 39 random ids)")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per request")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print("== GPT serving: continuous batching vs generate one request at a time, greedy")
    print(f"torch {torch.__version__}; CPU: {cpu_model()}; threads: {torch.get_num_threads()} of {os.cpu_count()}")
    print(f"load average (1/5/15 min) at start: {load} (other processes inflate the wall figures, less the CPU ones)")
    net = CausalLMModule.load_from_checkpoint(args.ckpt).net.eval() if args.ckpt else demo_net()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 40, (args.requests,), generator=g).tolist()
    prompts = [torch.randint(0, net.vocab_size, (n,), generator=g).tolist() for n in lengths]
    print(f"net: {args.ckpt or 'demo 6L/384'}; {args.requests} requests x {args.new_tokens} new tokens")
    run_engine(net, prompts[:2], 2, 2)  # warm-up, untimed
    base = run_sequential(net, prompts, args.new_tokens)
    rows = [base.row("generate, one at a time")]
    for c in args.concurrency:
        figures = run_engine(net, prompts, args.new_tokens, c)
        assert figures.outputs == base.outputs, f"the engine's tokens at concurrency {c} differ from generate's"
        rows.append(figures.row(f"engine, concurrency {c}", base))
    print(table(HEADERS, rows))


if __name__ == "__main__":
    main()
