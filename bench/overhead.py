"""What the zoo's default training setup costs per optimizer step, against a plain PyTorch loop.

Three variants train the same net, from the same initial weights, on the same batches (a DataLoader
over an in-memory TensorDataset, num_workers=0, no shuffle, no validation), for the same steps:

  plain      a hand-written loop: AdamW on the zoo's parameter groups with its warmup-cosine LambdaLR
             stepped every step (both built by ``zoo.train.optim.AdamWCosine`` from
             ``ClassifierModule``'s default hyperparameters); forward, cross-entropy,
             zero_grad(set_to_none=True), backward, optimizer step, scheduler step. That is Lightning's
             order (zero_grad sits in its closure between training_step and backward). Zeroing first
             (``--zero-grad-first``) is as valid, but on a CPU it changes what the allocator does: the
             freed gradients go to the forward's activations and backward faults in fresh pages, ~3x the
             minor page faults on ResNet-18 and a plain loop slower than Lightning's, which would credit
             the zoo with a negative overhead that is no property of the zoo.
  zoo        ``ClassifierModule`` and a Trainer with everything ``cli.py`` gives every run:
             ``DEFAULT_CALLBACKS`` and ``TRAINER_DEFAULTS`` instantiated as LightningCLI would, the
             ``ZooMLFlowLogger`` (async) writing to a throwaway ``sqlite:///<tmp>/mlflow.db``, and
             Lightning's own defaults for the rest: progress bar, model summary, log_every_n_steps=50,
             checkpointing (``last.ckpt`` at the end of fit).
  lightning  ``ClassifierModule`` and a bare Trainer: no logger, callbacks, checkpointing, progress bar
             or model summary. The reference for what Lightning itself costs; zoo minus lightning is
             what the zoo's callbacks and logger add.

Not reproduced from ``cli.py``: ``LogConfigToMLflow`` (it needs the CLI's parser; it logs the config
once, at setup) and ``ZooCLI.before_fit`` (it only moves the ``OnExceptionCheckpoint`` folder).
Without validation, ``MonitoredCheckpoint`` never sees its ``val/acc``: Lightning warns once (printed
below the table), no best checkpoint is kept, and ``last.ckpt`` is written when the single training
epoch ends, after the timed window; the callback's per-step hooks still run.

How it is timed. Each run reads the clock after the optimizer step of step ``warmup - 1`` and again
after that of the last step (for the Trainer variants from a callback's ``on_train_batch_end``, for
the plain loop at the same point of its loop; on CUDA after a synchronize). The window thus holds
``--steps`` whole iterations, data loading and every per-step hook and log write included, and
leaves out the one-time work: building the module, Trainer, MLflow run, the first steps (lazy
allocation, oneDNN/cuDNN setup) and the end of fit (checkpoint save, MLflow flush and artifacts).
With the default log_every_n_steps=50, keep ``--steps`` a multiple of 50 for the MLP so the window
holds whole logging periods; ResNet-18 steps are so long on a CPU that a periodic write (a few ms)
would not show in its 2% budget anyway. The variants run interleaved (plain, zoo, lightning, then
the next repeat starting one variant later), after one discarded warm-up round, so that drift in a
shared machine's load spreads over all of them; ratios and differences are taken between runs of
the same repeat, then the median over repeats is reported. All variants share one process, so the
plain loop pays what importing Lightning costs every step too (on a CUDA build of PyTorch without a
GPU, Lightning's PYTORCH_NVML_BASED_CUDA_CHECK=1 makes each optimizer.step() probe NVML, ~0.2 ms;
CUDA_VISIBLE_DEVICES="" avoids it).

How to read the table (one per workload):
  ms/step     median over repeats of the window time / --steps; "range" is the min-max over repeats.
  x plain     ms/step over the plain loop's ms/step in the same repeat (median over repeats).
  +ms/step    the same as a difference: the per-step cost the setup adds.
  +cpu ms/step (with --threads 1 only) the same in process CPU time, the MLflow writer thread's
              included. A process that waits for a core accrues no CPU time, so on a shared machine this
              is the steadier figure, close to the wall-clock cost on an idle one. With more threads,
              OpenMP workers spin while the main thread runs Python, which would count overhead twice.
  setup s     time before the window minus warmup x ms/step: construction, fit start, first-step extras.
  teardown s  time after the window: end of fit, checkpoint writes, MLflow flush and artifact upload.
  faults/step minor page faults per step in the window (allocator behaviour; differs when memory is reused
              differently, which can move ms/step on a CPU by several %).
  loss        the last step's loss: equal across variants when they did the same training.
Targets: the zoo setup adds at most 0.5 ms/step to the MLP and stays within 2% of plain on ResNet-18.
``--ablate`` adds variants that leave one part of the zoo setup out (each callback, the progress bar,
MLflow replaced by a no-op logger) and, in bare Lightning, the module's own per-step ``log_dict``; it
prints what each saves per step. ``--profile`` adds, per workload, one zoo run under Lightning's
SimpleProfiler and prints the time each callback hook and Trainer action took per step (profiled
timings are inflated by the profiler itself).

    python bench/overhead.py                                            # ~4.5 min on 2 CPU cores
    python bench/overhead.py --workloads mlp --ablate --profile --threads 1   # what each part costs, ~6 min
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # cli.py lives at the repository root, not in a package

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from lightning.pytorch import Callback, Trainer  # noqa: E402
from lightning.pytorch.cli import instantiate_class  # noqa: E402
from lightning.pytorch.loggers.logger import DummyLogger  # noqa: E402
from lightning.pytorch.profilers import SimpleProfiler  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from bench._common import (  # noqa: E402
    median,
    minor_faults,
    now,
    print_header,
    resolve_device,
    set_threads,
    spread,
    table,
)
from cli import DEFAULT_CALLBACKS, TRAINER_DEFAULTS  # noqa: E402
from zoo.cnn import ClassifierModule, ResNet  # noqa: E402

SEED = 0
VARIANTS = ("plain", "zoo", "lightning")


class MLP(nn.Module):
    """784-256-256-10 on flattened 28x28 images: a step of a few ms, so per-step overhead shows."""

    def __init__(self, num_classes: int = 10, in_features: int = 784, hidden: int = 256) -> None:
        super().__init__()
        self.num_classes = num_classes  # ClassifierModule sizes its metrics from it
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:  # (B, 1, 28, 28) -> (B, K)
        return self.layers(x)


@dataclass(frozen=True)
class Workload:
    make_net: Callable[[], nn.Module]
    image_shape: tuple[int, int, int]
    steps: int  # timed steps (defaults; the CLI flags override them)
    warmup: int
    repeats: int
    target: str  # "added_ms <= x" or "ratio <= x"
    batch_size: int = 64


WORKLOADS = {
    "mlp": Workload(MLP, (1, 28, 28), steps=500, warmup=50, repeats=5, target="added_ms <= 0.5"),
    "resnet18": Workload(
        lambda: ResNet(18, num_classes=10, stem="cifar"),
        (3, 32, 32),
        steps=12,
        warmup=2,
        repeats=3,
        target="ratio <= 1.02",
    ),
}


@dataclass
class Run:
    total: float  # seconds, first line of setup to the end of fit
    before: float  # seconds from the start to the window
    window: float  # seconds of the timed steps
    after: float  # seconds from the window to the end
    cpu: float  # process CPU seconds in the window (all threads)
    faults: int  # minor page faults in the window
    loss: float
    warnings: list[str] = field(default_factory=list)


class StepWindow(Callback):
    """Reads the clock after the optimizer step of step ``first - 1`` and of step ``last``."""

    def __init__(self, first: int, last: int, device: torch.device) -> None:
        self.first, self.last, self.device = first, last, device
        self.t0 = self.t1 = self.c0 = self.c1 = float("nan")
        self.f0 = self.f1 = 0
        self.loss = float("nan")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == self.first - 1:
            self.t0, self.c0, self.f0 = now(self.device), time.process_time(), minor_faults()
        elif batch_idx == self.last:
            self.t1, self.c1, self.f1 = now(self.device), time.process_time(), minor_faults()
            self.loss = float(outputs["loss"])


class UnloggedClassifier(ClassifierModule):
    """ClassifierModule without its per-step ``log_dict`` (for ``--ablate``: what that one call costs)."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._loss(batch)[0]["loss"]


