"""What both benchmarks share: the run header, timers that wait for the device, medians, tables."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch


def set_threads(threads: int | None) -> None:
    """Pin intra-op threads (None keeps PyTorch's default: one per physical core)."""
    if threads:
        torch.set_num_threads(threads)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked, but torch.cuda.is_available() is False")
    return device


def print_header(title: str, device: torch.device) -> None:
    """Versions, threads, device and the machine's load: what a reader needs to compare two runs."""
    import lightning

    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    else:
        where = f"CPU {platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()}"
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(f"== {title}")
    print(f"torch {torch.__version__}, lightning {lightning.__version__}, python {platform.python_version()}")
    print(f"device: {device} - {where}; threads: {torch.get_num_threads()} of {os.cpu_count()} CPUs")
    print(f"load average (1/5/15 min) at start: {load}  (a busy machine inflates and scatters the figures)")


def sync(device: torch.device) -> None:
    """Wait for queued kernels, so that a timer read after it covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    sync(device)
    return time.perf_counter()


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float], digits: int = 3) -> str:
    """min-max of the repeats, to show how much to trust the median."""
    return f"{min(xs):.{digits}f}..{max(xs):.{digits}f}" if xs else "-"


def minor_faults() -> int:
    """Minor page faults of this process so far (0 where ``resource`` is missing, i.e. on Windows)."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for j, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- zoo against a peer, in one process ------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name and whether it computes bf16 natively (AVX512-BF16 or AMX), from /proc/cpuinfo."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return (
        f"{name}; bf16 in hardware: {', '.join(bf16) if bf16 else 'no (AVX2 only: bf16 autocast is emulated, slower)'}"
    )


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


def add_clock_arg(ap) -> None:
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time, which other processes on a busy machine "
        "do not inflate (time-slicing), though they still share caches and memory bandwidth",
    )


def peer_header(title: str, threads: int, clock: str = "wall") -> None:
    """What a reader needs to weigh the ratios: CPU model, threads, load, clock; sets the clock ``alternate`` reads."""
    global _clock
    _clock = CLOCKS[clock]
    torch.set_num_threads(threads)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(f"== {title}")
    print(f"torch {torch.__version__}; CPU: {cpu_model()}; threads: {torch.get_num_threads()} of {os.cpu_count()}")
    print(
        f"load average (1/5/15 min) at start: {load}; arms alternate (ABBA) so load drift hits both; "
        f"clock: {clock} ({'process CPU time' if clock == 'cpu' else 'elapsed'})"
    )


def alternate(arms: dict, rounds: int, warmup: int = 1, inner: int = 1) -> dict[str, list[float]]:
    """Time each arm (a no-argument callable) ``inner`` times per round, arms in order and reversed every other
    round; returns ms per call for every round, after ``warmup`` untimed rounds."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(warmup + rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = _clock()
            for _ in range(inner):
                arms[name]()
            if r >= warmup:
                times[name].append((_clock() - t0) * 1e3 / inner)
    return times


def ratio_row(label: str, times: dict[str, list[float]], zoo: str, peer: str, target: float | None = None) -> list:
    """[workload, zoo median/min ms, peer median/min ms, zoo/peer of medians, of mins, per-round median, verdict]."""
    z, p = times[zoo], times[peer]
    paired = median([a / b for a, b in zip(z, p)])
    verdict = "-" if target is None else ("MET" if paired <= target else f"MISSED by {paired / target - 1:.0%}")
    return [
        label,
        f"{median(z):.2f} / {min(z):.2f}",
        f"{median(p):.2f} / {min(p):.2f}",
        f"{median(z) / median(p):.3f}",
        f"{min(z) / min(p):.3f}",
        f"{paired:.3f}",
        "-" if target is None else f"<= {target}",
        verdict,
    ]


RATIO_HEADERS = [
    "workload",
    "zoo ms med / min",
    "peer ms med / min",
    "ratio med",
    "ratio min",
    "paired med",
    "target",
    "verdict",
]


def missing(peer: str, how: str) -> None:
    print(f"-- {peer} is not installed: its rows are skipped ({how})")


# The races' pieces (bench/race_*.py): runs in fresh processes, CPU time less evaluations, the matmul peak, median
# [min, max] with misses, the summary table.


class Clock:
    """CPU and wall time of this process since ``start``, less what ``pause``/``resume`` bracketed."""

    def __init__(self) -> None:
        self.cpu0 = self.wall0 = self.cpu_out = self.wall_out = self.c = self.w = 0.0

    def start(self) -> None:
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def pause(self) -> None:
        self.c, self.w = time.process_time(), time.perf_counter()

    def resume(self) -> None:
        self.cpu_out += time.process_time() - self.c
        self.wall_out += time.perf_counter() - self.w

    def now(self) -> tuple[float, float]:
        return time.process_time() - self.cpu0 - self.cpu_out, time.perf_counter() - self.wall0 - self.wall_out


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """fp32 FLOPs per CPU second of the best of ``repeats`` (n x n) @ (n x n) products."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        torch.mm(a, b)
        best = min(best, time.process_time() - t)
    return 2 * n**3 / best


