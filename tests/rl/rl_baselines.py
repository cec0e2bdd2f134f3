"""What an RL learning test must beat, measured in the run itself: the untrained policy and uniformly random
actions, on the evaluation start states every evaluation of that run plays.

An untrained deterministic policy is a fixed controller, and on CartPole a lucky one balances: PPO's CartPole
config scores 9 untrained at seed 0 but 429 at seed 2 (a run with lr=0). A threshold alone therefore shows
learning only when the run's own start is far below it, which the learning tests assert next to the threshold."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback

from zoo.rl import Evaluator
from zoo.rl.common import require_datamodule


class BaselineReturns(Callback):
    """Before the first update: the mean evaluation return of the untrained policy and of random actions."""

    untrained: float | None = None
    random: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        dm = require_datamodule(pl_module)
        untrained = pl_module.lifecycle.evaluation.validate(pl_module, dm, pl_module.env_steps)
        BaselineReturns.untrained = untrained["val/return"].item()
        envs = dm.make_envs(min(dm.eval_envs, dm.eval_episodes))  # as one process's evaluation (evaluation_share)
        n, g = int(envs.single_action_space.n), torch.Generator().manual_seed(0)  # Discrete actions (CartPole)
        try:
            returns, _ = Evaluator(envs, dm.eval_episodes, seed=dm.eval_seed).run(
                lambda obs: torch.randint(n, (obs.shape[0],), generator=g)
            )
        finally:
            envs.close()
        BaselineReturns.random = returns.mean().item()
