"""Actor-critic nets for on-policy agents (PPO, A2C): an actor MLP and a critic MLP side by side.

The layout and method names follow CleanRL's ``Agent`` (``ppo.py``, ``ppo_continuous_action.py``):
separate actor and critic trunks, orthogonal initialisation with gain sqrt(2) on hidden layers, 0.01 on
the policy head and 1 on the value head, and a state-independent log-std for Gaussian actions
(Schulman et al. 2017, PPO; the choices studied in Engstrom et al. 2020, "Implementation Matters in Deep
Policy Gradients", and Andrychowicz et al. 2021, "What Matters in On-Policy RL").

The action distributions are written out as tensor ops rather than ``torch.distributions`` objects: building
a ``Categorical`` and calling ``sample``/``log_prob``/``entropy`` costs about twice the whole MLP forward at
the batch sizes of a vector env (8 rows), and the collector calls it once per environment step.

Notation: B batch (envs or minibatch rows), O observation features, A actions (the number of discrete
actions, or the dimensions of a continuous action).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights scaled by ``std``, constant bias (Saxe et al. 2014; CleanRL's ``layer_init``)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, out_std: float, activation: str) -> nn.Sequential:
    """Linear-activation stack ending in a linear head initialised with gain ``out_std``."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), _ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


def categorical(logits: Tensor, action: Tensor | None, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Sample (or score) a categorical action: action (B,) int64, log-probability (B,), entropy (B,)."""
    logp = logits.log_softmax(-1)  # (B, A)
    probs = logp.exp()
    if action is None:
        action = logp.argmax(-1) if deterministic else torch.multinomial(probs, 1).squeeze(-1)
    entropy = -(probs * logp).sum(-1)
    return action, logp.gather(-1, action.unsqueeze(-1)).squeeze(-1), entropy


def diag_gaussian(
    mean: Tensor, log_std: Tensor, action: Tensor | None, deterministic: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample (or score) a diagonal Gaussian action: action (B, A), log-probability (B,), entropy (B,)."""
    log_std = log_std.expand_as(mean)  # (B, A)
    std = log_std.exp()
    if action is None:
        action = mean if deterministic else mean + std * torch.randn_like(mean)
    logp = (-0.5 * ((action - mean) / std).square() - log_std - _LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)
    return action, logp, entropy


class ActorCritic(nn.Module):
    """Policy pi(a|s) and value V(s) for discrete (categorical) or continuous (Gaussian) actions."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        continuous: bool = False,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: Literal["tanh", "relu"] = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        """
        Args:
            obs_dim: observation features O (the flattened observation space).
            action_dim: number of discrete actions, or the dimensions of a continuous (Box) action.
            continuous: Gaussian actions with a learned state-independent log-std instead of categorical ones.
            hidden_sizes: widths of the hidden layers of both the actor and the critic.
            activation: hidden nonlinearity; tanh is the default of PPO's MuJoCo and classic-control results.
            log_std_init: initial log standard deviation of Gaussian actions (0 gives std 1).
        """
        super().__init__()
        self.obs_dim, self.action_dim, self.continuous = obs_dim, action_dim, continuous
        self.critic = mlp(obs_dim, hidden_sizes, 1, out_std=1.0, activation=activation)
        # A small policy head starts every action (nearly) equally likely / centred at 0 (Andrychowicz et al. 2021).
        self.actor = mlp(obs_dim, hidden_sizes, action_dim, out_std=0.01, activation=activation)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.full((1, action_dim), float(log_std_init)))

    def no_weight_decay(self) -> tuple[str, ...]:
        """The log-std is 2-D but no weight: decaying it would pull every policy towards std 1."""
        return ("actor_logstd",)

    def get_value(self, x: Tensor) -> Tensor:
        """V(s) for observations (B, O): (B,)."""
        return self.critic(x).squeeze(-1)

    def get_action_and_value(
        self, x: Tensor, action: Tensor | None = None, deterministic: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Sample an action (or score ``action``): (action, log pi(a|s) (B,), entropy (B,), V(s) (B,)).

        ``deterministic`` takes the most likely action (argmax or mean) instead of sampling.
        """
        out = self.actor(x)  # (B, A): logits or Gaussian means
        if self.continuous:
            action, logp, entropy = diag_gaussian(out, self.actor_logstd, action, deterministic)
        else:
            action, logp, entropy = categorical(out, action, deterministic)
        return action, logp, entropy, self.get_value(x)

    @torch.no_grad()
    def act(self, x: Tensor, deterministic: bool = True) -> Tensor:
        """Actions for observations (B, O), without the critic: (B,) int64 or (B, A)."""
        out = self.actor(x)
        if self.continuous:
            return out if deterministic else diag_gaussian(out, self.actor_logstd, None, False)[0]
        return out.argmax(-1) if deterministic else torch.multinomial(out.softmax(-1), 1).squeeze(-1)
