"""Environments of our own, for pixel observations without an extra renderer.

``NumpyCartPole`` is gymnasium's CartPole drawn with NumPy instead of pygame (which classic control needs to
render, and which is not a dependency here): a pixel-observation task that needs neither pygame nor a ROM.
gymnasium's ``AddRenderObservation`` turns its frames into observations; ``GrayscaleObservation`` and
``FrameStackObservation`` then give the (stack, H, W) input of Atari-style agents
(``configs/rl/ppo_cartpole_pixels.yaml``).

Make it through its module-qualified id, which imports this module and with it the registration (gymnasium's
``module:EnvId`` form): ``gym.make("datamodules.gym_envs:NumpyCartPole-v1", render_mode="rgb_array")``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class NumpyCartPole(CartPoleEnv):
    """CartPole-v1 whose ``render`` ("rgb_array") draws the cart and pole with array operations, any frame size."""

    metadata = {**CartPoleEnv.metadata, "render_modes": ["rgb_array"]}

    def __init__(self, render_mode: str | None = None, width: int = 84, height: int = 84) -> None:
        super().__init__(render_mode=render_mode)
        self.width, self.height = width, height
        self._ys, self._xs = np.mgrid[0:height, 0:width].astype(np.float32)  # pixel centres, (H, W) each

    def render(self) -> np.ndarray:
        """(H, W, 3) uint8: a white background, the black cart on a grey track, the brown pole on the cart."""
        scale = self.width / (2 * self.x_threshold)  # pixels per world unit: the track spans the frame
        cart_x = (self.state[0] + self.x_threshold) * scale
        cart_y = 0.75 * self.height
        frame = np.full((self.height, self.width, 3), 255, dtype=np.uint8)
        frame[np.abs(self._ys - cart_y) < 0.5] = 160  # the track
        cart = (np.abs(self._xs - cart_x) <= 0.25 * scale) & (np.abs(self._ys - cart_y) <= 0.15 * scale)
        frame[cart] = 0
        # The pole: every pixel within half its width of the segment from the cart to the pole's tip.
        tip = np.array([np.sin(self.state[2]), -np.cos(self.state[2])]) * (2 * self.length * scale)
        px, py = self._xs - cart_x, self._ys - cart_y
        along = np.clip((px * tip[0] + py * tip[1]) / (tip @ tip), 0.0, 1.0)
        pole = np.hypot(px - along * tip[0], py - along * tip[1]) <= max(0.05 * scale, 0.75)
        frame[pole] = (202, 152, 101)
        return frame


gym.register("NumpyCartPole-v1", entry_point=NumpyCartPole, max_episode_steps=500, reward_threshold=475.0)
