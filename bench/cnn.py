"""ResNet-18 training throughput in images/s at 32x32: eager, channels_last, torch.compile, bf16 autocast.

The net is ``zoo.cnn.ResNet(18)`` with the CIFAR stem and 10 classes, the optimizer AdamW on the
zoo's parameter groups (``zoo.train.optim.AdamWCosine``, fused on CUDA as in the zoo). A
step is a full training step: inputs to channels_last where the variant says so (per step, as
``ClassifierModule.forward`` does), forward and cross-entropy (under autocast for bf16), zero_grad,
backward, AdamW step. Batches are random tensors already on the device: this measures compute, not
data loading.

  eager               fp32, NCHW
  channels_last       fp32, weights and inputs NHWC
  compile             fp32, the net through torch.compile (default mode; the loss stays outside, as in
                      ClassifierModule). On a CPU, Inductor needs a C++ compiler; a failure prints its
                      error line and the other variants go on.
  bf16                torch.autocast(device, dtype=torch.bfloat16) around forward and loss
  channels_last_bf16  both

How it is timed: every variant is built and warmed up first (``--warmup`` steps, untimed; for compile
they include compilation). Then ``--repeats`` rounds each time ``--steps`` steps of every variant in
turn, each round starting one variant later, so that drift in a shared machine's load spreads over
all variants; on CUDA the clock is read after a synchronize. A variant stops repeating once its timed
steps passed ``--budget-s`` (bf16 can be tens of seconds a step on a CPU without native bf16), after
at least one round.

How to read the table: images/s is the median over rounds of batch x steps / time, "range" its
min-max, "x eager" the median ratio to eager in the same round, ms/step the median step time, n the
timed steps. Peak memory (CUDA only) is measured during the variant's warm-up.

    python bench/cnn.py                                   # ~4-5 min on 2 CPU cores (bf16 dominates)
    python bench/cnn.py --device cuda --steps 50 --repeats 5
    python bench/cnn.py --variants eager,compile --warmup 3
"""

from __future__ import annotations

import argparse
import gc
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from bench._common import median, now, print_header, resolve_device, set_threads, spread, sync, table
from zoo.cnn import ClassifierModule, ResNet

SEED = 0
NUM_CLASSES = 10
VARIANTS = {  # name: (channels_last, compile, bf16)
    "eager": (False, False, False),
    "channels_last": (True, False, False),
    "compile": (False, True, False),
    "bf16": (False, False, True),
    "channels_last_bf16": (True, False, True),
}
# (warmup, steps, repeats, budget_s): a CPU step of ResNet-18 at batch 64 takes seconds, a GPU one milliseconds.
DEFAULTS = {"cpu": (1, 2, 3, 45.0), "cuda": (10, 50, 5, 60.0)}


@dataclass
class Bench:
    name: str
    step: Callable[[], None]
    timings: list[float] = field(default_factory=list)  # seconds per round of --steps steps
    peak_mib: float = float("nan")
    error: str | None = None


def build(name: str, device: torch.device, batch_size: int) -> Bench:
    channels_last, compiled, bf16 = VARIANTS[name]
    torch.manual_seed(SEED)
    net = ResNet(18, num_classes=NUM_CLASSES, stem="cifar").to(device).train()
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    hp = {k: p.default for k, p in inspect.signature(ClassifierModule.__init__).parameters.items()}
    # the zoo's groups and fused/foreach choice; the schedule is not stepped here
    opt = replace(hp["optimizer"], warmup_steps=0).configure(net, SimpleNamespace(estimated_stepping_batches=1))[
        "optimizer"
    ]
    model = torch.compile(net) if compiled else net
    g = torch.Generator().manual_seed(SEED + 1)
    batches = [  # a few distinct batches, cycled
        (torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, NUM_CLASSES, (batch_size,), generator=g))
        for _ in range(4)
    ]
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    state = {"i": 0}

    def step() -> None:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return Bench(name, step)


