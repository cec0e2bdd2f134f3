"""Actor-critic agents on gymnasium: nets, rollout collection, objectives and the agent modules."""

from zoo.rl.a2c import A2CModule
from zoo.rl.collector import Evaluator, Rollout, RolloutCollector
from zoo.rl.impala import IMPALAModule
from zoo.rl.losses import a2c_loss, gae, ppo_loss
from zoo.rl.nets import ActorCritic
from zoo.rl.normalization import RunningMeanStd
from zoo.rl.ppo import PPOModule
from zoo.rl.pretrained import from_pretrained
from zoo.rl.q_nets import DeterministicActorCritic, SoftActorCritic
from zoo.rl.replay import ReplayBuffer, TransitionCollector
from zoo.rl.sac import SACModule
from zoo.rl.td3 import TD3Module
from zoo.rl.vtrace import impala_loss, vtrace

__all__ = [
    "A2CModule",
    "ActorCritic",
    "DeterministicActorCritic",
    "Evaluator",
    "IMPALAModule",
    "PPOModule",
    "ReplayBuffer",
    "Rollout",
    "RolloutCollector",
    "RunningMeanStd",
    "SACModule",
    "SoftActorCritic",
    "TD3Module",
    "TransitionCollector",
    "a2c_loss",
    "from_pretrained",
    "gae",
    "impala_loss",
    "ppo_loss",
    "vtrace",
]
