"""GRPO under DDP (2 CPU processes, gloo): the ranks sample different prompts, and each prompt's group of G
completions is whole on its rank, where its advantages are computed (tests/scripts/grpo_ranks.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from zoo.train.policy_gradient import group_advantages

SCRIPT = str(ROOT / "tests" / "scripts" / "grpo_ranks.py")
G, BATCHES, ITERATIONS = 4, 3, 2  # the script's: minibatches of one prompt's group


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[dict, dict]:
    folder = tmp_path_factory.mktemp("grpo_ddp")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, SCRIPT], cwd=folder, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(folder / "rank0.pt"), torch.load(folder / "rank1.pt")


def _steps(rank: dict) -> list[tuple[dict, dict]]:
    """(the batch, its rollout and scores) per batch."""
    seen = rank["steps"]
    return list(zip(seen[0::2], seen[1::2], strict=True))


@pytest.mark.slow  # two processes, ~20 s
def test_ranks_sample_other_prompts_and_score_each_group_whole_on_its_rank(ranks):
    assert ranks[0]["world"] == 2 and len(_steps(ranks[0])) == len(_steps(ranks[1])) == BATCHES
    for (batch0, _), (batch1, _) in zip(_steps(ranks[0]), _steps(ranks[1])):
        assert not {tuple(p) for p in batch0["prompts"]} & {tuple(p) for p in batch1["prompts"]}
    for rank in ranks:
        for batch, step in _steps(rank):
            ids, pad, rewards = step["ids"], step["pad"], step["rewards"]
            assert len(ids) == len(rewards) == G * len(batch["prompts"])
            for r in range(len(ids)):  # row r: a completion of this rank's prompt r // G, after its left padding
                prompt = batch["prompts"][r // G]
                assert ids[r, pad[r] : pad[r] + len(prompt)].tolist() == prompt
            assert rewards.view(-1, G).std(1).gt(0).any()  # groups that differ: the advantages are not all 0
            groups = len(batch["prompts"])
            assert len(step["advantages"]) == ITERATIONS * groups  # an optimizer step per group, per pass
            for j, advantages in enumerate(step["advantages"]):  # each from its own group's rewards, whole
                rows = slice(j % groups * G, (j % groups + 1) * G)
                torch.testing.assert_close(advantages, group_advantages(rewards[rows], G))
    for k, v in ranks[0]["state"].items():  # the gradients were averaged across ranks: the same weights
        torch.testing.assert_close(v, ranks[1]["state"][k], rtol=0, atol=0, msg=k)
