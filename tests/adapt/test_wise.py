"""WiSE-FT's interpolation and choice (zoo.adapt.wise): exact ends, the line between, LoRA through its zero factor,
refusals by name; the sweep through cli.py is in tests/callbacks/test_wiseft.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from zoo.adapt import Adaptation, LoRA, adapt, merge
from zoo.adapt.wise import choose_alpha, interpolate
from zoo.errors import InputError


def states() -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(0)
    start = {
        "w": torch.randn(4, 3, generator=g),
        "h": torch.randn(5, generator=g).bfloat16(),
        "bn.num_batches_tracked": torch.tensor(3),
    }
    tuned = {
        "w": torch.randn(4, 3, generator=g),
        "h": torch.randn(5, generator=g).bfloat16(),
        "bn.num_batches_tracked": torch.tensor(10),
    }
    return start, tuned


def test_the_ends_are_the_start_and_the_fine_tuned_weights_bit_for_bit_and_the_line_between():
    start, tuned = states()
    for alpha, end in ((0.0, start), (1.0, tuned)):
        out = interpolate(start, tuned, alpha)
        for name in ("w", "h"):
            assert torch.equal(out[name], end[name]) and out[name].dtype == end[name].dtype, (alpha, name)
    mid = interpolate(start, tuned, 0.3)
    torch.testing.assert_close(mid["w"], 0.7 * start["w"] + 0.3 * tuned["w"])
    assert all(int(interpolate(start, tuned, a)["bn.num_batches_tracked"]) == 10 for a in (0.0, 0.3))  # a count


def test_tensors_that_do_not_pair_up_are_refused_by_name():
    start, tuned = states()
    with pytest.raises(InputError, match="'extra'"):
        interpolate(start, {**tuned, "extra": torch.zeros(1)}, 0.5)
    with pytest.raises(InputError, match=r"w \(4, 3\) -> \(3, 4\)"):
        interpolate(start, {**tuned, "w": torch.zeros(3, 4)}, 0.5)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(7, 6), nn.Linear(6, 5)


def merged_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in merge(copy.deepcopy(module)).state_dict().items()}


def trained(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("rslora", [False, True])
def test_lora_moves_its_zero_factor_so_the_merged_weights_lie_on_the_line(rslora):
    pytest.importorskip("peft")
    torch.manual_seed(0)
    module = Small()
    adapt(module, Adaptation(lora=LoRA(r=2, alpha=4.0, rslora=rslora, targets=("emb", "fc"))))
    start, merged0 = trained(module), merged_weights(module)
    with torch.no_grad():  # a fine-tune: every adapter factor moves
        for p in module.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    tuned, merged1 = trained(module), merged_weights(module)
    for alpha in (0.0, 0.3, 1.0):
        point = copy.deepcopy(module)
        with torch.no_grad():
            for n, t in interpolate(start, tuned, alpha).items():
                point.get_parameter(n).copy_(t)
        for k, w in merged_weights(point).items():
            torch.testing.assert_close(w, torch.lerp(merged0[k], merged1[k], alpha), msg=f"{k} at {alpha}")


def test_an_adapter_no_factor_of_which_starts_at_zero_and_dora_are_refused():
    pytest.importorskip("peft")
    module = Small()
    adapt(module, Adaptation(lora=LoRA(r=2, targets=("fc",))))
    start = trained(module)
    start["fc.lora_B.default.weight"] = torch.ones_like(start["fc.lora_B.default.weight"])
    with pytest.raises(InputError, match="fc.lora_B.default.weight"):
        interpolate(start, start, 0.5)
    dora = Small()
    adapt(dora, Adaptation(lora=LoRA(r=2, targets=("fc",), dora=True)))
    with pytest.raises(InputError, match="DoRA"):
        interpolate(trained(dora), trained(dora), 0.5)


def test_the_choice_keeps_the_source_then_takes_the_best_target():
    alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
    target, source = [0.2, 0.5, 0.7, 0.8, 0.81], [0.6, 0.59, 0.55, 0.5, 0.3]
    assert choose_alpha(alphas, target, source, "target", keep_source=0.9) == 2  # 0.55 >= 0.54, 0.5 is not
    assert choose_alpha(alphas, target, source, "target", keep_source=0.8) == 3
    assert choose_alpha(alphas, target, None) == 4  # no source: the best target
    assert choose_alpha(alphas, target, source, "mean") == 3  # (0.8 + 0.5) / 2 is the best mean
    assert choose_alpha(alphas, [0.5, 0.5, 0.4, 0.4, 0.5], None) == 0  # ties: the point nearest the start
    losses, source_losses = [3.0, 2.0, 1.5, 1.2, 1.1], [1.0, 1.05, 1.1, 1.3, 2.0]
    assert choose_alpha(alphas, losses, source_losses, "target", 0.9, mode="min") == 2  # 1.1 <= 1.0 / 0.9
