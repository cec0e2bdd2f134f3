"""bench/agentic.py: a synchronous arm waits out its env's latency, the learner clock times the updates and only
them, an asynchronous arm runs, and a latency out of bounds is one error line."""

from __future__ import annotations

import time

import pytest
import torch

from bench.agentic import Setup, main, make_net, run_arm

TINY = Setup(n_layer=1, n_embd=16, block_size=320, seeds_per_step=1, group_size=2, turns=2, new_tokens=4)


def test_a_sync_arm_waits_out_the_latency_and_its_clock_times_the_updates_alone(monkeypatch):
    from zoo.gpt import GRPOModule

    updates, update = [], GRPOModule.update

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return update(self, *args, **kwargs)
        finally:
            updates.append(time.perf_counter() - start)

    monkeypatch.setattr(GRPOModule, "update", timed)
    latency, steps, threads = 0.05, 3, torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the learner's CPU seconds never outrun the wall's
    try:
        out = run_arm(TINY, make_net(TINY).state_dict(), 0, latency, steps)
    finally:
        torch.set_num_threads(threads)
    assert len(updates) == steps and out["episodes"] == (steps - 1) * TINY.episodes_per_step
    # A random net never guesses in the game's format, so every episode runs all its turns, and the synchronous
    # learner sits idle through each turn's latency: wall seconds less its CPU seconds cover them all (a step's
    # episodes wait at once, their envs stepped together: zoo.gpt.tune.env_steps; the clock starts within the first
    # measured turn, so a few ms of its wait fall before it).
    waits = out["episodes"] // TINY.episodes_per_step * TINY.turns
    assert out["wall_s"] - out["learner_cpu_s"] >= (waits - 0.5) * latency
    window = sum(updates[1:])  # the figures count from the end of step 1
    assert 0.5 * window <= out["busy_s"] <= window  # the update's forward, backward and step; no sampling
    assert 0 < out["busy"] < 1 and out["staleness"] == 0 and out["tokens_per_episode"] > 0
    assert out["cpu_s"] == out["learner_cpu_s"] > 0


@pytest.mark.slow  # starts actor processes and the fork server: ~20 s on 2 cores
def test_the_bench_runs_both_arms_and_prints_the_summary(capsys):
    tiny = "--n-layer 1 --n-embd 16 --group-size 2 --seeds-per-step 1 --turns 2 --new-tokens 4".split()
    rows = main(["--steps", "3", "--repeats", "1", "--latencies", "0", "0.02", "--actors", "1", *tiny])
    assert [(r["latency"], r["actors"]) for r in rows] == [(0.0, 0), (0.0, 1), (0.02, 0), (0.02, 1)]
    assert all(r["actor_cpu_s"] > 0 for r in rows if r["actors"])
    text = capsys.readouterr().out
    assert "CPU: " in text and "learner threads 1" in text and "busy CPU med" in text


def test_a_latency_out_of_bounds_is_refused_before_anything_runs():
    with pytest.raises(SystemExit, match=r"^error: --latencies: step_latency=.*give seconds from 0 to 10"):
        main(["--latencies", "11", "0"])
