"""Shakespeare-char race: nanoGPT's CPU recipe against the zoo's race preset, CPU time to a validation loss.

The peer is a script, not a package, so its training loop is re-implemented here from its published source
(karpathy/nanoGPT: ``train.py``, ``model.py``, ``config/train_shakespeare_char.py`` and the README's command for
"I only have a macbook": ``python train.py config/train_shakespeare_char.py --device=cpu --compile=False
--eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``); its model is ``bench/nanogpt_ref.py``. Every setting,
and where it comes from, is in ``PEER``:

    model          4 layers, 4 heads, width 128, block 64, no biases (LayerNorm and Linear), tied head, no dropout
                   (the README's command line; train.py's default ``bias = False``), GELU MLP 4x, learned positions
    init           N(0, 0.02) for Linear and Embedding weights, c_proj.weight N(0, 0.02 / sqrt(2 n_layer))
                   (model.py ``_init_weights`` and ``GPT.__init__``)
    loss           F.cross_entropy over every position                      (model.py ``forward``)
    optimizer      AdamW lr 1e-3, betas (0.9, 0.99), eps 1e-8 (torch's default), weight decay 0.1 on the >=2-D
                   tensors, 0 on the rest (model.py ``configure_optimizers``; lr and beta2 from the config; not
                   fused on a CPU: ``use_fused = fused_available and device_type == 'cuda'``)
    schedule       warmup lr * (it + 1) / (warmup_iters + 1) for it < 100, then cosine to min_lr 1e-4 at
                   lr_decay_iters 2000 (train.py ``get_lr``; warmup_iters 100 and min_lr from the config)
    clip           clip_grad_norm_(model.parameters(), 1.0)                  (train.py ``grad_clip``)
    batch          12 windows of 64 tokens at random offsets of the training split (train.py ``get_batch``),
                   the next batch drawn between the forward and the backward, as train.py does
    iterations     it = 0 .. max_iters: 2001 optimizer steps                (train.py's ``iter_num > max_iters``)
    seed           torch.manual_seed before the model is built; init and batches draw from the global generator
                   (train.py: ``torch.manual_seed(1337 + seed_offset)``; here the race's seed)

Departures, the same for both arms: the data is the zoo's offline Shakespeare (42 plays and poems, 5.06M
characters, ``datamodules.TextDataModule`` with ``tokenizer: chars``: 85 ids, the documents joined by EOS, the last
10% held out), not nanoGPT's 1.1M-character tinyshakespeare download; the peer gets the zoo's encoded train and
validation token arrays and samples them its own way. nanoGPT's own ``estimate_loss`` (20 random batches of each
split every 250 iterations) is replaced by the race's evaluation. nanoGPT's README reports a loss of 1.88 after the
2000 iterations on tinyshakespeare; on this larger corpus (and these windows) seed 0 ends at 1.901 after 1.54M tokens.

Protocol, both arms alike:
- evaluation: one function (``val_loss``), the mean next-token cross-entropy (nats) over a fixed set of
  ``EVAL_WINDOWS`` = 256 windows of 64 tokens drawn at random offsets of the validation split with seed
  ``EVAL_SEED`` (16,384 predictions: about what the README's command averages, 20 x 12 x 64 = 15,360), in
  ``no_grad`` and eval mode. Block 64 for both, the peer's: a zoo net with a longer context is scored on the same
  windows (its positions 0..63), so a longer training context helps it only through what it learns.
- evaluations at the first optimizer step at or past every ``--eval-every`` training tokens (default 16,384 =
  2^14: about 1% of the peer's 1.54M-token run, 21 of its steps, so a hit is placed within ~1% of the peer's
  time; a grid in tokens rather than steps so that arms with different batches are scored at comparable points);
  the first evaluation at or below the target is the hit, and the run stops there.
- target ``TARGET`` = 1.95 nats: a little above where the recipe ends on this corpus (seed 0: 1.941 at iteration
  1600, 1.23M tokens, and 1.901 at the end), so every seed reaches it within its schedule, late enough that the
  recipe's annealing counts (nanoGPT's published 1.88 is on another corpus; seed 0 never reaches it here).
- time: CPU seconds of the run's process (``time.process_time``) from its first training step, evaluations taken
  out, so a loaded machine slows neither arm's figure by time-slicing; wall seconds beside them. One intra-op
  thread for both (``--threads``), each run in a fresh process, runs alternating peer seed 0, zoo seed 0, peer
  seed 1, ... over ``--jobs`` worker processes.
- the fraction of the matmul peak: training FLOPs per token (``FlopCounterMode`` on one forward and backward of
  the arm's net on its own batch: matmuls and attention, not norms, element-wise ops or the optimizer) x tokens to
  the hit / CPU seconds to the hit, over the peak of a 2048^3 ``torch.mm`` in fp32 on one thread, measured in
  this run.

The zoo's arm runs ``configs/gpt/gpt_char_shakespeare_race.yaml`` through ``cli.py``'s parser (the preset users
get), with the race's data root and seed, no logger, checkpoints or Lightning validation.

    python bench/race_gpt.py --jobs 2                 # 3 seeds: ~8 CPU min in all, 15 min on 2 busy cores
    python bench/race_gpt.py --seeds 0 --arms zoo     # one zoo run
    python bench/race_gpt.py --seeds 0 --arms zoo --zoo-args --model.init_args.optimizer.lr=0.004
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ and the zoo's packages, run as a script or loaded by path
from bench._common import QUIET_FIT, Clock, matmul_peak, race_process, race_runs, race_summary  # noqa: E402
from bench.nanogpt_ref import GPT as NanoGPT  # noqa: E402

TARGET = 1.95
EVAL_EVERY = 16_384  # training tokens between evaluations
EVAL_WINDOWS, EVAL_BLOCK, EVAL_SEED = 256, 64, 1234
ZOO_CONFIG = "configs/gpt/gpt_char_shakespeare_race.yaml"
DATA_ROOT = os.environ.get("ZOO_DATA", "data")

PEER = {  # karpathy/nanoGPT: train.py defaults < config/train_shakespeare_char.py < the README's CPU command line
    "n_layer": 4,  # --n_layer=4
    "n_head": 4,  # --n_head=4
    "n_embd": 128,  # --n_embd=128
    "block_size": 64,  # --block_size=64
    "bias": False,  # train.py bias = False
    "batch_size": 12,  # --batch_size=12
    "learning_rate": 1e-3,  # config learning_rate
    "weight_decay": 0.1,  # train.py weight_decay = 1e-1
    "betas": (0.9, 0.99),  # train.py beta1 = 0.9, config beta2 = 0.99
    "grad_clip": 1.0,  # train.py grad_clip
    "warmup_iters": 100,  # config warmup_iters
    "lr_decay_iters": 2000,  # --lr_decay_iters=2000
    "min_lr": 1e-4,  # config min_lr
    "max_iters": 2000,  # --max_iters=2000
}
PEER_RECIPE = "nanoGPT 4x128 0.8M, AdamW 1e-3 b2 0.99 wd 0.1, warmup 100 + cosine to 1e-4 at 2000, batch 12x64"


# -- the peer: nanoGPT's train.py ------------------------------------------------------------------------------


def get_lr(it: int, cfg: dict = PEER) -> float:
    """train.py's ``get_lr``: linear warmup, then cosine decay to min_lr at lr_decay_iters, then min_lr."""
    lr, warmup, decay, min_lr = cfg["learning_rate"], cfg["warmup_iters"], cfg["lr_decay_iters"], cfg["min_lr"]
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def peer_optimizer(model: nn.Module, cfg: dict = PEER) -> torch.optim.AdamW:
    """model.py's ``configure_optimizers`` on a CPU: >=2-D tensors decay, the rest do not; AdamW not fused."""
    params = [p for p in model.parameters() if p.requires_grad]  # the tied table once, as named_parameters gives it
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg["learning_rate"], betas=cfg["betas"])


