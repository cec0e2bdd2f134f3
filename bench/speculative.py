"""Speculative against plain greedy decoding of one GPT, in one process, arms alternating (issue 27: >= 1.5x at k=4).

Row: time per generated token, speculative / plain (below 1 speculative is faster), with the draft's acceptance rate
and tokens per target forward beside it. Both arms decode the same prompts greedily to the same tokens (checked).
Given checkpoints (``--target``, ``--draft``: CausalLMModule checkpoints sharing a tokenizer) are measured as they
are; without them a demonstration pair is built (a 6-layer width-384 target drafting for itself: every proposal
accepted, but a draft as costly as the target, so the row measures the machinery's overhead, not a speedup).

    python bench/speculative.py --target runs/.../last.ckpt --draft runs/.../last.ckpt --clock cpu
    python bench/speculative.py --target <deepseek_shakespeare last.ckpt> --draft mtp --clock cpu  # self-speculation
    python bench/speculative.py --new-tokens 32 --rounds 1      # a smoke run of seconds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench._common import RATIO_HEADERS, add_clock_arg, alternate, peer_header, ratio_row, table
from zoo.gpt import GPT, CausalLMModule, generate
from zoo.gpt.speculative import MTPDraft, speculative_generate
from zoo.io.tokenizers import prompt_ids


def nets(args) -> tuple[GPT, GPT | MTPDraft, str, list[torch.Tensor]]:
    """Target, draft, a label, and the prompts: ``--prompt`` in the target's tokenizer (random ids without one)."""
    if args.target:
        module = CausalLMModule.load_from_checkpoint(args.target)
        target = module.net.eval()
        if args.draft == "mtp":
            draft, name = MTPDraft(target), "its own MTP module"
        else:
            draft = CausalLMModule.load_from_checkpoint(args.draft).net.eval() if args.draft else target
            name = Path(args.draft or args.target).name
        if module.tokenizer is not None:
            prompts = prompt_ids(module.tokenizer, [args.prompt] * args.batch)
        else:
            prompts = random_prompts(target, args.batch)
        return target, draft, f"{Path(args.target).name} drafted by {name}", prompts
    torch.manual_seed(0)
    target = GPT(vocab_size=257, block_size=512, n_layer=6, n_embd=384, n_head=6).eval()
    return target, target, "demo 6L/384 target drafting for itself (overhead check)", random_prompts(target, args.batch)


def random_prompts(target: GPT, batch: int) -> list[torch.Tensor]:
    return [
        torch.randint(0, target.vocab_size, (16,), generator=torch.Generator().manual_seed(i)) for i in range(batch)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="a CausalLMModule checkpoint; none: the demonstration pair")
    ap.add_argument(
        "--draft", help="the draft's checkpoint (same tokenizer), or mtp: the target's own MTP module; none: the target"
    )
    ap.add_argument("--prompt", default="ROMEO:", help="text every row continues (with the target's tokenizer)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per target forward")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per arm (after one untimed)")
    add_clock_arg(ap)
    args = ap.parse_args()
    peer_header("GPT decoding: speculative vs plain, greedy", args.threads, args.clock)
    target, draft, label, prompts = nets(args)
    plain = generate(target, prompts, args.new_tokens, temperature=0)
    fast, stats = speculative_generate(target, draft, prompts, args.new_tokens, args.k, temperature=0)
    assert all(torch.equal(a, b) for a, b in zip(plain, fast)), "speculative greedy output differs from plain"
    times = alternate(
        {
            "speculative": lambda: speculative_generate(target, draft, prompts, args.new_tokens, args.k, temperature=0),
            "plain": lambda: generate(target, prompts, args.new_tokens, temperature=0),
        },
        args.rounds,
    )
    times = {name: [t / args.new_tokens for t in v] for name, v in times.items()}  # ms per generated token
    row = ratio_row(
        f"{label}, k={args.k}, batch {args.batch}: ms/token (acceptance {stats.acceptance_rate:.2f}, "
        f"{stats.tokens_per_forward:.2f} tokens/forward)",
        times,
        "speculative",
        "plain",
        round(1 / 1.5, 3),
    )
    print(table(RATIO_HEADERS, [row]))


if __name__ == "__main__":
    main()
