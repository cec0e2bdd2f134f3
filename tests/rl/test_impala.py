"""IMPALA: V-trace against the paper's per-step definition and against GAE on-policy; the actor processes'
shared-memory slots against an in-process replay of the same actors; actor failures, Ctrl-C and shutdown;
fit, predict and resume through cli.py; and a CartPole run that learns."""

from __future__ import annotations

import csv
import glob
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli, output
from lightning.pytorch import Callback
from rl_baselines import BaselineReturns

from datamodules import GymDataModule
from zoo.rl import ActorCritic, IMPALAModule, RolloutCollector, gae, vtrace
from zoo.rl.actors import ActorError, ActorPool, EnvSpec, actor_seed

TINY = str(CONFIGS / "rl" / "impala_tiny.yaml")
CARTPOLE = str(CONFIGS / "rl" / "impala_cartpole.yaml")
QUIET = ("--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false")


# -- V-trace ---------------------------------------------------------------------------------------------


def naive_vtrace(log_rhos, discounts, rewards, values, truncated, rho_bar, pg_rho_bar, c_bar, lam):
    """The paper's definition, per env and per start step s, a double loop (Espeholt et al. 2018, eq. 1):
        v_s = V(x_s) + sum_{t >= s} (prod_{i=s}^{t-1} gamma_i c_i) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),
    the sum stopping after a truncated step (its trace ends there); A_s = rho_pg_s (r_s + gamma_s v_{s+1} - V(x_s))
    with v_{s+1} = V(x_{s+1}) past the unroll or after a truncation."""
    t_len, n = rewards.shape
    rhos = np.exp(log_rhos)
    clip = lambda x, bar: x if bar is None else np.minimum(bar, x)  # noqa: E731
    vs, adv = np.zeros((t_len, n)), np.zeros((t_len, n))
    for i in range(n):
        for s in range(t_len):
            total, weight = values[s, i], 1.0
            for t in range(s, t_len):
                delta = clip(rhos[t, i], rho_bar) * (rewards[t, i] + discounts[t, i] * values[t + 1, i] - values[t, i])
                total += weight * delta
                if truncated[t, i]:
                    break
                weight *= discounts[t, i] * lam * clip(rhos[t, i], c_bar)
            vs[s, i] = total
        for s in range(t_len):
            next_v = vs[s + 1, i] if s + 1 < t_len and not truncated[s, i] else values[s + 1, i]
            adv[s, i] = clip(rhos[s, i], pg_rho_bar) * (rewards[s, i] + discounts[s, i] * next_v - values[s, i])
    return vs, adv


def random_unroll(t_len=23, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ends = torch.rand(t_len, n, generator=g)
    terminated, truncated = ends < 0.1, (ends >= 0.1) & (ends < 0.2)
    f64 = dict(generator=g, dtype=torch.float64)
    return {
        "log_rhos": 0.7 * torch.randn(t_len, n, **f64),
        "discounts": 0.97 * (~terminated).double(),
        "rewards": torch.randn(t_len, n, **f64),
        "values": torch.randn(t_len + 1, n, **f64),
        "truncated": truncated,
        "terminated": terminated,
    }


@pytest.mark.parametrize(
    "rho_bar, pg_rho_bar, c_bar, lam", [(1.0, 1.0, 1.0, 1.0), (2.0, 0.8, 0.9, 0.95), (None, None, None, 1.0)]
)
def test_vtrace_equals_the_papers_per_step_definition(rho_bar, pg_rho_bar, c_bar, lam):
    u = random_unroll()
    out = vtrace(
        u["log_rhos"], u["discounts"], u["rewards"], u["values"], u["truncated"], rho_bar, pg_rho_bar, c_bar, lam
    )
    vs, adv = naive_vtrace(
        *(u[k].numpy() for k in ("log_rhos", "discounts", "rewards", "values", "truncated")),
        rho_bar,
        pg_rho_bar,
        c_bar,
        lam,
    )
    torch.testing.assert_close(out.vs, torch.from_numpy(vs))
    torch.testing.assert_close(out.pg_advantages, torch.from_numpy(adv))


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_vtrace_on_policy_is_the_lambda_return(lam):
    # pi = mu (log-rhos 0), clipping at or above 1: v_s is GAE's value target (the n-step return for lambda 1,
    # the TD(lambda) return below), and for lambda 1 the policy-gradient advantage is GAE's advantage.
    u = random_unroll(seed=1)
    zeros = torch.zeros_like(u["log_rhos"])
    adv, returns = gae(u["rewards"], u["values"], u["terminated"], u["truncated"], gamma=0.97, gae_lambda=lam)
    for clip in (1.0, 3.0, None):
        out = vtrace(zeros, u["discounts"], u["rewards"], u["values"], u["truncated"], clip, clip, clip, lam)
        torch.testing.assert_close(out.vs, returns)
        if lam == 1.0:
            torch.testing.assert_close(out.pg_advantages, adv)


def test_vtrace_bootstraps_a_truncation_from_the_final_observation_and_not_a_termination():
    # One env: step 0 truncates (values[1] = V(final obs) = 10), step 1 is the autoreset step (its TD error and
    # ratio must not reach step 0), step 2 terminates (no bootstrap from values[3]). gamma 0.5, on-policy at 0.
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[4.0], [10.0], [3.0], [7.0]])
    truncated, terminated = torch.tensor([[True], [False], [False]]), torch.tensor([[False], [False], [True]])
    log_rhos = torch.tensor([[0.0], [3.0], [0.0]])
    out = vtrace(log_rhos, 0.5 * (~terminated).float(), rewards, values, truncated)
    assert out.vs[0].item() == pytest.approx(1 + 0.5 * 10)  # bootstrapped from V(final obs), trace cut
    assert out.pg_advantages[0].item() == pytest.approx(1 + 0.5 * 10 - 4)
    assert out.vs[2].item() == pytest.approx(2) and out.pg_advantages[2].item() == pytest.approx(2 - 3)


