"""RL on the zoo's text environments against the compute-matched row, every stage through ``cli.py`` as a user types it.

Per task: SFT of a small byte-level GPT from scratch on a scripted player's imperfect traces (``sft_<task>.yaml``) ->
registered -> multi-turn GRPO from ``models:/<sft>/<v>`` with the environment (``grpo_<task>.yaml``) -> registered,
and ``sft_more``: the SFT continued from the SFT model on the same kind of data for the rl stage's CPU seconds (fit
and evaluation; validated every ``VAL_EVERY`` steps, the best by validation loss registered), the row RL must beat,
not only the SFT it started from. Each stage is scored by ``cli.py test`` with the environment on held-out seeds
(``grpo_<task>.yaml``'s test seeds, from 2,000,000; the calculator's held-out problems, ``split: test``): success,
mean turns and tool calls per episode (one greedy episode a seed). The ``teacher`` row is the scripted player itself
on the same test episodes. The calculator adds ``notool``: single-turn GRPO from the same SFT model on the same
questions for the same steps, where a call gets no result (``episodes.max_turns=1``), so only a direct answer scores.

The helpers (the subprocess runner, the CPU accounting by the subprocesses' user + system time, the registered
model and test metrics read from the output, the report card, the matched steps) are ``bench/assistant.py``'s.

    python bench/agentic_tasks.py --task calculator --seeds 0 1 2        # ~19 CPU min a seed
    python bench/agentic_tasks.py --task frozenlake --seeds 0 1 2        # ~11 CPU min a seed
    python bench/agentic_tasks.py --task guess_number --seeds 0 1 2      # ~40 CPU min a seed
    python bench/agentic_tasks.py --task calculator --seeds 0 --parallel --sft-more-cpu 180  # the rest at once
    python bench/agentic_tasks.py --task calculator --collect run0.log run1.log   # tabulate earlier runs
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import cpu_model, table  # noqa: E402
from bench.assistant import (  # noqa: E402
    card_of,
    cli,
    collected,
    cpu_seconds,
    matched_steps,
    mean_std,
    registered,
    test_metrics,
)

# Each task: its configs, the scripted teacher (player and env settings, as the sft config writes its traces), the
# test's environment settings, and the stages' default steps.
TASKS = {
    "calculator": {
        "env_id": "zoo/Calculator-v0",
        "player": "sloppy",
        "teacher_kwargs": {"split": "test"},
        "test_args": ["--data.init_args.env_kwargs.split=test"],
        "rl_args": [],
        "steps": {"sft": 1400, "rl": 60},
        "stages": ["sft", "rl", "notool", "sft_more"],
    },
    "guess_number": {
        "env_id": "zoo/GuessNumber-v0",
        "player": "random",
        "teacher_kwargs": {"max_turns": 10, "feedback": "range"},
        "test_args": [],
        # the shipped config's lr is for a pretrained net. No turn cost: with one (0.05) the net learnt to end
        # its episodes sooner by filling their token room with text, a loss costing fewer turns (seed 0)
        "rl_args": ["--model.init_args.optimizer.lr=0.0001"],
        "steps": {"sft": 1000, "rl": 80},
        "stages": ["sft", "rl", "sft_more"],
    },
    "frozenlake": {
        "env_id": "zoo/FrozenLakeText-v0",
        "player": "planner",
        "teacher_kwargs": {"max_turns": 12, "success_rate": 0.8},
        "test_args": [],
        "rl_args": [],
        "steps": {"sft": 1000, "rl": 100},
        "stages": ["sft", "rl", "sft_more"],
    },
}
PARENT = {"rl": "sft", "notool": "sft", "sft_more": "sft"}
VAL_EVERY = 250  # sft_more's validation interval: the registered model is the best of these checks
TEST_SEED, TEST_SEEDS = 2_000_000, 200  # the grpo configs' test seeds (EpisodeDataModule's defaults)
METRICS = ("test/success", "test/turns", "test/tool_calls", "test/reward")


def config(task: str, stage: str) -> Path:
    return ROOT / "configs" / "gpt" / (f"sft_{task}.yaml" if stage in ("sft", "sft_more") else f"grpo_{task}.yaml")


def fit_args(task: str, stage: str, seed: int, steps: int) -> list[str]:
    every = VAL_EVERY if stage == "sft_more" else steps  # rl: the config's own interval (validation seeds)
    args = ["fit", "--config", str(config(task, stage)), f"--seed_everything={seed}", f"--trainer.max_steps={steps}"]
    if stage != "rl" and stage != "notool":
        args.append(f"--trainer.val_check_interval={every}")
    if stage in ("rl", "notool"):
        args += TASKS[task]["rl_args"]
    if stage == "notool":
        args.append("--model.init_args.episodes.max_turns=1")
    return [*args, f"--trainer.logger.init_args.stage={stage}",
            f"--trainer.logger.init_args.registered_model_name={task}-{stage}"]  # fmt: skip


def evaluate(task: str, folder: Path, model: str) -> tuple[dict[str, float], str]:
    """``cli.py test`` of ``model`` (``models:/name/version``) with the task's environment on its test seeds."""
    out = cli(folder, "test", "--config", str(config(task, "rl")), f"--model.init_args.init_weights={model}",
              f"--data.init_args.test_seeds={TEST_SEEDS}", *TASKS[task]["test_args"])  # fmt: skip
    return test_metrics(out), out