def module_defaults() -> dict:
    """ClassifierModule's default hyperparameters, so the plain loop follows the module when they change."""
    params = inspect.signature(ClassifierModule.__init__).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def seeded_net(w: Workload) -> nn.Module:
    torch.manual_seed(SEED)
    return w.make_net()


def make_loader(w: Workload, n_steps: int) -> DataLoader:
    """Exactly one epoch of ``n_steps`` batches, so no epoch-end hook falls inside the timed window."""
    g = torch.Generator().manual_seed(SEED + 1)
    n = n_steps * w.batch_size
    x = torch.randn(n, *w.image_shape, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=w.batch_size, shuffle=False, num_workers=0, drop_last=True)


def run_plain(w: Workload, loader: DataLoader, warmup: int, device: torch.device, zero_grad_first: bool) -> Run:
    start = now(device)
    net = seeded_net(w).to(device).train()
    hp = module_defaults()
    total_steps = len(loader)
    cfg = hp["optimizer"].configure(net, SimpleNamespace(estimated_stepping_batches=total_steps))
    opt, sched = cfg["optimizer"], cfg["lr_scheduler"]["scheduler"]
    t0, c0, f0 = float("nan"), float("nan"), 0
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if zero_grad_first:
            opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y, label_smoothing=hp["label_smoothing"])
        if not zero_grad_first:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if i == warmup - 1:
            t0, c0, f0 = now(device), time.process_time(), minor_faults()
    t1, c1, f1 = now(device), time.process_time(), minor_faults()
    final = loss.item()
    end = time.perf_counter()
    return Run(
        total=end - start, before=t0 - start, window=t1 - t0, after=end - t1, cpu=c1 - c0, faults=f1 - f0, loss=final
    )