def peer_model(vocab_size: int, cfg: dict = PEER) -> NanoGPT:
    return NanoGPT(vocab_size, cfg["block_size"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"], bias=cfg["bias"])


def get_batch(data: np.ndarray, block_size: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """train.py's ``get_batch``: ``batch_size`` windows at random offsets (the global generator), targets shifted."""
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


# -- what both arms share: data, evaluation, bookkeeping --------------------------------------------------------


def shakespeare(root: str, block_size: int = EVAL_BLOCK):
    """The zoo's character-level Shakespeare, as ``TextDataModule(tokenizer="chars")`` builds and splits it."""
    from datamodules import TextDataModule

    dm = TextDataModule(root=root, tokenizer="chars", block_size=block_size)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def split_tokens(dm) -> tuple[np.ndarray, np.ndarray]:
    """The training and validation token streams, in memory."""
    return np.asarray(dm.train_set.tokens.array), np.asarray(dm.val_set.tokens.array)


def eval_windows(val: np.ndarray, n: int = EVAL_WINDOWS, block: int = EVAL_BLOCK, seed: int = EVAL_SEED):
    """``n`` windows (inputs, targets), each (n, block), at offsets drawn from ``seed`` alone."""
    starts = torch.randint(len(val) - block, (n,), generator=torch.Generator().manual_seed(seed))
    pos = starts[:, None].numpy() + np.arange(block + 1)  # (n, block + 1)
    window = torch.from_numpy(val[pos].astype(np.int64))
    return window[:, :-1], window[:, 1:]


def val_loss(forward, x: torch.Tensor, y: torch.Tensor, batch: int = 64) -> float:
    """Mean cross-entropy (nats) of ``forward`` (ids -> logits) over every position of the windows (x, y)."""
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = forward(x[i : i + batch])
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y[i : i + batch].reshape(-1), reduction="sum")
    return float(total) / y.numel()


def train_flops_per_token(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """FLOPs of one forward and backward of a copy of ``net`` on the batch (x, y), per token."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    net = copy.deepcopy(net)  # gradients of the trained net stay untouched
    with FlopCounterMode(display=False) as counter:
        lm_loss(net(x), y).backward()
    return counter.get_total_flops() / y.numel()


class Grid:
    """Evaluation points every ``every`` tokens: ``due(seen)`` is true at the first step at or past each."""

    def __init__(self, every: int) -> None:
        self.every, self.next = every, every

    def due(self, seen: int) -> bool:
        if seen < self.next:
            return False
        self.next = (seen // self.every + 1) * self.every
        return True


class Race:
    """One run's bookkeeping: tokens seen, evaluations on the grid, the hit."""

    def __init__(self, windows: tuple[torch.Tensor, torch.Tensor], every: int, target: float) -> None:
        self.x, self.y = windows
        self.target = target
        self.grid, self.clock, self.seen = Grid(every), Clock(), 0
        self.evals: list[tuple[int, float]] = []
        self.hit: dict | None = None

    def step(self, tokens: int, net: nn.Module) -> bool:
        """Count a finished optimizer step of ``tokens``; evaluate when due; True once the target is hit."""
        self.seen += tokens
        if not self.grid.due(self.seen):
            return False
        self.clock.pause()
        net.eval()
        loss = val_loss(net, self.x, self.y)
        net.train()
        self.evals.append((self.seen, loss))
        if loss <= self.target and self.hit is None:
            cpu_s, wall_s = self.clock.now()
            self.hit = {"tokens": self.seen, "cpu_s": cpu_s, "wall_s": wall_s, "loss": loss}
        self.clock.resume()
        return self.hit is not None

    def result(self, flops_per_token: float, what: str) -> dict:
        return {"hit": self.hit, "evals": self.evals, "flops": flops_per_token, "what": what}


# -- the two arms -------------------------------------------------------------------------------------------------


def peer_run(seed: int, root: str, every: int, target: float = TARGET, cfg: dict = PEER) -> dict:
    dm = shakespeare(root)
    train, val = split_tokens(dm)
    t, b = cfg["block_size"], cfg["batch_size"]
    torch.manual_seed(seed)
    model = peer_model(dm.tokenizer.vocab_size, cfg)
    optimizer = peer_optimizer(model, cfg)
    flops = train_flops_per_token(model, *get_batch(train, t, b))
    race = Race(eval_windows(val), every, target)
    model.train()
    race.clock.start()
    x, y = get_batch(train, t, b)  # train.py: "fetch the very first batch"
    for it in range(cfg["max_iters"] + 1):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it, cfg)
        loss = lm_loss(model(x), y)
        x, y = get_batch(train, t, b)  # drawn between forward and backward, as train.py does
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if race.step(b * t, model):
            break
    return race.result(flops, PEER_RECIPE)


def zoo_run(
    seed: int, root: str, every: int, target: float = TARGET, config: str = ZOO_CONFIG, extra: tuple[str, ...] = ()
) -> dict:
    from lightning.pytorch import Callback

    sys.path.insert(0, str(ROOT))
    from cli import main

    holder: dict = {}

    class Evaluations(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            dm = trainer.datamodule
            x, y = dm.train_set.__getitems__(list(range(dm.batch_size)))  # a batch as training sees it
            holder["flops"] = train_flops_per_token(pl_module.net, x, y)
            holder["race"] = Race(eval_windows(split_tokens(dm)[1]), every, target)
            holder["race"].clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if holder["race"].step(batch[0].numel(), pl_module.net):
                trainer.should_stop = True

    args = [
        "--config",
        str(ROOT / config),
        f"--seed_everything={seed}",
        f"--data.init_args.seed={seed}",
        f"--data.init_args.root={root}",
        *QUIET_FIT,
        *extra,
    ]
    cli = main(args, run=False)
    cli.trainer.callbacks.append(Evaluations())
    cli.trainer.fit(cli.model, cli.datamodule)
    what = f"{Path(config).name}{' ' + ' '.join(extra) if extra else ''}"
    return holder["race"].result(holder["flops"], what)


def _one(job: tuple) -> tuple[str, int, dict]:
    arm, seed, root, every, target, threads, config, extra = job
    race_process(threads)
    sys.path.insert(0, str(ROOT))
    r = peer_run(seed, root, every, target) if arm == "peer" else zoo_run(seed, root, every, target, config, extra)
    r["threads"] = torch.get_num_threads()  # what training ran with, read after it (Lightning may not change it)
    return arm, seed, r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=["peer", "zoo"], default=["peer", "zoo"])
    p.add_argument("--root", default=DATA_ROOT, help="data root holding shakespeare/ and text_cache/ (env ZOO_DATA)")
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="training tokens between evaluations")
    p.add_argument("--target", type=float, default=TARGET, help="validation loss (nats) to reach")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every run (both arms)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, each in its own process")
    p.add_argument("--config", default=ZOO_CONFIG, help="the zoo arm's config")
    p.add_argument("--zoo-args", nargs=argparse.REMAINDER, default=[], help="more cli.py arguments (last)")
    args = p.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.path.insert(0, str(ROOT))
    from bench._common import cpu_model, print_header

    torch.set_num_threads(args.threads)
    t = f"{args.target:.2f}"
    print_header(f"Shakespeare-char race: CPU time to validation loss {t} nats", torch.device("cpu"))
    peak = matmul_peak()
    cpu = cpu_model().split(";")[0]
    print(f"{cpu}; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s per CPU second ({args.threads} thread(s), 2048^3 mm)")
    print(f"peer: karpathy/nanoGPT train.py ({PEER_RECIPE}); zoo: {args.config} {' '.join(args.zoo_args)}")
    print(
        f"evaluations every {args.eval_every} training tokens on {EVAL_WINDOWS} validation windows of {EVAL_BLOCK};"
        " runs (arm, seed, ...) as they end:"
    )
    jobs = [
        (arm, seed, args.root, args.eval_every, args.target, args.threads, args.config, tuple(args.zoo_args))
        for seed in args.seeds
        for arm in args.arms
    ]
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for arm, seed, r in race_runs(_one, jobs, args.jobs):
        results[arm].append(r)
        h = r["hit"]
        at = f"{h['tokens']:8d} {h['cpu_s']:7.1f} {h['wall_s']:7.1f}" if h else f"{'never':>8s} {'-':>7s} -"
        evals = ", ".join(f"{n // 1000}k {v:.3f}" for n, v in r["evals"][3::4])
        print(
            f"  {arm:4s} seed {seed}: hit at {at} (tokens, CPU s, wall s); {r['flops'] / 1e6:.2f} MFLOP/token"
            f" trained; {r['threads']} thread(s); val loss every 4th evaluation {evals}",
            flush=True,
        )
    print("\n" + race_summary(results, "token", t, peak, ".2f"))
    print(f"median [min, max] over the seeds; {cpu}, {args.threads} thread(s)")


if __name__ == "__main__":
    main()