def teacher(task: str) -> dict[str, float]:
    """The scripted player on the test seeds, scored as ``cli.py test`` scores a model."""
    import numpy as np

    from zoo.gpt.tune.envs import make
    from zoo.gpt.tune.envs.scripted import PLAYER_STREAM, PLAYERS, play

    spec = TASKS[task]
    env, player = make(spec["env_id"], **spec["teacher_kwargs"]), PLAYERS[spec["env_id"]][spec["player"]]
    rng, rows = np.random.default_rng([0, PLAYER_STREAM]), []
    for seed in range(TEST_SEED, TEST_SEED + TEST_SEEDS):
        _, total, info = play(env, player, rng, seed)
        rows.append((float(info.get("success", False)), info["turns"], info.get("tool_calls", 0), total))
    return {name: statistics.mean(r[k] for r in rows) for k, name in enumerate(METRICS)}


def run_stage(task: str, folder: Path, seed: int, stage: str, n: int, parent: str | None) -> tuple:
    """Fit one stage (from ``parent``, a registered model) and test it: its model, scores, CPU seconds of the fit
    and of the whole stage, and (rl) the report card of its lineage. Run in a process of its own or not, the CPU is
    that of the ``cli.py`` processes it waited for."""
    start = cpu_seconds()
    start_from = [f"--model.init_args.init_weights={parent}"] if parent else []
    model = registered(cli(folder, *fit_args(task, stage, seed, n), *start_from))
    fit_cpu = cpu_seconds() - start
    scores, _ = evaluate(task, folder, model)
    cpu, card = cpu_seconds() - start, ""
    if stage == "rl":  # the lineage's report card: the rl model's test, through its own registered checkpoint
        card = card_of(cli(folder, "test", "--ckpt_path", model, *TASKS[task]["test_args"]))
    print(f"  seed {seed} {stage}: {json.dumps(scores)}  ({cpu / 60:.1f} CPU min)", flush=True)
    return model, scores, fit_cpu, cpu, card


def one_seed(task: str, folder: Path, seed: int, steps: dict[str, int], stages: list[str], given: dict) -> tuple:
    """Scores and CPU seconds per stage for one seed, and the rl model's report card. ``given``: ``sft_model``
    (a registered SFT model in ``folder``'s store to start from, with its fit's CPU ``sft_fit_cpu`` and its test's
    ``sft_test_cpu``), ``sft_more_cpu`` (sft_more's budget; 0: the rl stage's), ``parallel`` (the stages after sft
    at once, each in a process of its own, which needs sft_more's budget given)."""
    folder.mkdir(parents=True, exist_ok=True)
    scores, cpu, models, fit_cpu, card = {}, {}, {}, {}, ""
    if given.get("sft_model"):
        models["sft"], fit_cpu["sft"] = given["sft_model"], given["sft_fit_cpu"]
        cpu["sft"] = fit_cpu["sft"] + given["sft_test_cpu"]
    later = [s for s in stages if s != "sft"]

    def steps_of(stage: str) -> int:
        if stage != "sft_more":
            return steps["rl"]
        budget = given.get("sft_more_cpu") or cpu["rl"]  # fit and test, at the sft stage's CPU per step
        n = matched_steps(budget, fit_cpu["sft"], steps["sft"], cpu["sft"] - fit_cpu["sft"], VAL_EVERY)
        print(f"  seed {seed} {stage}: {n} steps ({fit_cpu['sft'] / steps['sft']:.3f} CPU s a step of sft)")
        return n

    def keep(stage: str, result: tuple) -> None:
        nonlocal card
        models[stage], scores[stage], fit_cpu[stage], cpu[stage], got = result
        card = got or card

    if "sft" not in models and "sft" in stages:
        keep("sft", run_stage(task, folder, seed, "sft", steps["sft"], None))
    if given.get("parallel"):
        with ProcessPoolExecutor(len(later), mp_context=multiprocessing.get_context("fork")) as pool:
            jobs = {s: pool.submit(run_stage, task, folder, seed, s, steps_of(s), models["sft"]) for s in later}
            for stage, job in jobs.items():
                keep(stage, job.result())
    else:  # in order: sft_more after rl, whose CPU it is given
        for stage in later:
            keep(stage, run_stage(task, folder, seed, stage, steps_of(stage), models["sft"]))
    return scores, cpu, card


