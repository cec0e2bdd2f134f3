"""The races' shared pieces (bench/_common.py): median [min, max] with misses, and the summary table's figures by
hand."""

from __future__ import annotations

from bench._common import race_spread, race_summary


def test_spread_ranks_a_miss_above_every_time():
    assert race_spread([3.0, None, 1.0], ".0f") == "3 [1, never]"
    assert race_spread([5.0, 2.0, 9.0], ".1f") == "5.0 [2.0, 9.0]"


def _run(cpu_s: float | None, tokens: int = 1000, flops: float = 2e6) -> dict:
    hit = cpu_s and {"cpu_s": cpu_s, "wall_s": 2 * cpu_s, "tokens": tokens}
    return {"hit": hit, "flops": flops, "what": "recipe"}


def test_summary_takes_medians_the_peak_fraction_of_hits_and_the_speedup():
    results = {"peer": [_run(10.0), _run(30.0), _run(20.0)], "zoo": [_run(4.0, 500), _run(5.0, 500), _run(6.0, 500)]}
    lines = race_summary(results, "token", "1.95", peak=1e9, flops_fmt=".1f").splitlines()
    peer, zoo = lines[2].split(" | "), lines[3].split(" | ")
    assert peer[3:6] == ["20 [10, 30]", "40 [20, 60]", "1000 [1000, 1000]"] and peer[6] == "2.0"
    # 2 MFLOP x 1000 tokens / 20 CPU s (the median rate over the hits) / 1 GFLOP/s
    assert peer[7] == "10.0% |" and zoo[7] == "20.0% |"
    assert lines[-1] == "zoo 4.00x sooner than the peer (median CPU s); goal 1.5x"


def test_summary_says_never_and_claims_no_speedup_when_a_run_missed():
    results = {"peer": [_run(None), _run(None)], "zoo": [_run(4.0), _run(None)]}
    lines = race_summary(results, "token", "1.95", peak=1e9).splitlines()
    assert lines[2].split(" | ")[3] == "never [never, never]" and lines[2].endswith("| - |")
    assert lines[3].split(" | ")[3] == "4 [4, never]"  # the low median of two
    assert not any("sooner" in line for line in lines)