def _instantiate(spec):
    return instantiate_class((), spec) if isinstance(spec, dict) and "class_path" in spec else spec


def zoo_trainer_kwargs(tracking_uri: str, without: str | None = None) -> dict:
    """Trainer arguments exactly as cli.py gives every run, the logger pointed at ``tracking_uri``.

    ``without`` (for ``--ablate``) leaves one part out: a callback by class name, "progress bar", or
    "mlflow" (the MLflow logger replaced by Lightning's no-op DummyLogger, so logging still happens).
    """
    kwargs = {k: _instantiate(v) for k, v in TRAINER_DEFAULTS.items() if k not in ("logger", "callbacks")}
    logger = dict(TRAINER_DEFAULTS["logger"])
    logger["init_args"] = {**logger.get("init_args", {}), "tracking_uri": tracking_uri}
    kwargs["logger"] = DummyLogger() if without == "mlflow" else instantiate_class((), logger)
    callbacks = [instantiate_class((), c) for c in TRAINER_DEFAULTS.get("callbacks", DEFAULT_CALLBACKS)]
    kwargs["callbacks"] = [cb for cb in callbacks if type(cb).__name__ != without]
    if without == "progress bar":
        kwargs["callbacks"] = [cb for cb in kwargs["callbacks"] if type(cb).__name__ != "ProgressBar"]
        kwargs["enable_progress_bar"] = False
    return kwargs


def ablations(tmp: Path) -> list[str]:
    """The parts ``--ablate`` leaves out one at a time: each default callback, the progress bar, MLflow."""
    names = [type(cb).__name__ for cb in zoo_trainer_kwargs(f"sqlite:///{tmp / 'mlflow.db'}")["callbacks"]]
    names = [n for n in names if n != "ProgressBar"]  # "progress bar" below
    return [f"zoo -{n}" for n in [*names, "progress bar", "mlflow"]] + ["lightning -train/loss log"]


