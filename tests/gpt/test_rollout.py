"""Rollouts for GRPO (zoo.gpt.tune.rollout): groups, masks through the stop token, and the sampling pass's
log-probabilities equal to one forward pass's."""

from __future__ import annotations

import pytest
import torch

from zoo.errors import InputError
from zoo.gpt import GPT, generate
from zoo.gpt.tune.rollout import per_token_logps, sample_groups

V, STOP = 50, (3, 7, 11)


@pytest.fixture(scope="module")
def net() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=V, block_size=32, n_layer=2, n_embd=32, n_head=4, position="rope").double()


def prompts() -> list[torch.Tensor]:
    return [torch.tensor([5, 9, 12, 40]), torch.tensor([20]), torch.tensor([1, 2])]  # left-padded together


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_sampling_pass_log_probs_are_one_forward_pass(net, temperature):
    g = torch.Generator().manual_seed(0)
    out = sample_groups(net, prompts(), 4, 12, temperature, stop_ids=STOP, generator=g)
    again = per_token_logps(net, out.ids, out.completion_mask, temperature, out.pad)
    torch.testing.assert_close(again, out.logps, rtol=0, atol=1e-9)
    assert (out.logps[out.completion_mask.bool()] < 0).all()


def test_groups_masks_and_the_tokens_are_what_generate_samples(net):
    out = sample_groups(net, prompts(), 4, 12, 0.7, stop_ids=STOP, generator=torch.Generator().manual_seed(1))
    assert out.completion_ids.shape == out.completion_mask.shape == out.logps.shape == (12, 12)
    rows = [p for p in prompts() for _ in range(4)]  # each prompt G times, consecutively
    plain = generate(net, rows, 12, 0.7, stop_ids=STOP, generator=torch.Generator().manual_seed(1))
    lengths = out.completion_mask.sum(1)
    stopped = 0
    for ids, mask, n, want in zip(out.completion_ids, out.completion_mask, lengths, plain):
        assert torch.equal(mask[:n], torch.ones(n, dtype=mask.dtype)) and not mask[n:].any()  # one run from 0
        assert not ids[n:].any()  # nothing after the end
        assert torch.equal(ids[: len(want)], want)  # generate's own draws, with the same generator
        if n < 12 or int(ids[-1]) in STOP:  # ended at a stop id: it is in the completion (the policy learns to stop)
            stopped += 1
            assert int(ids[n - 1]) in STOP and len(want) == n - 1
    assert 0 < stopped < 12
    for r, p in enumerate(rows):  # the prompts, left-padded, before the completions
        assert torch.equal(out.ids[r, out.pad[r] : 4], p) and not out.ids[r, : out.pad[r]].any()


def test_rollouts_refuse_greedy_decoding_and_a_budget_past_block_size(net):
    with pytest.raises(InputError, match="temperature"):
        sample_groups(net, prompts(), 2, 4, temperature=0)
    with pytest.raises(InputError, match="block_size"):
        sample_groups(net, prompts(), 2, 40)


def test_trimmed_drops_only_the_columns_every_completion_pads(net):
    g = torch.Generator().manual_seed(2)
    out = sample_groups(net, prompts(), 2, 12, 1.0, stop_ids=tuple(range(V - 1)), generator=g)  # 1 to 2 tokens each
    short = out.trimmed()
    n = int(out.completion_mask.sum(1).max())
    assert 1 <= n < 12 and short.completion_mask.shape == short.logps.shape == (6, n)
    assert short.ids.shape == (6, 4 + n) and torch.equal(short.pad, out.pad)
    assert not out.completion_mask[:, n:].any() and torch.equal(short.completion_ids, out.completion_ids[:, :n])
    torch.testing.assert_close(short.logps, per_token_logps(net, short.ids, short.completion_mask, 1.0, short.pad))
    full = sample_groups(net, prompts(), 4, 12, 0.7, stop_ids=STOP, generator=torch.Generator().manual_seed(1))
    assert full.trimmed() is full  # a completion ran to the budget: nothing to drop
