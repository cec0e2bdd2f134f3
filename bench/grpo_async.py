"""Synchronous against asynchronous GRPO rollouts on the arithmetic task: tokens sampled per CPU second and
validation accuracy at equal learner steps.

The net is ``configs/gpt/grpo_arithmetic.yaml``'s (4 layers, width 128, bytes), briefly SFT'd here on the task's
worked replies (``--sft-steps`` of ``chat_arithmetic.yaml``'s settings), then tuned by GRPO with the GRPO config's
rewards (ExactMatch + 0.1 FormatCheck, G = 8, 48 new tokens, 8 prompts per step) on ``TASK`` (the docs' figures),
once per arm from the same weights and seed:
  - ``sync``: the learner samples each step's rollouts itself (``async_actors: 0``);
  - ``async-N``: N actor processes sample while the learner updates (``async_actors: N``), each token weighted by
    min(rho_bar, pi_old / mu).
Tokens: completion tokens of the rollouts the learner trained on. CPU seconds: the learner process's CPU time over
the training steps plus, for async, the actor processes' (read from /proc before they stop; rollouts sampled
ahead and never used count too). The rates (tok/CPU s, tok/wall s) count from the end of step 1 to the end, as
step 1 holds the actors' start (the fork server's imports, not counted in CPU s, and the first rollout); the
totals (CPU s, wall s) count every step. Accuracy: exact match of the greedy reply on the task's 200 held-out
questions after the last step.

    python bench/grpo_async.py --clock cpu                   # a few minutes on 2 CPU cores
    python bench/grpo_async.py --steps 40 --actors 1 2 --seeds 0 1
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from lightning.pytorch import Callback, Trainer, seed_everything  # noqa: E402

from bench._common import cpu_model, table  # noqa: E402

TASK = {"digits": 2, "terms": 3, "ops": "+-", "train": 8000, "pairs": 2000, "test": 200, "seed": 0}
NET = {"vocab_size": 257, "block_size": 96, "n_layer": 4, "n_embd": 128, "n_head": 4, "dropout": 0.0}


def _trainer(steps: int, **kwargs) -> Trainer:
    return Trainer(
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        **kwargs,
    )


def _net():
    from zoo.gpt import GPT, GeluMLP

    return GPT(**NET, mlp=partial(GeluMLP, approximate="exact"))


def sft(path: str, steps: int, seed: int) -> dict:
    """The net's weights after ``steps`` of chat_arithmetic.yaml's SFT."""
    from datamodules import ChatDataModule
    from datamodules.arithmetic import ArithmeticTask
    from zoo.gpt import CausalLMModule
    from zoo.train.optim import AdamWCosine

    seed_everything(seed)
    opt = AdamWCosine(lr=3e-3, weight_decay=0.1, warmup_steps=min(50, steps // 5), min_lr_ratio=0.1)
    module = CausalLMModule(_net(), optimizer=opt)
    dm = ChatDataModule(path, tokenizer="bytes", block_size=96, batch_size=32, generate=ArithmeticTask(**TASK))
    _trainer(steps, gradient_clip_val=1.0, limit_val_batches=0).fit(module, dm)
    return {k: v.clone() for k, v in module.net.state_dict().items()}


def actor_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of live processes ``pids`` (Linux /proc)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime: fields 14 and 15 of stat(5)
    return total


class Meter(Callback):
    """Tokens trained on, learner CPU and wall time over the training steps, the actors' CPU, the lag's metrics;
    ``first``: the same after step 1 (which holds the actors' start), to count the steady state apart."""

    def __init__(self, rows: int) -> None:
        self.rows, self.tokens, self.actor_cpu, self.staleness, self.weights = rows, 0.0, 0.0, [], []
        self.first: tuple[float, float, float, float] | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        m = trainer.callback_metrics
        self.tokens += float(m["train/completion_length"]) * self.rows
        self.cpu, self.wall = time.process_time() - self.cpu0, time.perf_counter() - self.wall0
        if pl_module.actors is not None:
            self.actor_cpu = actor_cpu_seconds([p.pid for p in pl_module.actors.processes])
            self.staleness.append(float(m["train/staleness"]))
            self.weights.append(float(m["train/importance_weight/mean"]))
        if self.first is None:
            self.first = (self.tokens, self.cpu, self.wall, self.actor_cpu)

    def steady(self) -> tuple[float, float, float]:
        """(tokens, CPU s, wall s) from the end of step 1 to the end."""
        tokens, cpu, wall, actor_cpu = self.first
        return self.tokens - tokens, self.cpu + self.actor_cpu - cpu - actor_cpu, self.wall - wall


def grpo(path: str, weights: dict, actors: int, steps: int, seed: int) -> dict:
    from datamodules import PromptDataModule
    from datamodules.arithmetic import ArithmeticTask
    from zoo.gpt import GRPOModule
    from zoo.gpt.generate import Generation
    from zoo.gpt.tune.rewards import ExactMatch, FormatCheck
    from zoo.io.tokenizers import ByteTokenizer
    from zoo.train.optim import AdamWCosine

    seed_everything(seed)
    net = _net()
    net.load_state_dict(weights)
    opt = AdamWCosine(lr=1e-4, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)
    rewards = [ExactMatch(weight=1.0), FormatCheck(weight=0.1)]
    module = GRPOModule(
        net, rewards, group_size=8, generation=Generation(max_new_tokens=48), optimizer=opt, async_actors=actors
    )
    module.tokenizer = ByteTokenizer()
    dm = PromptDataModule(path, tokenizer="bytes", batch_size=8, val_batch_size=50, generate=ArithmeticTask(**TASK))
    meter = Meter(rows=8 * 8)
    trainer = _trainer(steps, callbacks=[meter], limit_val_batches=0)
    trainer.fit(module, dm)
    val = _trainer(0).validate(module, dm, verbose=False)[0]
    cpu = meter.cpu + meter.actor_cpu
    tokens, steady_cpu, steady_wall = meter.steady()
    return {
        "tokens": meter.tokens,
        "cpu_s": cpu,
        "learner_cpu_s": meter.cpu,
        "wall_s": meter.wall,
        "tok_per_cpu_s": tokens / steady_cpu,
        "tok_per_wall_s": tokens / steady_wall,
        "accuracy": val["val/accuracy"],
        "reward": val["val/reward"],
        "staleness": statistics.mean(meter.staleness) if meter.staleness else 0.0,
        "is_weight": statistics.mean(meter.weights) if meter.weights else 1.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="GRPO learner steps per arm")
    ap.add_argument("--sft-steps", type=int, default=300, help="SFT steps before GRPO (0: random init)")
    ap.add_argument("--actors", type=int, nargs="+", default=[1], help="async arms: actor processes")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="the rate the table sorts by")
    ap.add_argument("--data", default=None, help="the task's folder (default: a temporary one)")
    ap.add_argument("--threads", type=int, default=None, help="the learner's torch threads (actors use 1 each)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== GRPO, synchronous against asynchronous rollouts; arithmetic task {TASK}")
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}; CPU: {cpu_model()}; {os.cpu_count()} CPUs; learner threads {threads}")
    print(f"load average (1/5/15 min) at start: {load}; {args.steps} learner steps, SFT {args.sft_steps} steps")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.data or str(Path(tmp) / "arithmetic")
        rows = []
        for seed in args.seeds:
            weights = sft(path, args.sft_steps, seed) if args.sft_steps else _net().state_dict()
            for actors in [0, *args.actors]:
                r = grpo(path, weights, actors, args.steps, seed)
                name = "sync" if actors == 0 else f"async-{actors}"
                rows.append([name, seed, *(f"{r[k]:.0f}" for k in ("tokens",)), f"{r['cpu_s']:.1f}"])
                rows[-1] += [f"{r['learner_cpu_s']:.1f}", f"{r['wall_s']:.1f}", f"{r['tok_per_cpu_s']:.1f}"]
                rows[-1] += [f"{r['tok_per_wall_s']:.1f}", f"{r['accuracy']:.3f}", f"{r['reward']:.3f}"]
                rows[-1] += [f"{r['staleness']:.2f}", f"{r['is_weight']:.3f}"]
                print(f"  done: {name} seed {seed}", flush=True)
    headers = ["arm", "seed", "tokens", "CPU s", "learner CPU s", "wall s", "tok/CPU s*", "tok/wall s*"]
    headers += ["val acc", "val reward", "staleness", "mean weight"]
    key = 6 if args.clock == "cpu" else 7
    print(table(headers, sorted(rows, key=lambda r: -float(r[key]))))
    print("* from the end of step 1 (after the actors' start) to the end")
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
