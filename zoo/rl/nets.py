"""Actor-critic nets for on-policy agents (PPO, A2C, IMPALA): an actor MLP and a critic MLP side by side, and the
trunks every agent's nets are built from (``mlp``, ``NatureCNN``; the off-policy nets are ``zoo.rl.q_nets``).

The layout and method names follow CleanRL's ``Agent`` (``ppo.py``, ``ppo_continuous_action.py``):
separate actor and critic trunks, orthogonal initialisation with gain sqrt(2) on hidden layers, 0.01 on
the policy head and 1 on the value head, and a state-independent log-std for Gaussian actions
(Schulman et al. 2017, PPO; the choices studied in Engstrom et al. 2020, "Implementation Matters in Deep
Policy Gradients", and Andrychowicz et al. 2021, "What Matters in On-Policy RL").

The action distributions are written out as tensor ops rather than ``torch.distributions`` objects: building
a ``Categorical`` and calling ``sample``/``log_prob``/``entropy`` costs about twice the whole MLP forward at
the batch sizes of a vector env (8 rows), and the collector calls it once per environment step.

Image observations go through a shared encoder first, chosen by config: the NatureCNN of Mnih et al. 2015
("Human-level control through deep RL"), as CleanRL's ``ppo_atari.py`` and SB3's ``CnnPolicy``. MultiDiscrete
actions are K independent categoricals whose logits the actor emits side by side (SB3's ``MultiCategorical``).

Notation: B batch (envs or minibatch rows), O observation features, A actions (the number of discrete
actions, or the dimensions of a continuous action), K components of a MultiDiscrete action, C/H/W channels,
height, width of an image observation.
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


def mlp(
    in_dim: int, hidden: Sequence[int], out_dim: int | None, activation: str = "relu", out_std: float | None = None
) -> nn.Sequential:
    """Linear-activation stack, then a linear head unless ``out_dim`` is None. With ``out_std``: orthogonal
    weights, gain sqrt(2) on the hidden layers and ``out_std`` on the head (the on-policy nets, CleanRL's ``ppo.py``);
    without: PyTorch's default init (the off-policy nets, CleanRL's and SB3's SAC and TD3)."""
    init = layer_init if out_std is not None else lambda layer, std=None: layer
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [init(nn.Linear(in_dim, width)), _ACTIVATIONS[activation]()]
        in_dim = width
    if out_dim is not None:
        layers.append(init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


def categorical(logits: Tensor, action: Tensor | None, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Sample (or score) a categorical action: action (B,) int64, log-probability (B,), entropy (B,)."""
    logp = logits.log_softmax(-1)  # (B, A)
    probs = logp.exp()
    if action is None:
        action = logp.argmax(-1) if deterministic else torch.multinomial(probs, 1).squeeze(-1)
    entropy = -(probs * logp).sum(-1)
    return action, logp.gather(-1, action.unsqueeze(-1)).squeeze(-1), entropy


def multi_categorical(
    logits: Tensor, valid: Tensor, action: Tensor | None, deterministic: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """K independent categoricals, the logits of component k in the k-th run of ``valid`` (K, M) True slots:
    action (B, K) int64, log-probability (B,) and entropy (B,) summed over the components."""
    padded = logits.new_full((logits.shape[0], *valid.shape), float("-inf"))  # (B, K, M): one row per component
    padded[:, valid] = logits
    logp = padded.log_softmax(-1)  # (B, K, M), -inf on the padding
    probs = logp.exp()
    if action is None:
        sampled = lambda: torch.multinomial(probs.flatten(0, 1), 1).view(probs.shape[:2])  # noqa: E731
        action = logp.argmax(-1) if deterministic else sampled()
    # Zero, not -inf, on the padding before the product: 0 * -inf would be NaN, forward or backward.
    entropy = -(probs * logp.masked_fill(~valid, 0.0)).sum((-2, -1))
    return action, logp.gather(-1, action.unsqueeze(-1)).squeeze(-1).sum(-1), entropy


class NatureCNN(nn.Module):
    """Pixels (B, C, H, W) or (B, H, W) in [0, 255] -> features (B, F): Mnih et al. 2015's three convolutions
    (32 8x8/4, 64 4x4/2, 64 3x3/1) and a linear layer, ReLU after each."""

    def __init__(self, obs_shape: Sequence[int], features: int = 512) -> None:
        super().__init__()
        channels = obs_shape[0] if len(obs_shape) == 3 else 1
        self.convs = nn.Sequential(
            layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, channels, *obs_shape[-2:])).shape[1]
        self.fc = nn.Sequential(layer_init(nn.Linear(flat, features)), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 3:  # (B, H, W): one grayscale channel
            x = x.unsqueeze(1)
        return self.fc(self.convs(x / 255.0))  # uint8-valued pixels scaled to [0, 1] (CleanRL, SB3)


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
        obs_dim: int | None = None,
        action_dim: int | None = None,
        continuous: bool | None = None,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: Literal["tanh", "relu"] = "tanh",
        log_std_init: float = 0.0,
        action_nvec: list[int] | None = None,
        encoder: Literal["flat", "nature_cnn"] = "flat",
        obs_shape: list[int] | None = None,
        cnn_features: int = 512,
    ) -> None:
        """
        Args:
            obs_dim: observation features O (the flattened observation space); None: the product of ``obs_shape``.
                A config may leave the sizes unset: ``cli.py`` takes the env's (``zoo.rl.common.env_sizes``).
            action_dim: number of discrete actions, the dimensions of a continuous (Box) action, or the sum of
                ``action_nvec``.
            continuous: Gaussian actions with a learned state-independent log-std instead of categorical ones;
                None: False (a config's: as the env's action space says).
            hidden_sizes: widths of the hidden layers of both the actor and the critic (after the encoder).
            activation: hidden nonlinearity; tanh is the default of PPO's MuJoCo and classic-control results.
            log_std_init: initial log standard deviation of Gaussian actions (0 gives std 1).
            action_nvec: a MultiDiscrete action's choices per component (its ``nvec``); None: one categorical.
            encoder: "flat" feeds the flattened observation to actor and critic; "nature_cnn" encodes image
                observations (C, H, W) or (H, W) of pixels in [0, 255] with Mnih et al. 2015's CNN, shared by both.
            obs_shape: one observation's shape, channels first; needed by "nature_cnn".
            cnn_features: F, the CNN's output features (512 in the paper).
        """
        if (obs_dim is None and obs_shape is None) or action_dim is None:
            raise ValueError("ActorCritic needs obs_dim (or obs_shape) and action_dim (cli.py takes the env's)")
        super().__init__()
        self.obs_shape = tuple(obs_shape) if obs_shape else None
        continuous = bool(continuous)
        self.obs_dim = obs_dim if obs_dim is not None else math.prod(obs_shape)
        self.action_dim, self.continuous, self.action_nvec = action_dim, continuous, action_nvec
        if action_nvec is not None:
            if sum(action_nvec) != action_dim or continuous:
                raise ValueError(f"a MultiDiscrete action {action_nvec} takes action_dim={sum(action_nvec)}, discrete")
            slots = torch.arange(max(action_nvec))
            self.register_buffer("action_slots", slots < torch.tensor(action_nvec)[:, None], persistent=False)
        if encoder == "nature_cnn":
            if self.obs_shape is None or len(self.obs_shape) not in (2, 3):
                raise ValueError(f"nature_cnn takes image observations (C, H, W) or (H, W), not obs_shape={obs_shape}")
            self.encoder, features = NatureCNN(self.obs_shape, cnn_features), cnn_features
        else:
            self.encoder, features = nn.Flatten(), self.obs_dim  # (B, *obs_shape) -> (B, O); no parameters
        self.critic = mlp(features, hidden_sizes, 1, out_std=1.0, activation=activation)
        # A small policy head starts every action (nearly) equally likely / centred at 0 (Andrychowicz et al. 2021).
        self.actor = mlp(features, hidden_sizes, action_dim, out_std=0.01, activation=activation)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.full((1, action_dim), float(log_std_init)))

    def no_weight_decay(self) -> tuple[str, ...]:
        """The log-std is 2-D but no weight: decaying it would pull every policy towards std 1."""
        return ("actor_logstd",)

    def io_layers(self) -> tuple[str, ...]:
        """The layers that read the observation and write the outputs, which Muon must not take
        (``zoo.train.optim``): the CNN's first convolution, or each MLP's first layer on flat observations, and
        both heads. The CNN's other layers and the MLPs' hidden layers are hidden matrices."""
        reads = ("encoder.convs.0",) if isinstance(self.encoder, NatureCNN) else ("actor.0", "critic.0")
        return (*reads, f"actor.{len(self.actor) - 1}", f"critic.{len(self.critic) - 1}")

    def get_value(self, x: Tensor) -> Tensor:
        """V(s) for observations (B, *obs_shape): (B,)."""
        return self.critic(self.encoder(x)).squeeze(-1)

    def _policy(self, out: Tensor, action: Tensor | None, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
        """(action, log-probability, entropy) of the actor's output ``out`` (B, A), as the action space calls for."""
        if self.continuous:
            return diag_gaussian(out, self.actor_logstd, action, deterministic)
        if self.action_nvec is not None:
            return multi_categorical(out, self.action_slots, action, deterministic)
        return categorical(out, action, deterministic)

    def get_action_and_value(
        self, x: Tensor, action: Tensor | None = None, deterministic: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Sample an action (or score ``action``): (action, log pi(a|s) (B,), entropy (B,), V(s) (B,)).

        ``deterministic`` takes the most likely action (argmax or mean) instead of sampling.
        """
        h = self.encoder(x)  # (B, O) or (B, F): the features actor and critic share
        out = self.actor(h)  # (B, A): logits or Gaussian means
        action, logp, entropy = self._policy(out, action, deterministic)
        return action, logp, entropy, self.critic(h).squeeze(-1)

    @torch.no_grad()
    def act(self, x: Tensor, deterministic: bool = True) -> Tensor:
        """Actions for observations (B, *obs_shape), without the critic: (B,) int64, (B, K) int64 or (B, A)."""
        out = self.actor(self.encoder(x))
        if self.continuous:
            return out if deterministic else diag_gaussian(out, self.actor_logstd, None, False)[0]
        if self.action_nvec is not None:
            return multi_categorical(out, self.action_slots, None, deterministic)[0]
        return out.argmax(-1) if deterministic else torch.multinomial(out.softmax(-1), 1).squeeze(-1)
