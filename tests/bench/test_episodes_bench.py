"""bench/episodes.py: its two arms play the same episodes (the rate compares equal work)."""

from __future__ import annotations


def test_the_benchmarks_arms_play_the_same_episodes(capsys):
    from bench.episodes import main

    out = main(["--seeds", "2", "--group", "2", "--max-turns", "2", "--max-new-tokens", "4", "--block-size", "192"])
    assert out["same"] is True and out["alone"] > 0 and out["together"] > 0
    assert "episodes per CPU second" in capsys.readouterr().out
