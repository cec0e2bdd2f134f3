"""The environments of a step's episodes stepped at once: the episodes whose turn ended at the same token boundary
hand their replies to their envs (one env per episode, ``episodes.EnvRows``), which answer on a pool of threads, so
a turn of R episodes whose env waits (a remote tool's round trip, ``step_latency``) costs about one wait, not R.

What changes nothing: each env is stepped once with its own reply, and the answers are taken in the episodes' order,
so the episodes are those stepped one after another (tested token for token). An exception that escapes an env's
step is raised as it was, the first in the episodes' order. The pool lives for one ``play_all`` (``with``): its
threads are gone when it returns or raises, so GRPO's validation and test and the actor processes leave none behind.
A tool's time limit holds on a pool thread too: off the main thread ``run_tool`` runs the tool on its own thread
and abandons it at its deadline (``zoo.gpt.tune.envs.base``), where the main thread's SIGALRM would interrupt it.

Threads share what the envs share: one that steps a tool with state of its own (a counter, one connection) is
stepped one after another with ``Episodes(env_threads=1)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

THREAD_NAME = "zoo-env-step"  # the pool's threads, by name (a test counts them)


class EnvSteps:
    """``step(envs, actions)``: ``envs[k].step(actions[k])`` for every k, on at most ``threads`` threads, the
    results in order; one env, or ``threads`` 1, steps on the calling thread. The pool starts at the first step
    that uses it and is shut down (its threads joined) at the ``with`` block's end."""

    def __init__(self, threads: int) -> None:
        self.threads, self.pool = threads, None

    def __enter__(self) -> EnvSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)  # an exception leaves no env stepping past the call
            self.pool = None

    def step(self, envs: Sequence, actions: Sequence[str]) -> list[tuple[Any, ...]]:
        if self.threads <= 1 or len(envs) <= 1:
            return [env.step(action) for env, action in zip(envs, actions, strict=True)]
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=THREAD_NAME)
        inference = torch.is_inference_mode_enabled()  # thread-local: an env that computes with torch sees the same
        futures: list[Future] = [
            self.pool.submit(stepped, env, action, inference) for env, action in zip(envs, actions, strict=True)
        ]
        return [future.result() for future in futures]  # the first to raise in the episodes' order raises


def stepped(env, action: str, inference: bool) -> tuple[Any, ...]:
    with torch.inference_mode(inference):
        return env.step(action)
