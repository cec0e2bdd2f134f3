"""Actor-critic agents on gymnasium: nets, rollout collection, objectives and the agent modules."""

from zoo.rl.a2c import A2CModule
from zoo.rl.collector import Evaluator, Rollout, RolloutCollector
from zoo.rl.losses import a2c_loss, gae, ppo_loss
from zoo.rl.ppo import PPOModule
from zoo.rl.nets import ActorCritic
from zoo.rl.normalization import RunningMeanStd
from zoo.rl.replay import ReplayBuffer, TransitionCollector
from zoo.rl.sac import SACModule
from zoo.rl.sac_nets import SoftActorCritic

__all__ = ["A2CModule", "ActorCritic", "Evaluator", "PPOModule", "Rollout", "RolloutCollector", "RunningMeanStd", "a2c_loss", "gae", "ppo_loss"]
__all__ += ["ReplayBuffer", "SACModule", "SoftActorCritic", "TransitionCollector"]
