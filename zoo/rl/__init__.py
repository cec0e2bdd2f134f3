"""Actor-critic agents on gymnasium: nets, rollout collection, objectives and the PPO module."""

from zoo.rl.collector import Evaluator, Rollout, RolloutCollector
from zoo.rl.losses import gae, ppo_loss
from zoo.rl.ppo import PPOModule
from zoo.rl.nets import ActorCritic
from zoo.rl.normalization import RunningMeanStd

__all__ = ["ActorCritic", "Evaluator", "PPOModule", "Rollout", "RolloutCollector", "RunningMeanStd", "gae", "ppo_loss"]
