"""Post-training a GPT: DPO on preference pairs, GRPO on sampled completions or multi-turn episodes with a text
environment (synchronous or on the actor pool), the rewards that score them, and the frozen reference both measure
against."""

from zoo.gpt.tune.dpo import DPOModule
from zoo.gpt.tune.grpo import GRPOModule

__all__ = ["DPOModule", "GRPOModule"]