def run_lightning(
    w: Workload,
    loader: DataLoader,
    warmup: int,
    device: torch.device,
    tmp: Path,
    full: bool,
    without: str | None = None,
    profiler=None,
) -> tuple[Run, Trainer]:
    start = now(device)
    module = (UnloggedClassifier if without == "train/loss log" else ClassifierModule)(seeded_net(w))
    timer = StepWindow(warmup, len(loader) - 1, device)
    common = dict(max_steps=len(loader), limit_val_batches=0, accelerator=device.type, devices=1, profiler=profiler)
    if full:
        kwargs = zoo_trainer_kwargs(f"sqlite:///{tmp / 'mlflow.db'}", without)
        kwargs["callbacks"] = [*kwargs["callbacks"], timer]
        trainer = Trainer(**kwargs, **common)
    else:
        trainer = Trainer(
            logger=False,
            enable_checkpointing=False,
            callbacks=[timer],
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp / "bare"),
            **common,
        )
    # The progress bar is drawn (formatted and written) as in any run, into /dev/null rather than a terminal.
    with (
        open(os.devnull, "w") as null,
        contextlib.redirect_stdout(null),
        contextlib.redirect_stderr(null),
        warnings.catch_warnings(record=True) as caught,
        fresh_workdir(tmp),
    ):
        trainer.fit(module, train_dataloaders=loader)
    end = time.perf_counter()
    notes = [str(m.message).splitlines()[0] for m in caught]
    run = Run(
        total=end - start,
        before=timer.t0 - start,
        window=timer.t1 - timer.t0,
        after=end - timer.t1,
        cpu=timer.c1 - timer.c0,
        faults=timer.f1 - timer.f0,
        loss=timer.loss,
        warnings=notes,
    )
    return run, trainer


@contextlib.contextmanager
def fresh_workdir(tmp: Path):
    """Each Trainer run in its own working directory, so cli.py's relative paths ("runs", ...) are per run.

    Otherwise a run whose checkpoint folder does not depend on an MLflow run id would resume from the
    previous run's last.ckpt: with an OnExceptionCheckpoint among the callbacks, Lightning turns
    fit(ckpt_path=None) into ckpt_path="last" and picks up any ModelCheckpoint's last.ckpt.
    """
    cwd = os.getcwd()
    os.chdir(tempfile.mkdtemp(dir=tmp, prefix="run_"))
    try:
        yield
    finally:
        os.chdir(cwd)


def run_variant(
    name: str,
    w: Workload,
    loader: DataLoader,
    warmup: int,
    device: torch.device,
    tmp: Path,
    zero_grad_first: bool = False,
) -> Run:
    """``name``: plain, zoo, lightning, or "zoo -<part>" / "lightning -<part>" for ``--ablate``."""
    gc.collect()
    if name == "plain":
        return run_plain(w, loader, warmup, device, zero_grad_first)
    base, _, without = name.partition(" -")
    return run_lightning(w, loader, warmup, device, tmp, full=base == "zoo", without=without or None)[0]


def describe_zoo_setup(device: torch.device, tmp: Path) -> str:
    """Which callbacks and logger the zoo variant runs with (Lightning adds the progress bar and summary)."""
    trainer = Trainer(**zoo_trainer_kwargs(f"sqlite:///{tmp / 'mlflow.db'}"), accelerator=device.type, devices=1)
    names = [type(cb).__name__ for cb in trainer.callbacks]
    lg = trainer.logger
    sync_flag = lg._log_batch_kwargs.get("synchronous", "mlflow default")
    return (
        f"zoo variant: callbacks {', '.join(names)}; logger {type(lg).__name__}(synchronous={sync_flag}, "
        f"log_model={lg._log_model}); log_every_n_steps={trainer.log_every_n_steps}"
    )


def bench_workload(name: str, w: Workload, args, device: torch.device, tmp: Path) -> dict[str, list[Run]]:
    steps = args.steps or w.steps
    warmup = args.warmup or w.warmup
    repeats = args.repeats or w.repeats
    loader = make_loader(w, warmup + steps)
    print(
        f"\n-- {name}: batch {w.batch_size}, input {w.image_shape}, {steps} timed steps after {warmup} warm-up "
        f"steps, {repeats} repeats"
    )
    variants = [*VARIANTS, *(ablations(tmp) if args.ablate else [])]
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    for r in range(repeats):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            runs[v].append(run_variant(v, w, loader, warmup, device, tmp, args.zero_grad_first))
        line = ", ".join(f"{v} {runs[v][-1].window / steps * 1e3:.3f}" for v in VARIANTS)
        print(f"   repeat {r + 1}/{repeats} ms/step: {line}", flush=True)
    report(name, w, runs, steps, warmup)
    if args.profile:
        profile(w, loader, warmup, device, tmp)
    return runs


