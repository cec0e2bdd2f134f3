"""bench/env_steps.py: its two arms play the same episodes (the times compare equal work)."""

from __future__ import annotations


def test_the_benchmarks_arms_play_the_same_episodes(capsys):
    from bench.env_steps import main

    out = main(["--latencies", "0.01", "--seeds", "1", "--group", "2", "--max-turns", "2", "--repeats", "1"])
    assert all(row["same"] for row in out.values()) and len(out) == 2
    assert "threads / one after another" in capsys.readouterr().out
