"""The shared training and I/O parts against closed forms and invariants: the warmup-cosine learning rate, the
weight-decay groups, loading pretrained weights under a new head, CLIP-style caption ids."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from zoo.io.tokenizers import ByteTokenizer, tokenize
from zoo.io.weights import load_with_new_head, shape_mismatches
from zoo.train.optim import WarmupCosine, param_groups


def _lrs(warmup: int, total: int, min_ratio: float, steps: int, base: float = 2.0) -> list[float]:
    """The learning rate each optimizer step runs with, read from the optimizer as training would."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=base)
    sched = WarmupCosine(opt, warmup, total, min_ratio)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_cosine_follows_its_closed_form():
    # Warmup 4 of 12 steps, floor 0.1, base 2: linear (s + 1) / 4 for s < 4, then
    # 0.1 + 0.9 * (1 + cos(pi * (s - 4) / 8)) / 2, then the floor.
    want = [0.25, 0.5, 0.75, 1.0]
    want += [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 4) / 8)) for s in range(4, 13)]
    want += [0.1] * 3
    assert _lrs(4, 12, 0.1, 16) == pytest.approx([2.0 * w for w in want], rel=1e-12)
    # Landmarks read off the curve: the peak right after warmup, halfway between peak and floor at mid-decay.
    lrs = _lrs(4, 12, 0.1, 16, base=1.0)
    assert lrs[4] == pytest.approx(1.0) and lrs[8] == pytest.approx(0.55) and lrs[12] == pytest.approx(0.1)
    assert _lrs(0, 4, 0.0, 6, base=1.0) == pytest.approx(
        [1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5, 0.5 - 0.5 * math.cos(math.pi / 4), 0.0, 0.0]
    )


def test_a_horizon_no_longer_than_the_warmup_still_schedules():
    """max_steps equal to warmup_steps (a short smoke run): the warmup climbs to the peak, nothing divides by zero."""
    lrs = _lrs(5, 5, 0.1, 8, base=1.0)
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0]) and all(0.1 - 1e-12 <= x <= 1.0 for x in lrs)


def test_resuming_with_a_longer_horizon_continues_on_the_new_curve():
    net = nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    sched = WarmupCosine(opt, 2, 10, 0.0)
    for _ in range(6):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = torch.optim.SGD(net.parameters(), lr=1.0)
    resumed = WarmupCosine(opt2, 2, 20, 0.0)  # max_steps doubled on resume
    opt2.load_state_dict(opt.state_dict())
    with pytest.warns(UserWarning, match="total_steps 10 -> 20"):
        resumed.load_state_dict(state)
    new_curve = lambda s: 0.5 * (1 + math.cos(math.pi * (s - 2) / 18))  # noqa: E731
    for step in range(6, 9):
        assert opt2.param_groups[0]["lr"] == pytest.approx(new_curve(step)), step
        opt2.step()
        resumed.step()


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.pos = nn.Parameter(torch.zeros(6, 4))  # 2-D, but named by no_weight_decay()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 8))
        self.bn = nn.BatchNorm1d(8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(8, 3, bias=False)

    def no_weight_decay(self) -> list[str]:
        return ["pos"]


def test_parameter_groups_decay_exactly_the_trainable_weight_matrices():
    net = _Net()
    decay, no_decay = param_groups(net, 0.1)
    names = {id(p): n for n, p in net.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == ["body.0.weight", "body.2.weight", "head.weight"]
    biases_norms_embeddings = ["body.0.bias", "body.1.bias", "body.1.weight", "body.2.bias", "bn.bias", "bn.weight"]
    assert sorted(names[id(p)] for p in no_decay["params"]) == sorted(biases_norms_embeddings + ["emb.weight", "pos"])
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)


def _classifier(k: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, k))


def test_new_head_loading_keeps_the_fresh_head_and_refuses_any_other_difference():
    torch.manual_seed(0)
    pretrained, fresh = _classifier(10), _classifier(3)
    head_before = fresh[4].weight.clone()
    notes = load_with_new_head(fresh, pretrained.state_dict(), "w.pt")
    assert notes == ["4.weight: (10, 8) in the weights, (3, 8) here", "4.bias: (10,) in the weights, (3,) here"]
    assert torch.equal(fresh[0].weight, pretrained[0].weight) and torch.equal(fresh[2].bias, pretrained[2].bias)
    assert torch.equal(fresh[4].weight, head_before)

    body_differs = _classifier(10)
    body_differs[2] = nn.Linear(6, 9)  # the layer before the head, another width: not a new head
    with pytest.raises(ValueError, match=r"2\.weight: checkpoint \(9, 6\) vs model \(8, 6\)"):
        load_with_new_head(_classifier(3), body_differs.state_dict(), "w.pt", heads=["4"])

    partial = {k: v for k, v in pretrained.state_dict().items() if k != "0.bias"}
    with pytest.raises(ValueError, match=r"0\.bias: missing from checkpoint"):
        load_with_new_head(_classifier(3), partial, "w.pt")
    assert shape_mismatches(_classifier(10), partial) == ["0.bias: missing from checkpoint"]


def test_caption_ids_end_with_end_of_text_within_the_context():
    tok = ByteTokenizer()
    ids = tokenize(tok, ["a long caption that does not fit", "ok"], context_length=8)
    assert ids.shape == (2, 8)
    assert ids[0].tolist() == tok.encode("a long ") + [tok.eos_id]  # cut to T - 1, the end-of-text kept
    assert ids[1].tolist() == tok.encode("ok") + [tok.eos_id] * 6
