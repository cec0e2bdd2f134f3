"""Nets for the off-policy agents: twin Q critics with a tanh-squashed Gaussian actor (soft actor-critic, Haarnoja
et al. 2018) or a deterministic tanh actor (TD3, Fujimoto et al. 2018).

The choices follow CleanRL's ``sac_continuous_action.py`` and ``td3_continuous_action.py`` and SB3's ``SAC`` and
``TD3`` (SAC's after the authors' ``softlearning``): ReLU MLPs of 256 x 256 with PyTorch's default initialisation,
actions rescaled from tanh's (-1, 1) to the Box bounds, and two critics whose minimum is the target (clipped double
Q). SAC's actor has a state-dependent log-std squashed smoothly into [log_std_min, log_std_max] (CleanRL's bound,
from SpinningUp and Denis Yarats' ``pytorch_sac``) and acts a = bias + scale * tanh(u), u ~ N(mu(s), sigma(s));
TD3's acts mu(s) = bias + scale * tanh(MLP(s)).

Log-probability of the squashed action, by the change of variables (Haarnoja et al. 2018, appendix C):
    log pi(a|s) = log N(u; mu, sigma) - sum_i log(scale_i * (1 - tanh(u_i)^2))
with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), exact and finite for every u (SpinningUp's form,
also ``torch.distributions.TanhTransform``), where CleanRL and SB3 write log(1 - tanh(u)^2 + 1e-6). The
scale's term makes it the density of the action the env receives, as CleanRL's ``log(action_scale * ...)``.

The critics are two MLPs side by side rather than one batched ensemble (``torch.baddbmm`` over stacked
weights): on a CPU the 256 x 256 matmuls dominate, and the batched form measured no faster.

Notation: B batch, O observation features, A action dims, K critics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.rl.nets import mlp

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_LOG_2 = math.log(2.0)


def log_det_tanh(u: Tensor) -> Tensor:
    """log(1 - tanh(u)^2) elementwise, written so that it stays finite where tanh(u) rounds to +-1."""
    return 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))


def register_action_bounds(
    actor: nn.Module, action_dim: int, low: float | Sequence[float] | None, high: float | Sequence[float] | None
) -> None:
    """``actor.action_scale`` and ``actor.action_bias`` (A,), buffers mapping tanh's (-1, 1) onto [low, high]: one
    number for every dimension or one per dimension; None: -1 and 1."""
    low = _as_vector(-1.0 if low is None else low, action_dim)
    high = _as_vector(1.0 if high is None else high, action_dim)
    actor.register_buffer("action_scale", (high - low) / 2)  # (A,)
    actor.register_buffer("action_bias", (high + low) / 2)  # (A,)


def _as_vector(x: float | Sequence[float], dim: int) -> Tensor:
    t = torch.as_tensor(x, dtype=torch.float32)
    return t.expand(dim).clone() if t.ndim == 0 else t.reshape(dim).clone()


def _check_sizes(net: str, obs_dim: int | None, action_dim: int | None) -> None:
    if obs_dim is None or action_dim is None:
        raise ValueError(f"{net} needs obs_dim and action_dim (cli.py takes the env's)")


class SquashedGaussianActor(nn.Module):
    """pi(a|s): a = bias + scale * tanh(u), u ~ N(mu(s), sigma(s)), with log pi(a|s) for the entropy terms."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Sequence[int] = (256, 256),
        action_low: float | Sequence[float] | None = None,
        action_high: float | Sequence[float] | None = None,
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
    ) -> None:
        super().__init__()
        self.trunk = mlp(obs_dim, hidden_sizes, None)
        self.head = nn.Linear(hidden_sizes[-1], 2 * action_dim)  # mean and log-std in one matmul
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        register_action_bounds(self, action_dim, action_low, action_high)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(mean (B, A), log-std (B, A)) of the Gaussian before squashing."""
        mean, log_std = self.head(self.trunk(x)).chunk(2, -1)  # (B, A) each
        # A smooth bound rather than a clamp keeps a gradient at the edges (CleanRL; SpinningUp; pytorch_sac).
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (torch.tanh(log_std) + 1)
        return mean, log_std

    def get_action(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """A reparameterised sample (differentiable in the actor's parameters): (action (B, A), log pi (B,))."""
        mean, log_std = self(x)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise  # (B, A), the Gaussian sample before tanh
        # log N(u; mean, std) with (u - mean) / std = noise, so no division is needed.
        logp = -0.5 * noise.square() - log_std - _LOG_SQRT_2PI - log_det_tanh(u) - self.action_scale.log()
        return self.action_bias + self.action_scale * torch.tanh(u), logp.sum(-1)

    def log_prob(self, x: Tensor, action: Tensor) -> Tensor:
        """log pi(action|s) (B,) of actions strictly inside the bounds (tests and diagnostics)."""
        mean, log_std = self(x)
        u = torch.atanh((action - self.action_bias) / self.action_scale)
        logp = -0.5 * ((u - mean) / log_std.exp()).square() - log_std - _LOG_SQRT_2PI
        return (logp - log_det_tanh(u) - self.action_scale.log()).sum(-1)

    @torch.no_grad()
    def act(self, x: Tensor, deterministic: bool = True) -> Tensor:
        """Actions (B, A) in the Box: the squashed mean, or a sample."""
        if not deterministic:
            return self.get_action(x)[0]
        return self.action_bias + self.action_scale * torch.tanh(self(x)[0])


class DeterministicActor(nn.Module):
    """mu(s) = bias + scale * tanh(MLP(s)): one action per observation, inside the Box."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Sequence[int] = (256, 256),
        action_low: float | Sequence[float] | None = None,
        action_high: float | Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.mlp = mlp(obs_dim, hidden_sizes, action_dim)
        register_action_bounds(self, action_dim, action_low, action_high)

    def forward(self, x: Tensor) -> Tensor:
        return self.action_bias + self.action_scale * torch.tanh(self.mlp(x))  # (B, A)


class TwinQ(nn.Module):
    """K Q functions Q_k(s, a) in one module (K = 2 for clipped double Q)."""

    def __init__(
        self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int] = (256, 256), num_critics: int = 2
    ) -> None:
        super().__init__()
        self.qs = nn.ModuleList(mlp(obs_dim + action_dim, hidden_sizes, 1) for _ in range(num_critics))

    def forward(self, x: Tensor, action: Tensor, detach_params: bool = False, first: bool = False) -> Tensor:
        """Q_k(s, a) for every critic: (K, B); with ``first``, Q_1(s, a) alone: (1, B).

        ``detach_params`` evaluates the critics with their parameters detached: an actor's loss needs
        gradients only through the action, and skipping the critics' weight gradients saves about a third
        of that backward pass (CleanRL and SB3 compute them and discard them at the critic's next zero_grad).
        """
        xa = torch.cat([x, action], -1)  # (B, O + A)
        qs = self.qs[:1] if first else self.qs
        return torch.stack([_detached_forward(q, xa) if detach_params else q(xa) for q in qs]).squeeze(-1)


def _detached_forward(mlp: nn.Sequential, x: Tensor) -> Tensor:
    for layer in mlp:
        x = F.linear(x, layer.weight.detach(), layer.bias.detach()) if isinstance(layer, nn.Linear) else layer(x)
    return x


class SoftActorCritic(nn.Module):
    """SAC's nets: ``actor`` (squashed Gaussian) and ``critic`` (twin Q); the module keeps the target copy."""

    continuous = True  # checked against the env (zoo.rl.common.check_env): SAC acts in Box action spaces only

    def __init__(
        self,
        obs_dim: int | None = None,
        action_dim: int | None = None,
        action_low: float | list[float] | None = None,
        action_high: float | list[float] | None = None,
        hidden_sizes: tuple[int, ...] = (256, 256),
        num_critics: int = 2,
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
    ) -> None:
        """
        Args:
            obs_dim: observation features O (the flattened observation space). A config may leave the sizes and
                bounds unset: ``cli.py`` takes the env's (``zoo.rl.common.env_sizes``).
            action_dim: dimensions A of the (Box) action.
            action_low: the Box's lower bound, one number for every dimension or one per dimension; None: -1.
            action_high: the Box's upper bound, likewise (None: 1); actions are rescaled from tanh's (-1, 1) to the
                Box.
            hidden_sizes: widths of the hidden layers of the actor and of each critic.
            num_critics: K, Q functions whose minimum forms the targets (2: clipped double Q).
            log_std_min: lower bound of the actor's log standard deviation (CleanRL -5; SB3 clamps at -20).
            log_std_max: upper bound of the actor's log standard deviation.
        """
        _check_sizes("SoftActorCritic", obs_dim, action_dim)
        super().__init__()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.actor = SquashedGaussianActor(
            obs_dim, action_dim, hidden_sizes, action_low, action_high, log_std_min, log_std_max
        )
        self.critic = TwinQ(obs_dim, action_dim, hidden_sizes, num_critics)

    def get_action(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Sampled action (B, A) and its log-probability (B,), differentiable (reparameterised)."""
        return self.actor.get_action(x)

    def get_q_values(self, x: Tensor, action: Tensor, detach_params: bool = False) -> Tensor:
        """Q_k(s, a) of every critic: (K, B)."""
        return self.critic(x, action, detach_params)

    @torch.no_grad()
    def act(self, x: Tensor, deterministic: bool = True) -> Tensor:
        """Actions (B, A) for observations (B, O), inside the action bounds."""
        return self.actor.act(x, deterministic)


class DeterministicActorCritic(nn.Module):
    """TD3's nets: ``actor`` (deterministic, tanh-bounded) and ``critic`` (twin Q); the module keeps the targets."""

    continuous = True  # checked against the env: TD3 acts in Box action spaces only

    def __init__(
        self,
        obs_dim: int | None = None,
        action_dim: int | None = None,
        action_low: float | list[float] | None = None,
        action_high: float | list[float] | None = None,
        hidden_sizes: tuple[int, ...] = (256, 256),
        num_critics: int = 2,
    ) -> None:
        """
        Args:
            obs_dim: observation features O, as ``SoftActorCritic``'s (``cli.py`` takes the env's when unset).
            action_dim: dimensions A of the (Box) action.
            action_low: the Box's lower bound, one number or one per dimension; None: -1.
            action_high: the Box's upper bound, likewise (None: 1).
            hidden_sizes: widths of the hidden layers of the actor and of each critic (CleanRL and SB3: 256 x 256).
            num_critics: K, Q functions whose minimum forms the targets (2: clipped double Q).
        """
        _check_sizes("DeterministicActorCritic", obs_dim, action_dim)
        super().__init__()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.actor = DeterministicActor(obs_dim, action_dim, hidden_sizes, action_low, action_high)
        self.critic = TwinQ(obs_dim, action_dim, hidden_sizes, num_critics)

    def get_q_values(self, x: Tensor, action: Tensor) -> Tensor:
        """Q_k(s, a) of every critic: (K, B)."""
        return self.critic(x, action)

    def get_q1(self, x: Tensor, action: Tensor) -> Tensor:
        """Q_1(s, a) (B,) with the critic's parameters detached: the actor's loss differentiates only through the
        action (SB3's ``q1_forward``; the detached weights save their gradients' computation)."""
        return self.critic(x, action, detach_params=True, first=True).squeeze(0)

    @torch.no_grad()
    def act(self, x: Tensor, deterministic: bool = True) -> Tensor:
        """mu(s) (B, A); exploration noise is the module's (``TD3Module.act``)."""
        return self.actor(x)
