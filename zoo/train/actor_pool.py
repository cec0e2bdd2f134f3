"""Actor processes that fill shared-memory slots with a slightly stale copy of the learner's net: the machinery
IMPALA's actors (``zoo.rl.actors``) and GRPO's asynchronous rollouts (``zoo.gpt.tune.async_rollout``) share.

The layout is torchbeast's monobeast (Küttler et al. 2019, "TorchBeast"):
  - slots: K preallocated tensors per field in shared memory (``shared_slots``, from a spec of name -> (shape,
    dtype) of one slot); what a slot holds is the worker's business;
  - two queues of slot *indices*, never tensors: an actor takes a free index, fills that slot and puts the
    index on the full queue; the learner ``get``s a full index, copies the slot out and ``release``s it to the
    free queue. An index is in exactly one place at a time (the free queue, one actor, the full queue, the
    learner), so no slot is read while it is being written;
  - the learner's weights in shared memory with a version counter: each actor keeps a copy and refreshes it,
    under a lock, before filling a slot when the version has moved on. Actors thus act with weights a few
    updates old, the lag the learner's importance weights correct for (V-trace, Espeholt et al. 2018).
An actor's failure travels as its traceback text, and the learner raises it.

An actor is built in its process by ``build(rank, shared_net)``, a picklable callable returning a ``Worker``:
an object with a ``net`` (its local copy), the ``version`` it holds, ``fill(k)`` and ``close()``.

Processes start fresh, never forked from the learner (whose threads, CUDA context and open files a fork
would copy): through a fork server by default, else spawned. Either way a new interpreter imports torch and the
worker's modules (and with them Lightning), several seconds on a busy 2-core machine. Spawned, every actor of
every fit pays that; the fork server (started fresh, like a spawned process) imports them once per learner
process and then forks each actor from its clean state in milliseconds, which is what lets the tests, a resumed
fit and a benchmark's seeds start actors again and again. The actors are daemonic (the interpreter's exit reaps
them), ignore SIGINT (Ctrl-C reaches the whole process group; the learner's handler stops them in order) and
leave when the learner's process is gone.
"""

from __future__ import annotations

import copy
import os
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from typing import Literal, Protocol

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn

SlotSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]  # one slot's fields: name -> (shape, dtype)


def shared_slots(spec: SlotSpec, num_slots: int) -> dict[str, Tensor]:
    """``num_slots`` zeroed slots of ``spec``'s fields, each field one (K, *shape) tensor in shared memory."""
    return {name: torch.zeros((num_slots, *shape), dtype=dt).share_memory_() for name, (shape, dt) in spec.items()}


class Worker(Protocol):
    """What ``build`` returns in an actor's process."""

    net: nn.Module  # the actor's own copy: acting never reads weights the learner is writing
    version: int  # the version of the weights ``net`` holds; -1 before the first refresh

    def fill(self, k: int) -> None: ...

    def close(self) -> None: ...


class ActorError(RuntimeError):
    """An actor process failed; the message carries its traceback or exit code."""


def actor_seed(seed: int, rank: int) -> int:
    """The torch seed of actor ``rank``'s sampling."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def refresh(worker: Worker, shared: nn.Module, version: Tensor, lock) -> None:
    """Copies the learner's published weights when their version has moved on (torchbeast copies always)."""
    if int(version) != worker.version:
        with lock:
            worker.net.load_state_dict(shared.state_dict())
            worker.version = int(version)


