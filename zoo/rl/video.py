"""One episode played by an agent, recorded as RGB frames (``callbacks.media`` writes them as a GIF or an MP4).

Rendering needs the env's own renderer: classic control draws with
pygame, MuJoCo with its GL context; when it is missing the recording is skipped with a warning that names it,
and the rest of predict goes on.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from zoo.rl.collector import env_actions


@torch.no_grad()
def record_episode(
    env: gym.Env,
    policy: Callable[[Tensor], Tensor],
    seed: int | None = None,
    max_frames: int = 1000,
    device: torch.device | str = "cpu",
) -> tuple[list[np.ndarray], float]:
    """(frames (H, W, 3) uint8, return) of one episode of ``policy`` on ``env`` (render_mode "rgb_array")."""
    obs, _ = env.reset(seed=seed)
    frames, total = [env.render()], 0.0
    for _ in range(max_frames - 1):
        x = torch.as_tensor(obs, dtype=torch.float32, device=device).unsqueeze(0)  # (1, O): policies take batches
        obs, reward, terminated, truncated, _ = env.step(env_actions(policy(x), env.action_space)[0])
        total += float(reward)
        frames.append(env.render())
        if terminated or truncated:
            break
    return frames, total