def error_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def warm_up(b: Bench, steps: int, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = now(device)
    try:
        for _ in range(steps):
            b.step()
        sync(device)
    except Exception as err:  # compile needs a working C++ toolchain on CPU; report and go on
        b.error = error_line(err)
        print(f"   {b.name}: FAILED during warm-up: {b.error}", flush=True)
        return
    if device.type == "cuda":
        b.peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
    print(f"   {b.name}: warmed up ({steps} steps, {now(device) - t:.1f} s)", flush=True)


def time_round(b: Bench, steps: int, device: torch.device) -> float:
    t0 = now(device)
    for _ in range(steps):
        b.step()
    return now(device) - t0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="See the module docstring for how to read the figures."
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round (default: cpu 2, cuda 50)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps per variant first (default: cpu 1, cuda 10)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default: cpu 3, cuda 5)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop repeating a variant after this many timed seconds (default: cpu 45, cuda 60)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: PyTorch's)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")

    sys.stdout.reconfigure(line_buffering=True)
    set_threads(args.threads)
    device = resolve_device(args.device)
    d_warmup, d_steps, d_repeats, d_budget = DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    warmup = d_warmup if args.warmup is None else args.warmup
    steps, repeats = args.steps or d_steps, args.repeats or d_repeats
    budget = args.budget_s or d_budget
    t_start = time.perf_counter()
    print_header("bench/cnn.py: ResNet-18 (CIFAR stem) training throughput", device)
    print(
        f"batch {args.batch_size} x 3x32x32, {NUM_CLASSES} classes; {warmup} warm-up steps, then {repeats} rounds of "
        f"{steps} steps, at most {budget:.0f} timed s per variant"
    )

    benches: list[Bench] = []
    for n in names:
        gc.collect()
        try:
            b = build(n, device, args.batch_size)
        except Exception as err:
            b = Bench(n, lambda: None, error=error_line(err))
            print(f"   {n}: FAILED to build: {b.error}", flush=True)
        else:
            warm_up(b, warmup, device)
        benches.append(b)

    live = [b for b in benches if b.error is None]
    for r in range(repeats):
        order = live[r % len(live) :] + live[: r % len(live)] if live else []
        for b in order:
            if r > 0 and sum(b.timings) >= budget:
                continue
            b.timings.append(time_round(b, steps, device))
        done = ", ".join(f"{b.name} {args.batch_size * steps / b.timings[-1]:.1f}" for b in live if len(b.timings) > r)
        if done:
            print(f"   round {r + 1}/{repeats} images/s: {done}", flush=True)

    eager = next((b for b in live if b.name == "eager"), None)
    rows = []
    for b in benches:
        if b.error is not None:
            rows.append([b.name, "failed", "-", "-", "-", "0"] + (["-"] if device.type == "cuda" else []))
            continue
        ips = [args.batch_size * steps / t for t in b.timings]
        # Ratio to eager within the same round; rounds where eager was skipped use eager's median.
        ref = [args.batch_size * steps / t for t in eager.timings] if eager else []
        ratios = [x / (ref[i] if i < len(ref) else median(ref)) for i, x in enumerate(ips)] if ref else []
        row = [
            b.name,
            f"{median(ips):.1f}",
            spread(ips, 1),
            f"{median(ratios):.2f}" if ratios else "-",
            f"{median(b.timings) / steps * 1e3:.1f}",
            str(len(b.timings) * steps),
        ]
        if device.type == "cuda":
            row.append(f"{b.peak_mib:.0f}")
        rows.append(row)
    headers = [
        "variant",
        "images/s",
        "range",
        "x eager",
        "ms/step",
        "n",
        *(["peak MiB"] if device.type == "cuda" else []),
    ]
    print(table(headers, rows))
    for b in benches:
        if b.error is not None:
            print(f"   {b.name}: {b.error}")
    print(f"\nwall time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