def run_actor(rank: int, build: Callable, shared: nn.Module, version: Tensor, lock, free, full, errors, stop, seed):
    """An actor process's body: fill free slots until told to stop, or the learner's process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited from ActorPool's start too; the learner stops us
    torch.set_num_threads(1)  # the actors share the cores
    worker, learner = None, mp.parent_process()  # the process that started us, also through a fork server
    try:
        torch.manual_seed(actor_seed(seed, rank))
        worker = build(rank, shared)
        while not stop.is_set() and learner.is_alive():
            try:
                k = free.get(timeout=0.1)
            except queue.Empty:
                continue
            refresh(worker, shared, version, lock)
            worker.fill(k)
            full.put(k)
    except Exception:
        errors.put((rank, traceback.format_exc()))
    finally:
        full.cancel_join_thread()  # exiting must not wait on a queue nobody reads any more
        if worker is not None:
            worker.close()


class ActorPool:
    """``num_actors`` processes filling ``num_slots`` slots; the learner ``get``s and ``release``s slot indices and
    ``publish``es weights. ``close`` (also on garbage collection and at exit) stops and joins every process."""

    def __init__(
        self,
        build: Callable[[int, nn.Module], Worker],
        policy: nn.Module,
        num_actors: int,
        num_slots: int,
        seed: int,
        preload: list[str],
        name: str = "actor",
        start_method: Literal["forkserver", "spawn"] = "forkserver",
    ) -> None:
        """
        Args:
            build: ``build(rank, shared_net)`` makes actor ``rank``'s worker in its process (picklable).
            policy: the learner's net; a CPU copy in shared memory becomes version 0 of the actors' weights.
            num_actors: actor processes.
            num_slots: K; slot indices 0..K-1 start on the free queue.
            seed: actor r samples from torch seed ``actor_seed(seed, r)``.
            preload: modules the fork server imports once (the worker's, the script's ``__main__``).
            name: how errors and process names call an actor ("IMPALA actor").
            start_method: "forkserver" imports the actors' modules once per learner process, "spawn" once per
                actor (see above). Both start from a fresh interpreter, safe under the CLI, pytest and CUDA.
        """
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            start_fork_server(ctx, ["__main__", __name__, *preload])
        self.name, self.num_slots = name, num_slots
        self.shared = copy.deepcopy(policy).cpu().requires_grad_(False).share_memory()
        self.version = torch.zeros((), dtype=torch.int64).share_memory_()
        self.lock = ctx.Lock()
        self.free, self.full, self.errors, self.stop = ctx.Queue(), ctx.Queue(), ctx.SimpleQueue(), ctx.Event()
        for k in range(num_slots):
            self.free.put(k)
        args = (build, self.shared, self.version, self.lock, self.free, self.full, self.errors, self.stop, seed)
        label = name.lower().replace(" ", "-")
        self.processes = [
            ctx.Process(target=run_actor, name=f"{label}-{r}", daemon=True, args=(r, *args)) for r in range(num_actors)
        ]
        self._close = weakref.finalize(self, _shutdown, self.stop, self.processes, (self.free, self.full))
        with sigint_ignored():
            for p in self.processes:
                p.start()

    def get(self) -> int:
        """The index of a full slot, waiting for one; raises ``ActorError`` when an actor has died."""
        while True:
            try:
                return self.full.get(timeout=0.05)
            except queue.Empty:
                self.check()

    def release(self, k: int) -> None:
        """Hands slot ``k`` back to the actors."""
        self.free.put(k)

    @torch.no_grad()
    def publish(self, net: nn.Module) -> int:
        """Copies ``net``'s weights to the actors' shared copy; they pick it up before their next slot."""
        with self.lock:
            for dst, src in zip(self.shared.state_dict().values(), net.state_dict().values()):
                dst.copy_(src)
            self.version += 1
        return int(self.version)

    def check(self) -> None:
        """Raises ``ActorError`` with the traceback (or exit code) of an actor that has stopped."""
        dead = [(r, p) for r, p in enumerate(self.processes) if not p.is_alive()]
        if not dead and self.errors.empty():
            return
        if not self.errors.empty():
            rank, text = self.errors.get()
            raise ActorError(f"{self.name} {rank} failed:\n{text}")
        r, p = dead[0]
        raise ActorError(f"{self.name} {r} (pid {p.pid}) exited with code {p.exitcode} while the learner ran")

    def close(self) -> None:
        """Stops and joins the actors (idempotent)."""
        self._close()


def start_fork_server(ctx, preload: list[str]) -> None:
    """Starts the fork server with ``preload`` imported, unless it runs already (then it keeps its modules)."""
    from multiprocessing import forkserver

    ctx.set_forkserver_preload(preload)
    # Before Python 3.12.8 the server is handed the learner's sys.path but does not apply it, so preloading what
    # only a run-time path makes importable (pytest's rootdir, a script's sys.path.insert) fails silently and
    # every actor imports it again; PYTHONPATH is the workaround CPython's fix names (gh-117378).
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        with sigint_ignored():  # the server hands its SIGINT disposition down to the actors it forks
            forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


@contextmanager
def sigint_ignored():
    """SIGINT ignored in this process meanwhile, a disposition the processes it starts inherit: a Ctrl-C while an
    actor imports would otherwise kill it with a traceback before ``run_actor`` can ignore it."""
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, before)


def _shutdown(stop, processes: list, queues: tuple, timeout: float = 5.0) -> None:
    stop.set()
    deadline = time.monotonic() + timeout
    for p in processes:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.pid is not None and p.is_alive():  # stuck in a step: no longer our problem to wait for
            p.kill()
            p.join()
    for q in queues:
        q.cancel_join_thread()
        q.close()
