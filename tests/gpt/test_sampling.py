"""The sampling filters against transformers' logits warpers, applied as its ``generate`` applies them
(``GenerationMixin._get_logits_processor``: temperature, then top-k, then top-p): the same kept ids, the same
probabilities, with all three active together."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from zoo.gpt.generate import filter_logits, probabilities


def transformers_scores(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    scores = logits
    for warp in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)):
        scores = warp(None, scores)
    return scores


def settings(n: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        temperature = float(torch.empty(1).uniform_(0.3, 2.0, generator=g))
        top_k = int(torch.randint(1, v + 1, (1,), generator=g))
        top_p = float(torch.empty(1).uniform_(0.05, 0.99, generator=g))
        yield temperature, top_k, top_p


def test_the_kept_ids_and_probabilities_are_transformers_on_random_logits():
    v, g = 50, torch.Generator().manual_seed(0)
    sizes = []
    for temperature, top_k, top_p in settings(300, v, seed=1):
        logits = torch.randn(16, v, generator=g) * 3
        theirs = transformers_scores(logits, temperature, top_k, top_p)
        ours = filter_logits(logits / temperature, top_k, top_p)
        assert torch.equal(ours.isfinite(), theirs.isfinite()), (temperature, top_k, top_p)
        torch.testing.assert_close(probabilities(logits, temperature, top_k, top_p), theirs.softmax(-1))
        sizes += ours.isfinite().sum(-1).tolist()
    # the settings reach both filters: from one id kept to most of the vocabulary
    assert min(sizes) == 1 and max(sizes) > 30 and len(set(sizes)) > 20


def test_ties_at_the_edge_stay_or_go_together_and_are_the_only_difference():
    """Integer logits tie often. top-k keeps every id tied with the k-th, in both. At the nucleus' edge transformers
    keeps whichever tied ids its sort puts first; here they are kept together, so the kept set is closed under ties
    and adds to transformers' only ids tied with its least likely kept one."""
    v, g = 30, torch.Generator().manual_seed(0)
    differ = 0
    for temperature, top_k, top_p in settings(300, v, seed=2):
        logits = torch.randint(-3, 4, (8, v), generator=g).float()
        theirs = transformers_scores(logits, temperature, top_k, top_p).isfinite()
        ours = filter_logits(logits / temperature, top_k, top_p).isfinite()
        assert (ours | ~theirs).all(), "an id transformers keeps is dropped"
        lowest_kept = torch.where(theirs, logits, torch.inf).min(-1, keepdim=True).values
        assert ((ours == theirs) | (logits == lowest_kept)).all(), "an id beyond the edge's ties is added"
        for row, kept in zip(logits, ours):  # closed under ties: an id tied with a kept one is kept
            assert set(row[kept].tolist()).isdisjoint(row[~kept].tolist())
        differ += int((ours != theirs).any(-1).sum())
    assert differ > 0, "the test needs ties that transformers splits"


def test_the_repetition_penalty_is_transformers_before_the_warpers():
    """CTRL's penalty on the ids seen so far, then temperature, top-k and top-p, as transformers' processors list
    applies them: the same distribution (a row's left padding excepted: no token of its own here)."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from zoo.gpt.generate import penalize_repetition

    v, g = 50, torch.Generator().manual_seed(0)
    for (temperature, top_k, top_p), penalty in zip(settings(50, v, seed=3), torch.linspace(0.5, 2.0, 50).tolist()):
        logits, seen = torch.randn(4, v, generator=g) * 3, torch.randint(0, v, (4, 12), generator=g)
        theirs = transformers_scores(RepetitionPenaltyLogitsProcessor(penalty)(seen, logits), temperature, top_k, top_p)
        ours = penalize_repetition(logits, seen, torch.ones_like(seen, dtype=torch.bool), penalty)
        ours = probabilities(ours, temperature, top_k, top_p)
        torch.testing.assert_close(ours, theirs.softmax(-1), atol=1e-5, rtol=0)
    pad = torch.tensor([[7, 7, 3]])  # slots 0-1 are padding (id 7): only id 3 is the row's own
    logits = torch.ones(1, v)
    out = penalize_repetition(logits, pad, torch.tensor([[False, False, True]]), 2.0)
    assert out[0, 3] == 0.5 and out[0, 7] == 1.0


def test_a_repetition_penalty_with_a_speculative_draft_is_refused_in_one_line():
    import pytest

    from zoo.errors import InputError
    from zoo.gpt.generate import Generation

    with pytest.raises(InputError, match="generation.draft=mtp must be null with a repetition_penalty"):
        Generation(draft="mtp", repetition_penalty=1.2)
