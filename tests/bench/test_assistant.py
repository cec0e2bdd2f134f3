"""bench/assistant.py's compute-matched stage: SFT continued for the CPU seconds the rl stage used."""

from bench.assistant import matched_steps


def test_the_matched_sft_spends_the_budget_less_its_evaluations_in_whole_validation_intervals():
    # seed 0's run: sft's 250 steps in 81 CPU s, its evaluations 33 s; GRPO's stage 960 s -> 2,861 steps -> 2,750
    assert matched_steps(960, 81, 250, 33, 250) == 2750
    assert matched_steps(960, 81, 250, 0, 250) == 3000  # evaluations are part of the budget
    assert matched_steps(960, 162, 250, 33, 250) == 1500  # twice the CPU per step, half the steps
    assert matched_steps(10, 81, 250, 33, 250) == 250  # at least one validated interval
    assert matched_steps(100, 10, 10, 0, 1) == 100  # 1 CPU s a step: 100 s are 100 steps
