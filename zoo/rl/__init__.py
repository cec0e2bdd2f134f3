"""Actor-critic agents on gymnasium: nets, rollout collection, objectives and the agent modules."""

from zoo.rl.a2c import A2CModule
from zoo.rl.collector import Evaluator, Rollout, RolloutCollector
from zoo.rl.losses import a2c_loss, gae, ppo_loss
from zoo.rl.ppo import PPOModule
from zoo.rl.nets import ActorCritic
from zoo.rl.normalization import RunningMeanStd

__all__ = ["A2CModule", "ActorCritic", "Evaluator", "PPOModule", "Rollout", "RolloutCollector", "RunningMeanStd", "a2c_loss", "gae", "ppo_loss"]
