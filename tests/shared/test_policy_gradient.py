"""The shared clipped surrogate and group advantages (zoo.train.policy_gradient): PPO as a special case, the token
aggregations by hand, clipping, masks and the KL term. TRL's own loss on the same tensors: tests/gpt/test_grpo_trl.py.
"""

from __future__ import annotations

import pytest
import torch

from zoo.gpt.tune.losses import GRPOLoss
from zoo.rl.losses import normalize, ppo_loss
from zoo.train.policy_gradient import clipped_surrogate, group_advantages


def batch(rows: int = 4, t: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, t, dtype=torch.long)
    for r, n in enumerate(torch.randint(1, t + 1, (rows,), generator=g).tolist()):
        mask[r, n:] = 0  # completions of different lengths, padded after
    return {
        "logp_new": -torch.rand(rows, t, generator=g, dtype=torch.float64) * 3,
        "logp_old": -torch.rand(rows, t, generator=g, dtype=torch.float64) * 3,
        "mask": mask,
    }


def test_groups_of_one_with_a_value_baseline_are_ppo():
    g = torch.Generator().manual_seed(1)
    logp, old = -torch.rand(8, generator=g) * 2, -torch.rand(8, generator=g) * 2
    rewards, value = torch.randn(8, generator=g), torch.randn(8, generator=g)
    ppo = ppo_loss(logp, old, rewards - value, value, value, rewards, torch.zeros(8), clip_coef=0.2)
    for loss_type in ("grpo", "dr_grpo", "dapo"):  # one token per sequence: every aggregation is the mean
        lm = GRPOLoss(loss_type).objective(logp[:, None], old[:, None], rewards - value, torch.ones(8, 1))
        torch.testing.assert_close(lm["loss"], ppo["pg_loss"], rtol=0, atol=1e-7)
        torch.testing.assert_close(lm["clipfrac"], ppo["clipfrac"])
        torch.testing.assert_close(lm["approx_kl"], ppo["approx_kl"])


def test_group_advantages_are_centred_and_scaled_per_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0, 2.0, 4.0, 6.0, 8.0])
    adv = group_advantages(rewards, 4)
    for grp, r in zip(adv.view(3, 4), rewards.view(3, 4)):
        torch.testing.assert_close(grp, (r - r.mean()) / (r.std() + 1e-4))
    assert torch.equal(adv[4:8], torch.zeros(4))  # a group that all scored the same learns nothing
    dr = group_advantages(rewards, 4, scale_std=False)  # Dr. GRPO: centred only
    torch.testing.assert_close(dr[8:], torch.tensor([-3.0, -1.0, 1.0, 3.0]))
    assert torch.equal(group_advantages(rewards, 1), torch.zeros(12))  # a group of one: std 0, advantage 0
    torch.testing.assert_close(normalize(rewards), (rewards - rewards.mean()) / (rewards.std() + 1e-8))


def naive(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    rows = [per_token[r, : int(mask[r].sum())] for r in range(len(mask))]
    if loss_type == "grpo":
        return torch.stack([row.mean() for row in rows]).mean()
    total = sum(row.sum() for row in rows)
    return total / (len(rows) * mask.shape[1]) if loss_type == "dr_grpo" else total / mask.sum()


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_each_aggregation_equals_a_loop_over_the_completions_only(loss_type):
    b = batch()
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    out = clipped_surrogate(b["logp_new"], b["logp_old"], adv, 0.2, 0.28, b["mask"], loss_type)
    ratio = (b["logp_new"] - b["logp_old"]).exp()
    a = adv[:, None]
    per_token = -torch.min(ratio * a, ratio.clamp(0.8, 1.28) * a)
    torch.testing.assert_close(out["loss"], naive(per_token, b["mask"], loss_type))
    # what lies past a completion's end (padding) changes nothing
    junk = {k: v.masked_fill(b["mask"] == 0, 7.0) for k, v in b.items() if k != "mask"}
    again = clipped_surrogate(junk["logp_new"], junk["logp_old"], adv, 0.2, 0.28, b["mask"], loss_type)
    torch.testing.assert_close(again["loss"], out["loss"])


def test_the_clip_range_stops_the_gradient_of_tokens_outside_it_in_the_direction_of_the_advantage():
    logp_old = torch.zeros(1, 4, dtype=torch.float64)
    logp_new = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.9]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0], dtype=torch.float64)  # positive: only the upper bound 1 + clip_high binds
    out = clipped_surrogate(logp_new, logp_old, adv, 0.2, 0.3, torch.ones(1, 4), "dapo")
    out["loss"].backward()
    assert logp_new.grad[0, 0] == 0 and (logp_new.grad[0, 1:] != 0).all()  # 1.5 > 1.3 clipped; 1.1 < 1.3 not
    assert float(out["clip_ratio/high_mean"]) == 0.25 and float(out["clip_ratio/region_mean"]) == 0.25
    assert out["clip_ratio/low_mean"] == 0  # 0.5 < 0.8, but a positive advantage is not clipped below
    assert float(out["clipfrac"]) == 0.5  # PPO's count: outside the range, whatever the advantage


def test_the_kl_penalty_is_k3_to_the_reference_and_off_at_beta_zero():
    b = batch()
    ref = b["logp_old"] - 0.3
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    base = clipped_surrogate(b["logp_new"], b["logp_old"], adv, 0.2, 0.2, b["mask"], "dapo", ref_logp=ref)
    assert "kl" not in base
    out = clipped_surrogate(b["logp_new"], b["logp_old"], adv, 0.2, 0.2, b["mask"], "dapo", ref_logp=ref, beta=0.1)
    d = ref - b["logp_new"]
    kl = ((d.exp() - d - 1) * b["mask"]).sum() / b["mask"].sum()
    assert kl > 0
    torch.testing.assert_close(out["kl"], kl)
    torch.testing.assert_close(out["loss"], base["loss"] + 0.1 * kl)