def chosen_stages(task: str, wanted: list[str] | None, sft_model: str | None) -> list[str]:
    """The task's stages in order: those ``wanted`` (all when None), and sft when its model is given."""
    return [s for s in TASKS[task]["stages"] if not wanted or s in wanted or (s == "sft" and sft_model)]


def report(task: str, runs: list[tuple[dict, dict, str]], stages: list[str]) -> str:
    rows = [["teacher", *(f"{v:.3f}" for v in teacher(task).values()), "-"]]
    for stage in stages:
        got = [(s[stage], c[stage]) for s, c, _ in runs if stage in s]
        if not got:
            continue
        rows.append([stage, *(mean_std([s.get(m, float("nan")) for s, _ in got]) for m in METRICS),
                     f"{statistics.mean(c for _, c in got) / 60:.1f}"])  # fmt: skip
    return table([f"{task} ({len(runs)} seeds)", "success", "turns", "tool calls", "return", "CPU min / seed"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=tuple(TASKS), required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--sft-steps", type=int, help="default: the task's (TASKS)")
    ap.add_argument("--rl-steps", type=int, help="GRPO steps of rl (and notool); default: the task's")
    ap.add_argument("--stages", nargs="+", help="a subset of the task's stages, in order (each needs its parent)")
    ap.add_argument("--sft-more-cpu", type=float, default=0.0, help="sft_more's CPU seconds; 0: the rl stage's")
    ap.add_argument("--parallel", action="store_true", help="the stages after sft at once (needs --sft-more-cpu)")
    ap.add_argument("--sft-model", help="start from this registered SFT model in the workdir's store (one seed)")
    ap.add_argument("--sft-cpu", type=float, nargs=2, metavar=("FIT", "TEST"), help="--sft-model's CPU seconds")
    ap.add_argument("--workdir", default=None, help="where the stores and data go (default: a temporary folder)")
    ap.add_argument("--collect", nargs="+", help="only tabulate the seeds in these earlier runs' outputs")
    args = ap.parse_args()
    spec = TASKS[args.task]
    stages = chosen_stages(args.task, args.stages, args.sft_model)
    if args.collect:
        runs = collected(args.collect)
        return print(report(args.task, runs, [s for s in stages if any(s in r[0] for r in runs)]))
    if missing := {PARENT[s] for s in stages if s in PARENT} - set(stages):
        ap.error(f"--stages needs {sorted(missing)} too: each stage starts from its parent's model")
    if args.parallel and not args.sft_more_cpu:
        ap.error("--parallel runs sft_more beside rl: give its budget, --sft-more-cpu")
    if args.sft_model and not (args.sft_cpu and len(args.seeds) == 1):
        ap.error("--sft-model is one seed's model: give one --seeds and its --sft-cpu FIT TEST")
    given = {"sft_more_cpu": args.sft_more_cpu, "parallel": args.parallel, "sft_model": args.sft_model}
    if args.sft_cpu:
        given.update(sft_fit_cpu=args.sft_cpu[0], sft_test_cpu=args.sft_cpu[1])
    steps = spec["steps"] | {k: v for k, v in (("sft", args.sft_steps), ("rl", args.rl_steps)) if v}
    os.environ["OMP_NUM_THREADS"] = "1"
    print(f"== {args.task}: {', '.join(stages)}; seeds {args.seeds}; steps {steps}")
    print(f"CPU: {cpu_model()}; load average at start: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("times: CPU minutes (user + system) of each stage's cli.py processes, fit and test")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="agentic-"))
    runs = [one_seed(args.task, work / f"{args.task}-seed{s}", s, steps, stages, given) for s in args.seeds]
    print(f"\nReport card of seed {args.seeds[-1]}'s rl model ({work}):\n{runs[-1][2]}\n")
    print(report(args.task, runs, stages))


if __name__ == "__main__":
    main()
