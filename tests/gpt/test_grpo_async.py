"""GRPO's asynchronous rollouts: the actor pool's round trip, and the truncated importance weight that corrects
the actors' stale weights (zoo.gpt.tune.async_rollout, GRPOModule.importance_weights)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from test_grpo import _module, _prompts, _trainer

from zoo.gpt.tune.async_rollout import Behaviour
from zoo.gpt.tune.losses import GRPOLoss
from zoo.gpt.tune.rollout import per_token_logps, sample_groups
from zoo.train.actor_pool import ActorError
from zoo.train.policy_gradient import truncated_importance_weights

PROMPTS = ["ab", "c", "dd", "xyz"]


def _ids(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.long)


def _nudged(module, scale: float = 0.3, seed: int = 1) -> None:
    """Moves the module's weights, as learner updates would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def test_the_weight_is_min_rho_bar_of_pi_old_over_mu_and_1_on_padding():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -4.0, 0.0, 0.0]])
    mu = torch.tensor([[-2.0, -1.0, -0.5, -0.1], [-0.1, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    w, truncated = truncated_importance_weights(old, mu, mask, rho_bar=2.0)
    e = torch.e
    torch.testing.assert_close(w, torch.tensor([[2.0, e**-1, 1.0, 1.0], [e**-0.1, e**-3, 1.0, 1.0]]))
    assert truncated.tolist() == [[True, False, False, False], [False, False, False, False]]  # e^1 > 2; e^2.9 masked


def test_the_weight_multiplies_each_tokens_clipped_term_and_not_the_kl():
    g = torch.Generator().manual_seed(0)
    logp, old, ref = (-torch.rand(4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    rewards, mask = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=torch.float64), torch.ones(4, 3, dtype=torch.long)
    w = torch.rand(4, 3, generator=g, dtype=torch.float64) * 2
    loss = GRPOLoss("dapo", beta=0.1)
    advantages = loss.advantages(rewards, 2)
    ours = loss.objective(logp, old, advantages, mask, ref, is_weight=w)["loss"]
    adv = advantages[:, None]
    ratio = (logp - old).exp()
    clipped = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    kl = (ref - logp).exp() - (ref - logp) - 1
    torch.testing.assert_close(ours, (clipped * w + 0.1 * kl).mean())


def _behaviour(module, sampler, version: int) -> Behaviour:
    torch.manual_seed(0)
    rollout = sample_groups(sampler.net.eval(), [_ids(p) for p in PROMPTS[:2]], 4, 6)
    return Behaviour(rollout, torch.tensor([0, 1]), version)


def test_no_lag_weighs_every_token_1_exactly_and_keeps_the_sampling_pass():
    module = _module()
    behaviour = _behaviour(module, module, version=3)
    rollout, w, lag = module.importance_weights(behaviour, version=3)
    assert torch.equal(rollout.logps, behaviour.rollout.logps) and torch.equal(w, torch.ones_like(w))
    assert float(lag["staleness"]) == 0 and float(lag["importance_weight/mean"]) == 1
    assert float(lag["importance_weight/truncated"]) == 0
    advantages, rows = module.loss.advantages(torch.arange(8.0), 8), slice(0, 8)
    torch.manual_seed(0)
    weighted = module.policy_loss(rollout, advantages, rows, None, w)["loss"]
    torch.manual_seed(0)
    assert torch.equal(weighted, module.policy_loss(rollout, advantages, rows, None)["loss"])  # the synchronous loss


def test_a_stale_rollout_is_corrected_towards_the_learners_weights():
    actor, module = _module(loss=GRPOLoss(rho_bar=1.5)), _module(loss=GRPOLoss(rho_bar=1.5))
    _nudged(module)  # the learner has moved on since the actor's copy
    behaviour = _behaviour(module, actor, version=1)
    rollout, w, lag = module.importance_weights(behaviour, version=4)
    r, mask = behaviour.rollout, behaviour.rollout.completion_mask
    with torch.no_grad():
        old = per_token_logps(module.net, r.ids, mask, 1.0, r.pad)
    torch.testing.assert_close(rollout.logps, old)  # the clipped surrogate's old policy: the learner's now
    ratio = ((old - r.logps) * mask).exp()
    torch.testing.assert_close(w, ratio.clamp(max=1.5))
    on = mask.bool()
    assert (w[on] < 1).any() and (w[on] == 1.5).any() and (w[~on] == 1).all()
    assert float(lag["staleness"]) == 3
    assert float(lag["importance_weight/truncated"]) == pytest.approx(float((ratio[on] > 1.5).float().mean()))
    assert float(lag["importance_weight/mean"]) == pytest.approx(float(w[on].mean()))


def test_a_rollout_one_update_stale_is_corrected_not_taken_as_on_policy():
    actor, module = _module(), _module()
    _nudged(module)  # one update since the actor's copy
    behaviour = _behaviour(module, actor, version=3)
    rollout, w, lag = module.importance_weights(behaviour, version=4)
    r = behaviour.rollout
    with torch.no_grad():
        old = per_token_logps(module.net, r.ids, r.completion_mask, 1.0, r.pad)
    torch.testing.assert_close(rollout.logps, old)  # pi_old: the learner's weights, not the actor's sampling pass
    assert float(lag["staleness"]) == 1 and not torch.equal(w, torch.ones_like(w))


def test_a_stale_rollouts_old_policy_is_computed_without_dropout_and_the_nets_mode_kept():
    actor, module = _module(), _module()
    module.net.apply(lambda m: setattr(m, "p", 0.5) if isinstance(m, torch.nn.Dropout) else None)
    _nudged(module)
    r = _behaviour(module, actor, version=0).rollout
    module.net.train()  # as in a training step
    firsts = [module.importance_weights(Behaviour(r, torch.tensor([0, 1]), 0), version=1)[0].logps for _ in "ab"]
    assert module.net.training and all(m.training for m in module.net.modules())
    with torch.no_grad():
        old = per_token_logps(module.net.eval(), r.ids, r.completion_mask, 1.0, r.pad)
    for logps in firsts:  # the same both times: no dropout mask drawn
        torch.testing.assert_close(logps, old)


def _take_version(module, version: int, tries: int = 20) -> Behaviour:
    for _ in range(tries):
        b = module.actors.take()
        if b.version == version:
            return b
    raise AssertionError(f"no rollout of version {version} in {tries} slots")


def test_the_actors_sample_with_the_published_weights_and_a_dead_actor_raises():
    module = _module(async_actors=1, max_new_tokens=5, group_size=4)
    module.net.eval()
    module.start_actors([_ids(p) for p in PROMPTS], [p.upper() for p in PROMPTS], 2, seed=0)
    pid = module.actors.processes[0].pid
    try:
        for version in (0, 1):
            b = _take_version(module, version)
            r, drawn = b.rollout, [PROMPTS[i] for i in b.prompt_index.tolist()]
            longest = max(map(len, drawn))
            assert r.ids.shape == (8, longest + 5) and len(drawn) == 2  # the padding all rows share is cut
            for row in range(8):  # row r answers prompt r // G, left-padded
                assert r.ids[row, int(r.pad[row]) : longest].tolist() == list(drawn[row // 4].encode())
            with torch.no_grad():
                torch.testing.assert_close(
                    r.logps, per_token_logps(module.net, r.ids, r.completion_mask, 1.0, r.pad), atol=1e-5, rtol=1e-4
                )
            _nudged(module)
            assert module.actors.publish(module.net) == version + 1
        # The learner's view: the answers of the prompts the actor drew, for the rewards to score against.
        rollout, _, answers, lag = module.behaviour_rollout(2)
        for row in range(8):
            prompt = bytes(rollout.ids[row, int(rollout.pad[row]) : -5].tolist()).decode()
            assert answers[row // 4] == prompt.upper()
        assert 0 <= float(lag["staleness"]) <= 2
        os.kill(pid, signal.SIGKILL)
        module.actors.processes[0].join()
        with pytest.raises(ActorError, match=r"GRPO rollout actor 0 .* exited with code -9"):
            module.actors.take()
    finally:
        module.stop_actors()
    time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow  # a second pool and a fit: ~15 s
def test_an_async_fit_publishes_each_step_and_logs_the_lag(tmp_path):
    module = _module(lr=3e-2, async_actors=1)
    lags = []

    from lightning.pytorch import Callback

    class Record(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            lags.append(float(trainer.callback_metrics["train/staleness"]))
            assert int(pl_module.actors.version) == trainer.global_step  # one version per update

    trainer = _trainer(tmp_path, 6, callbacks=[Record()])
    trainer.fit(module, _prompts(tmp_path))
    assert module.actors is None  # stopped at the end of fit
    assert 0 < max(lags) <= 3  # published every step: the actors stay within the slots' lead
    metrics = trainer.callback_metrics
    assert {"train/importance_weight/mean", "train/importance_weight/truncated"} <= set(metrics)