def _paired(a: list[float], b: list[float], op) -> list[float]:
    """``op`` between runs of the same repeat (ratio or difference), one value per repeat."""
    return [op(x, y) for x, y in zip(a, b)]


def report(name: str, w: Workload, runs: dict[str, list[Run]], steps: int, warmup: int) -> None:
    ms = {v: [r.window / steps * 1e3 for r in rs] for v, rs in runs.items()}
    cpu = {v: [r.cpu / steps * 1e3 for r in rs] for v, rs in runs.items()}
    d = 1 if median(ms["plain"]) >= 100 else 3  # decimals of the ms figures
    with_cpu = torch.get_num_threads() == 1
    div, sub = (lambda x, y: x / y), (lambda x, y: x - y)

    headers = [
        "variant",
        "ms/step",
        "range",
        "x plain",
        "+ms/step",
        *(["+cpu ms/step"] if with_cpu else []),
        "setup s",
        "teardown s",
        "total s",
        "faults/step",
        "loss",
    ]
    rows = []
    for v, rs in runs.items():
        setup = [r.before - warmup * m / 1e3 for r, m in zip(rs, ms[v])]
        added_cpu = [f"{median(_paired(cpu[v], cpu['plain'], sub)):+.{d}f}"] if with_cpu else []
        rows.append(
            [
                v,
                f"{median(ms[v]):.{d}f}",
                spread(ms[v], d),
                f"{median(_paired(ms[v], ms['plain'], div)):.3f}",
                f"{median(_paired(ms[v], ms['plain'], sub)):+.{d}f}",
                *added_cpu,
                f"{median(setup):.2f}",
                f"{median([r.after for r in rs]):.2f}",
                f"{median([r.total for r in rs]):.2f}",
                f"{median([r.faults / steps for r in rs]):.0f}",
                f"{rs[-1].loss:.4f}",
            ]
        )
    print(table(headers, rows))

    kind, limit = w.target.split(" <= ")
    if kind == "added_ms":
        value = median(_paired(ms["zoo"], ms["plain"], sub))
        shown, budget = f"{value:+.3f} ms/step", f"{float(limit)} ms/step"
    else:
        value = median(_paired(ms["zoo"], ms["plain"], div))
        shown, budget = f"{(value - 1) * 100:+.1f}%", f"{(float(limit) - 1) * 100:.0f}%"
    verdict = "met" if value <= float(limit) else "MISSED"
    print(f"target for {name}: zoo within {budget} of plain -> {shown}: {verdict}")

    ablated = [v for v in runs if " -" in v]  # "zoo -<part>", "lightning -<part>" (--ablate)
    if ablated:
        print("--ablate: what each run saves per step without one part (paired difference, median over repeats):")
        rows = []
        for v in ablated:
            base = v.partition(" -")[0]
            saved, saved_cpu = _paired(ms[base], ms[v], sub), _paired(cpu[base], cpu[v], sub)
            extra = [f"{median(saved_cpu):+.{d}f}", spread(saved_cpu, d)] if with_cpu else []
            rows.append(
                (median(saved_cpu if with_cpu else saved), [v, f"{median(saved):+.{d}f}", spread(saved, d), *extra])
            )
        extra_headers = ["cpu ms/step saved", "range"] if with_cpu else []
        print(
            table(
                ["left out", "ms/step saved", "range", *extra_headers],
                [r for _, r in sorted(rows, key=lambda t: -t[0])],
            )
        )

    notes = sorted({n for v in runs if v != "plain" for r in runs[v] for n in r.warnings})
    for n in notes:
        print(f"   warning seen in the Lightning runs: {n[:200]}")


