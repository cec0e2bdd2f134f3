"""GRPO's loss (zoo.gpt.tune.losses.GRPOLoss) equals TRL's ``GRPOTrainer._compute_loss`` on fixed tensors.

TRL's method is called unbound on a stand-in trainer holding only the settings it reads, with the model's per-token
log-probabilities stubbed, so nothing is sampled or trained: the loss, its gradient and the logged clip ratios and
KL are TRL's own arithmetic on our tensors. Slow: importing TRL's trainer costs seconds; the same formulas are
checked by hand in the default suite (tests/shared/test_policy_gradient.py).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from zoo.gpt.tune.losses import GRPOLoss

pytestmark = pytest.mark.slow  # TRL is imported inside the tests, so that collecting this file costs nothing

R, T, G = 6, 5, 3  # rows, completion tokens, group size
MAX_LEN = 7  # TRL's max_completion_length (Dr. GRPO's divisor), above T as when no completion reached it


def fixed_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(R, T, dtype=torch.long)
    for r, n in enumerate([5, 2, 4, 1, 3, 5]):
        mask[r, n:] = 0
    return {
        "logp": -torch.rand(R, T, generator=g, dtype=torch.float64) * 2,
        "old": -torch.rand(R, T, generator=g, dtype=torch.float64) * 2,  # ratios both sides of any clip range
        "ref": -torch.rand(R, T, generator=g, dtype=torch.float64) * 2,
        "rewards": torch.tensor([1.0, 0.0, 0.0, 0.5, 2.0, 1.0], dtype=torch.float64),
        "mask": mask,
    }


def trl_loss(x: dict, advantages: torch.Tensor, loss_type: str, eps: tuple[float, float], beta: float, is_ratio=None):
    """TRL's loss and metrics for per-token log-probabilities ``x["logp"]`` (a leaf, whose gradient it leaves);
    ``is_ratio``: its vLLM importance-sampling ratio (B, T), applied as with ``vllm_importance_sampling_correction``."""
    accelerator = SimpleNamespace(num_processes=1, reduce=lambda t, reduction: t, gather=lambda t: t)
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (x["logp"], torch.zeros_like(x["logp"]), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=eps[0],
        epsilon_high=eps[1],
        use_vllm=is_ratio is not None,
        vllm_importance_sampling_correction=is_ratio is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_LEN,
        accelerator=accelerator,
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    inputs = {
        "prompt_ids": torch.zeros(R, 2, dtype=torch.long),
        "prompt_mask": torch.ones(R, 2, dtype=torch.long),
        "completion_ids": torch.zeros(R, T, dtype=torch.long),
        "completion_mask": x["mask"],
        "advantages": advantages,
        "old_per_token_logps": x["old"],
        "ref_per_token_logps": x["ref"],
        "num_items_in_batch": x["mask"].sum(),
        "importance_sampling_ratio": is_ratio,
    }
    trainer = pytest.importorskip("trl.trainer.grpo_trainer").GRPOTrainer
    loss = trainer._compute_loss(stub, None, inputs)
    return loss, stub._metrics["train"]


@pytest.mark.parametrize(
    "loss_type, eps, beta, scale_std",
    [("grpo", (0.2, 0.2), 0.0, True), ("dr_grpo", (0.2, 0.2), 0.04, False), ("dapo", (0.2, 0.28), 0.0, True)],
)
def test_the_loss_its_gradient_and_metrics_equal_trl(loss_type, eps, beta, scale_std):
    nanstd = pytest.importorskip("trl.trainer.utils").nanstd
    x = fixed_tensors()
    r = x["rewards"].view(-1, G)
    centred = (r - r.mean(1, keepdim=True)).flatten()  # TRL's advantages (_generate_and_score_completions)
    trl_adv = centred / (nanstd(r, dim=1).repeat_interleave(G) + 1e-4) if scale_std else centred

    theirs_logp = x["logp"].clone().requires_grad_()
    theirs, metrics = trl_loss({**x, "logp": theirs_logp}, trl_adv, loss_type, eps, beta)
    theirs.backward()
    ours_logp = x["logp"].clone().requires_grad_()
    loss = GRPOLoss(loss_type, *eps, scale_std, beta)
    advantages = loss.advantages(x["rewards"], G)
    ours = loss.objective(ours_logp, x["old"], advantages, x["mask"], x["ref"], max_completion_length=MAX_LEN)
    ours["loss"].backward()

    torch.testing.assert_close(advantages, trl_adv)
    torch.testing.assert_close(ours["loss"], theirs)
    torch.testing.assert_close(ours_logp.grad, theirs_logp.grad)
    for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "kl"):
        if name in metrics:
            assert float(ours[name]) == pytest.approx(metrics[name][0], abs=1e-6), name
    assert ("kl" in ours) == ("kl" in metrics) == (beta > 0)
    assert 0 < metrics["clip_ratio/region_mean"][0] < 1  # the ratios do cross the clip range here


def trl_token_truncate(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, clip_max: float) -> torch.Tensor:
    """TRL's ``vllm_importance_sampling_mode="token_truncate"`` ratio, as ``_generate_and_score_completions`` computes
    it inline (TRL 1.x), with no ``vllm_importance_sampling_clip_min``."""
    per_token_logps_diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    return torch.clamp(torch.exp(per_token_logps_diff), min=None, max=clip_max)


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.0), ("dapo", 0.04)])
def test_the_truncated_importance_weight_and_its_loss_equal_trls_token_truncate(loss_type, beta):
    x = fixed_tensors()
    g = torch.Generator().manual_seed(1)
    behaviour = x["old"] - torch.randn(R, T, generator=g, dtype=torch.float64)  # ratios both sides of the bound
    theirs_w = trl_token_truncate(x["old"], behaviour, x["mask"], 2.0)
    loss = GRPOLoss(loss_type, beta=beta, rho_bar=2.0)
    ours_w, truncated = loss.importance_weights(x["old"], behaviour, x["mask"])
    torch.testing.assert_close(ours_w, theirs_w)
    on = x["mask"].bool()
    assert truncated[on].any() and (ours_w[on] < 1).any() and (ours_w[~on] == 1).all()

    r = x["rewards"].view(-1, G)
    trl_adv = (r - r.mean(1, keepdim=True)).flatten() / (r.std(1).repeat_interleave(G) + 1e-4)
    theirs_logp = x["logp"].clone().requires_grad_()
    theirs, _ = trl_loss({**x, "logp": theirs_logp}, trl_adv, loss_type, (0.2, 0.2), beta, theirs_w)
    theirs.backward()
    ours_logp = x["logp"].clone().requires_grad_()
    ours = loss.objective(ours_logp, x["old"], loss.advantages(x["rewards"], G), x["mask"], x["ref"], ours_w, MAX_LEN)
    ours["loss"].backward()
    torch.testing.assert_close(ours["loss"], theirs)
    torch.testing.assert_close(ours_logp.grad, theirs_logp.grad)