# -- actor processes and shared slots --------------------------------------------------------------------

FIELDS = ("obs", "actions", "logprobs", "rewards", "terminated", "truncated", "valid")


def ignores_sigint(pid: int) -> bool:
    mask = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn"))
    return bool(int(mask.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: not even a zombie left


def test_actors_hand_their_unrolls_to_the_learner_intact(one_thread):
    # Short time limit: the unrolls hold truncations as well as terminations and autoreset steps.
    dm = GymDataModule("CartPole-v1", max_episode_steps=12)
    torch.manual_seed(0)
    net = ActorCritic(4, 2, hidden_sizes=(8,))
    t_len, n, seed = 10, 3, 5
    pool = ActorPool(EnvSpec.of(dm), net, num_actors=2, envs_per_actor=n, unroll_length=t_len, num_slots=3, seed=seed)
    pids = [p.pid for p in pool.processes]
    got: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    try:
        assert all(ignores_sigint(pid) for pid in pids)  # Ctrl-C reaches the group; the learner stops them
        while min(sum(a == r for a, _ in got) for r in (0, 1)) < 3:
            k = pool.get()
            # The slot is the learner's until released: read it in two halves with the actors running between.
            first = {f: getattr(pool.slots, f)[k].clone() for f in FIELDS[:3]}
            time.sleep(0.02)
            rest = {f: getattr(pool.slots, f)[k].clone() for f in FIELDS[3:]}
            rank, unroll, version = pool.slots.meta[k].tolist()
            assert version == 0 and (rank, unroll) not in got
            got[(rank, unroll)] = {**first, **rest}
            pool.release(k)

        # Published weights reach the actors at their next unroll, and they act with them.
        new = ActorCritic(4, 2, hidden_sizes=(8,))
        assert pool.publish(new) == 1
        while True:
            k = pool.get()
            if pool.slots.meta[k, 2] == 1:
                obs, actions = pool.slots.obs[k, :-1].flatten(0, 1), pool.slots.actions[k].flatten()
                torch.testing.assert_close(
                    pool.slots.logprobs[k].flatten(), new.get_action_and_value(obs, actions)[1].detach()
                )
                break
            pool.release(k)

        # An actor that dies is reported, not waited for.
        os.kill(pids[1], signal.SIGKILL)
        pool.processes[1].join()
        with pytest.raises(ActorError, match=r"actor 1 .* exited with code -9"):
            pool.take(1)
    finally:
        pool.close()
    assert_gone(pids)

    # Replay each actor in this process with RolloutCollector on the same seeds: the same numbers, in order.
    assert torch.stack([u["terminated"].any() for u in got.values()]).any()
    assert torch.stack([u["truncated"].any() for u in got.values()]).any()
    for rank in (0, 1):
        torch.manual_seed(actor_seed(seed, rank))
        collector = RolloutCollector(EnvSpec.of(dm).make_envs(n), t_len, seed=seed + rank * n)
        unrolls = [got[(rank, u)] for u in range(max(u for r, u in got if r == rank) + 1)]
        for i, unroll in enumerate(unrolls):
            r = collector.collect(net)
            for f in FIELDS:
                torch.testing.assert_close(unroll[f][:t_len], getattr(r, f), msg=f"actor {rank} unroll {i} {f}")
            if i + 1 < len(unrolls):  # row T is the observation the next unroll starts from
                torch.testing.assert_close(unroll["obs"][t_len], unrolls[i + 1]["obs"][0])
        collector.close()


def test_a_failing_actor_raises_its_traceback_in_the_learner():
    cartpole = GymDataModule("CartPole-v1").spaces
    spec = EnvSpec(GymDataModule, {"env_id": "NoSuchEnv-v0"}, *cartpole)
    pool = ActorPool(spec, ActorCritic(4, 2), num_actors=1, envs_per_actor=2, unroll_length=4, num_slots=1, seed=0)
    pids = [p.pid for p in pool.processes]
    try:
        with pytest.raises(ActorError, match=r"(?s)actor 0 failed:\nTraceback.*NoSuchEnv"):
            pool.take(1)
    finally:
        pool.close()
    assert_gone(pids)


# -- through cli.py --------------------------------------------------------------------------------------


def test_continuous_actions_train_and_evaluate():
    c = cli(
        "fit",
        "--config",
        TINY,
        "--data.init_args.env_id=Pendulum-v1",
        "--model.init_args.net.init_args.obs_dim=3",
        "--model.init_args.net.init_args.action_dim=1",
        "--model.init_args.net.init_args.continuous=true",
        "--trainer.fast_dev_run=1",
        *QUIET,
    )
    assert int(c.model.env_steps) == 128
    assert c.trainer.callback_metrics["val/return"].item() < 0  # Pendulum's rewards are all negative


class InterruptAfterFourSteps(Callback):
    """Ctrl-C once four learner steps, their evaluation and checkpoint are done; records the actors' pids."""

    pids: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        InterruptAfterFourSteps.pids = [p.pid for p in pl_module.actors.processes]
        if batch_idx == 4:
            raise KeyboardInterrupt


class RecordFirstBatch(Callback):
    seen: dict = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not RecordFirstBatch.seen:
            RecordFirstBatch.seen = {
                "env_steps": int(pl_module.env_steps),
                "rng": torch.get_rng_state(),
                "pids": [p.pid for p in pl_module.actors.processes],
            }


def test_tiny_fits_predicts_and_reloads():
    c = cli("fit", "--config", TINY)
    model, trainer = c.model, c.trainer
    assert int(model.env_steps) == 1024 and trainer.global_step == 8  # 8 learner steps of 2 x 4 envs x 16 steps
    assert model.actors is None
    from mlflow.tracking import MlflowClient

    run = MlflowClient(trainer.logger._tracking_uri).get_run(trainer.logger.run_id)
    for key in (
        "val/return",
        "train/pg_loss",
        "train/v_loss",
        "train/entropy",
        "train/rho",
        "train/policy_lag",
        "train/episode_return",
        "grad/norm",
        "grad/nonfinite",
        "lr",
    ):
        assert key in run.data.metrics, key
    assert run.data.metrics["grad/norm"] > 0 and run.data.metrics["grad/nonfinite"] == 0
    last = trainer.checkpoint_callback.last_model_path

    cli("predict", "--config", TINY, "--ckpt_path", last)
    rows = list(csv.DictReader(output("predictions.csv").read_text().splitlines()))
    assert [int(r["episode"]) for r in rows] == [0, 1, 2] and all(float(r["return"]) >= 1 for r in rows)

    loaded = IMPALAModule.load_from_checkpoint(last)
    assert int(loaded.env_steps) == 1024
    obs = torch.randn(64, 4) * torch.tensor([1.0, 0.5, 0.1, 0.5])
    torch.testing.assert_close(loaded.act(obs), model.act(obs))


def test_ctrl_c_stops_the_actors_and_fit_resumes():
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful shutdown on KeyboardInterrupt
            cli("fit", "--config", TINY, *QUIET[:1], "--trainer.callbacks+=test_impala.InterruptAfterFourSteps")
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning leaves SIGINT ignored after an interrupt
    assert_gone(InterruptAfterFourSteps.pids)
    (last,) = glob.glob("runs/**/last.ckpt", recursive=True)
    saved = torch.load(last, weights_only=True)
    assert int(saved["state_dict"]["env_steps"]) == 512

    RecordFirstBatch.seen = {}
    second = cli(
        "fit", "--config", TINY, *QUIET[:1], "--ckpt_path", last, "--trainer.callbacks+=test_impala.RecordFirstBatch"
    )
    seen = RecordFirstBatch.seen
    assert seen["env_steps"] == 512 and torch.equal(seen["rng"], saved["rng"]["torch"])
    assert int(second.model.env_steps) == 1024 and second.trainer.global_step == 8
    assert_gone(seen["pids"])


class AnnounceTraining(Callback):
    """Tells a parent process that actors feed the learner (for the Ctrl-C test)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == 2:
            print("LEARNING", flush=True)


def marked_processes(marker: str) -> list[int]:
    """Processes whose environment holds ``marker``: a run's whole process tree, the reparented orphans too."""
    pids = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            if marker.encode() in Path(environ).read_bytes():
                pids.append(int(environ.split("/")[2]))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return pids


# The terminal test's time limits, generous for a loaded 2-core machine (about 10 s / 2 s / 1 s when idle): the
# learner and the fork server each import torch, Lightning and gymnasium before three learner steps; after
# Ctrl-C the learner saves a checkpoint and joins its actors (5 s at most each); then the fork server and the
# resource tracker notice their parent is gone. Past a limit the run's stacks are dumped and the test fails.
STARTUP_S, SHUTDOWN_S, REAP_S = 300.0, 120.0, 60.0


def read_line_until(stream, expected: str, timeout: float) -> bool:
    """Whether ``stream`` yields the line ``expected`` within ``timeout`` seconds (read on a thread, so a
    process that neither prints nor exits cannot hang the test)."""
    found = threading.Event()

    def read() -> None:
        for line in stream:
            if line.strip() == expected:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(timeout)


def stacks_and_kill(proc: subprocess.Popen) -> str:
    """The stacks of a run that overran (its faulthandler prints them on SIGUSR1), then the run killed."""
    os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()[1]


def test_ctrl_c_in_a_terminal_ends_the_run_and_every_actor():
    # A terminal's Ctrl-C is SIGINT to the whole foreground process group: the learner, the fork server and
    # the actors. The learner's handler must stop the actors, and the interpreter then exit, neither hanging
    # on a queue nor leaving a process behind.
    marker = f"ZOO_IMPALA_TEST_{os.getpid()}_{time.time_ns()}"
    env = {
        **os.environ,
        marker: "1",
        "PYTHONPATH": os.pathsep.join([str(CONFIGS.parent), str(CONFIGS.parent / "tests"), str(Path(__file__).parent)]),
    }
    args = [
        "fit",
        "--config",
        TINY,
        "--model.init_args.total_env_steps=100000000",
        *QUIET,
        "--trainer.callbacks+=test_impala.AnnounceTraining",
    ]
    # A terminal's Ctrl-C reaches a Python whose SIGINT raises KeyboardInterrupt; a test runner started as a
    # background job of a non-interactive shell ignores SIGINT, and a child inherits that, so set it here.
    code = (
        "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True); "
        "signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from cli import main; main({args!r})"
    )
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if not read_line_until(proc.stdout, "LEARNING", STARTUP_S):
            pytest.fail(f"no learner step within {STARTUP_S:.0f} s (or the run died):\n{stacks_and_kill(proc)}")
        assert len(marked_processes(marker)) >= 1 + 2  # the learner and its actors (and helpers)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run outlived Ctrl-C by {SHUTDOWN_S:.0f} s:\n{stacks_and_kill(proc)}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1 and "Detected KeyboardInterrupt" in err, err
    assert "Traceback" not in err, err  # no actor died of the signal
    deadline = time.monotonic() + REAP_S  # the fork server and resource tracker leave when the learner is gone
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes(marker) == []


@pytest.mark.slow
def test_cartpole_learns_far_above_random():
    # A random policy averages ~22 on CartPole-v1 and the untrained deterministic one ~9. The first 61440 env
    # steps of the config's run, 12 evaluations, ~4 s here once the fork server runs (its learning rate barely
    # decays by then, so the test keeps it constant rather than annealing it over the shorter budget). The
    # actors' timing makes runs differ even with one seed: six of seed 0 reached 390-500.
    c = cli(
        "fit",
        "--config",
        CARTPOLE,
        "--model.init_args.total_env_steps=61440",
        "--model.init_args.anneal_lr=false",
        *QUIET,
        "--trainer.callbacks+=rl_baselines.BaselineReturns",
    )
    assert int(c.model.env_steps) == 61440
    assert BaselineReturns.untrained < 50 and BaselineReturns.random < 50  # far below: reaching 200 is learning
    assert c.trainer.checkpoint_callback.best_model_score.item() >= 200
    assert c.model.actors is None