def race_spread(values: list[float | None], fmt: str) -> str:
    """median [min, max]; a run that missed (None) ranks above every number and shows as "never"."""
    ranked = sorted(float("inf") if v is None else v for v in values)
    show = lambda v: "never" if v == float("inf") else format(v, fmt)  # noqa: E731
    return f"{show(statistics.median_low(ranked))} [{show(ranked[0])}, {show(ranked[-1])}]"


# cli.py arguments that make a race's zoo run bare: nothing but training and the race's own evaluation callback.
QUIET_FIT = (
    "--trainer.limit_val_batches=0",
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.callbacks=[]",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
)


def race_process(threads: int) -> None:
    """A race run's own process: CPU only, ``threads`` intra-op threads, Lightning's and the libraries' messages off
    (each run's one line is the race's output)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(threads)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def race_runs(worker: Callable, jobs: Iterable, processes: int) -> Iterator:
    """``worker(job)`` for every job, each in a fresh spawned process (no state, threads or caches carried over),
    ``processes`` at a time in the jobs' order, yielded as they end."""
    with mp.get_context("spawn").Pool(processes, maxtasksperchild=1) as pool:
        yield from pool.imap_unordered(worker, jobs)


def race_summary(results: dict[str, list[dict]], unit: str, target: str, peak: float, flops_fmt: str = ".0f") -> str:
    """The race's table: per arm its recipe, CPU and wall seconds and ``unit``s (examples, tokens, images) to the
    target, training MFLOP per ``unit`` and the fraction of the matmul ``peak`` it ran at (median over the runs
    that hit); then how many times sooner the zoo was, where every run of both arms hit."""
    lines = [
        f"| arm | recipe | seeds | CPU s to {target} | wall s | {unit}s to {target} | MFLOP/{unit} | matmul peak |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm, rs in results.items():
        hits = [r["hit"] for r in rs]
        rates = [r["flops"] * r["hit"][f"{unit}s"] / r["hit"]["cpu_s"] / peak for r in rs if r["hit"]]
        lines.append(
            f"| {arm} | {rs[0]['what']} | {len(rs)} | {race_spread([h and h['cpu_s'] for h in hits], '.0f')} | "
            f"{race_spread([h and h['wall_s'] for h in hits], '.0f')} | "
            f"{race_spread([h and h[f'{unit}s'] for h in hits], '.0f')} | {format(rs[0]['flops'] / 1e6, flops_fmt)} | "
            f"{f'{statistics.median(rates):.1%}' if rates else '-'} |"
        )
    if len(results) == 2 and all(r["hit"] for rs in results.values() for r in rs):
        med = {arm: statistics.median(r["hit"]["cpu_s"] for r in rs) for arm, rs in results.items()}
        lines.append(f"\nzoo {med['peer'] / med['zoo']:.2f}x sooner than the peer (median CPU s); goal 1.5x")
    return "\n".join(lines)
