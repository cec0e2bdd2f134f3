"""Behaviour that only shows through use: SAC's target critics move by Polyak steps exactly when and by how
much they should, and the running normalisers take what they should when they should (not at evaluation).

The SAC checks watch a real fit through ``cli.py``: a post-step hook on the critic's optimizer records the
critic after every update, and the target critics are recomputed from those records by
theta' <- theta' + tau (theta - theta') at every ``target_update_interval``-th update (CleanRL, SB3).
The reward normaliser is compared with OpenAI Baselines' ``VecNormalize`` return filter on a scripted
env: ret <- gamma ret + r, reset at episode ends, its running variance over the steps the agent took.
"""

from __future__ import annotations

import torch
from conftest import CONFIGS, cli
from lightning.pytorch import Callback
from test_rl import ValueIsTenTimesObs, terminating_and_truncating_envs
from torch.nn.utils import parameters_to_vector

from zoo.rl import RolloutCollector, RunningMeanStd

TINY = str(CONFIGS / "rl" / "sac_tiny.yaml")
TAU, INTERVAL = 0.3, 3


def vec(module) -> torch.Tensor:
    return parameters_to_vector(module.parameters()).detach().clone()


class PolyakWitness(Callback):
    """Recomputes the target critics from the critics after each update; records what the normaliser saw."""

    checks: list = []

    def on_train_start(self, trainer, pl_module) -> None:
        PolyakWitness.checks, self.critics = [], []
        critic_opt = trainer.optimizers[1]
        assert critic_opt.param_groups[0]["params"][0] is next(pl_module.net.critic.parameters())
        critic_opt.register_step_post_hook(lambda *_: self.critics.append(vec(pl_module.net.critic)))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.critics.clear()
        self.start = (vec(pl_module.critic_target), int(pl_module.updates), pl_module.obs_rms.count.item())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        target, first, count = self.start
        polyak_steps = 0
        for k, critic in enumerate(self.critics, start=first + 1):  # k: the update's number since the start
            if k % INTERVAL == 0:
                target = target + TAU * (critic - target)
                polyak_steps += 1
        PolyakWitness.checks.append(
            {
                "updates": int(pl_module.updates) - first,
                "recorded": len(self.critics),
                "polyak": polyak_steps,
                "target": vec(pl_module.critic_target),
                "want": target,
                "rows": pl_module.obs_rms.count.item() - count,
            }
        )

    def on_validation_start(self, trainer, pl_module) -> None:
        self.before_eval = (pl_module.obs_rms.state_dict(), vec(pl_module.critic_target))

    def on_validation_end(self, trainer, pl_module) -> None:
        stats, target = self.before_eval
        for k, v in pl_module.obs_rms.state_dict().items():  # evaluation normalises but never updates
            assert torch.equal(v, stats[k]), k
        assert torch.equal(vec(pl_module.critic_target), target)


class ExploreWitness(Callback):
    """How many actions each training step asked of the policy (``_explore``): none is asked before
    ``learning_starts``, where the actions are uniform over the Box (SB3's rule)."""

    asked: list[int] = []

    def on_train_start(self, trainer, pl_module) -> None:
        ExploreWitness.asked, explore = [0], pl_module._explore

        def counted(obs):
            ExploreWitness.asked[-1] += 1
            return explore(obs)

        pl_module._explore = counted

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ExploreWitness.asked.append(0)


def test_sac_target_critics_take_a_polyak_step_every_interval_and_normaliser_rows_per_batch():
    cli(
        "fit",
        "--config",
        TINY,
        f"--model.init_args.tau={TAU}",
        f"--model.init_args.target_update_interval={INTERVAL}",
        "--trainer.callbacks+=test_rl_behaviour.PolyakWitness",
        "--trainer.callbacks+=test_rl_behaviour.ExploreWitness",
        "--trainer.logger=false",
    )
    # the policy acts from the first vector step at or past learning_starts (160 env steps, 2 envs: step 80 on)
    assert ExploreWitness.asked[:-1] == [0, 0] + [40] * 8
    checks = PolyakWitness.checks
    assert len(checks) == 10
    assert [c["updates"] for c in checks] == [0, 0] + [40] * 8  # none before learning_starts (160 env steps)
    assert [c["recorded"] for c in checks] == [c["updates"] for c in checks]  # one critic step per update
    assert sum(c["updates"] for c in checks) == 320 and sum(c["polyak"] for c in checks) == 320 // INTERVAL
    for i, c in enumerate(checks):
        torch.testing.assert_close(c["target"], c["want"], msg=f"training step {i}")
        assert round(c["rows"], 6) == 40 * 2  # steps_per_batch x num_envs observations, once per training step
    assert not torch.equal(checks[-1]["target"], checks[1]["target"])


def baselines_returns(rewards, ended, valid, gamma):
    """VecNormalize's return filter, step by step per env (the zoo's is vectorised over envs)."""
    out, ret = [], [0.0] * rewards.shape[1]
    for t in range(rewards.shape[0]):
        for e in range(rewards.shape[1]):
            ret[e] = ret[e] * gamma + float(rewards[t, e])
            if valid[t, e]:
                out.append(ret[e])
            if ended[t, e]:
                ret[e] = 0.0
    return torch.tensor(out, dtype=torch.float64)


def test_reward_and_observation_normalisers_follow_baselines_across_rollouts():
    obs_rms, ret_rms = RunningMeanStd((1,), epsilon=1e-8), RunningMeanStd((), epsilon=1e-8)
    collector = RolloutCollector(
        terminating_and_truncating_envs(), 5, obs_norm=obs_rms, reward_norm=ret_rms, gamma=0.9, seed=0
    )
    raws, rewards, ended, valid = [], [], [], []
    for _ in range(2):  # the running return carries over the rollout boundary
        r = collector.collect(ValueIsTenTimesObs())
        raws.append(collector.raw_obs.clone())
        valid.append(r.valid.clone())
        rewards.append(r.valid.double())  # the Counter envs pay 1 per step, 0 on autoreset steps
        ended.append((r.terminated | r.truncated).clone())
    returns = baselines_returns(torch.cat(rewards), torch.cat(ended), torch.cat(valid), 0.9)
    assert len(returns) == 16 and returns.max() > 3.4  # 1, 1.9, 2.71, 3.439 on the 4-step episodes
    assert ret_rms.count.item() == returns.numel() + 1e-8
    torch.testing.assert_close(ret_rms.mean, returns.mean())
    torch.testing.assert_close(ret_rms.var, returns.var(unbiased=False))
    seen = torch.cat(raws).flatten(0, 1).double()  # every observation acted on, (2 x 5 x 2, 1)
    assert obs_rms.count.item() == seen.shape[0] + 1e-8
    torch.testing.assert_close(obs_rms.mean, seen.mean(0))
    torch.testing.assert_close(obs_rms.var, seen.var(0, unbiased=False))