def profile(w: Workload, loader: DataLoader, warmup: int, device: torch.device, tmp: Path) -> None:
    """One zoo run under SimpleProfiler: time per step of each callback hook and Trainer action."""
    profiler = SimpleProfiler()
    run, _ = run_lightning(w, loader, warmup, device, tmp, full=True, profiler=profiler)
    steps = len(loader)
    per_callback: dict[str, list] = {}
    rows = []
    for action, durations in profiler.recorded_durations.items():
        if len(durations) < steps // 2:  # per-step actions only; one-time ones are in "setup"
            continue
        us = sum(durations) / steps * 1e6
        if action.startswith("[Callback]"):
            cb, hook = action.removeprefix("[Callback]").rsplit(".", 1)
            entry = per_callback.setdefault(cb.split("{")[0], [0.0, 0, "", 0.0])
            entry[0] += us
            entry[1] += 1
            if us > entry[3]:
                entry[2], entry[3] = hook, us
        elif us >= 5:
            rows.append([action, f"{us:.1f}", ""])
    cb_rows = [
        [f"[Callback]{cb} ({n} hooks)", f"{us:.1f}", f"{hook} {top:.1f}"]
        for cb, (us, n, hook, top) in sorted(per_callback.items(), key=lambda kv: -kv[1][0])
    ]
    per_step = run.window / (steps - warmup) * 1e3
    print(
        f"profile of one zoo run ({steps} steps, {per_step:.3f} ms/step under the profiler). "
        "Lightning actions nest (run_training_batch holds optimizer_step, which holds training_step and backward); "
        "callbacks are summed over their per-step hooks:"
    )
    print(table(["action", "us/step", "costliest hook us/step"], rows + cb_rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="See the module docstring for how to read the figures."
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default: mlp 500, resnet18 12)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps before the window, >= 1 (default: mlp 50, resnet18 2)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="interleaved repeats of the variants (default: mlp 5, resnet18 3)"
    )
    parser.add_argument("--workloads", default="mlp,resnet18", help="comma-separated, from: " + ", ".join(WORKLOADS))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: PyTorch's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    parser.add_argument("--profile", action="store_true", help="add one SimpleProfiler'd zoo run per workload")
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="also run the zoo setup without each callback, the progress bar, MLflow (one at a time)",
    )
    parser.add_argument(
        "--zero-grad-first",
        action="store_true",
        help="plain loop zeroes gradients before the forward instead of Lightning's order",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    if args.warmup is not None and args.warmup < 1:
        parser.error("--warmup must be >= 1 (the window starts after step warmup - 1)")

    sys.stdout.reconfigure(line_buffering=True)
    set_threads(args.threads)
    device = resolve_device(args.device)
    import mlflow  # noqa: F401  (imported first: it sets its own log level on import)

    for lg in ("lightning.pytorch", "lightning.fabric", "mlflow", "alembic"):
        logging.getLogger(lg).setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch.loggers.mlflow").setLevel(logging.ERROR)  # "Experiment ... Creating it."
    t_start = time.perf_counter()
    print_header("bench/overhead.py: zoo default setup vs a plain PyTorch loop", device)
    print(
        f"plain loop order: {'zero_grad, forward' if args.zero_grad_first else 'forward, zero_grad (as Lightning)'}, "
        "backward, step"
    )
    with tempfile.TemporaryDirectory(prefix="zoo_bench_") as d:
        tmp = Path(d)
        cwd = os.getcwd()
        os.chdir(tmp)  # runs/, mlruns/ and the exception-checkpoint folder land in the throwaway dir
        try:
            print(describe_zoo_setup(device, tmp))
            # Discarded round: imports, MLflow's database creation, allocator and thread-pool start-up.
            warm = WORKLOADS["mlp"]
            for v in VARIANTS:
                run_variant(v, warm, make_loader(warm, 12), 2, device, tmp, args.zero_grad_first)
            for n in names:
                bench_workload(n, WORKLOADS[n], args, device, tmp)
        finally:
            os.chdir(cwd)
    print(f"\nwall time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
