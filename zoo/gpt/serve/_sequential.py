"""A one-request-at-a-time engine with the continuous-batching engine's interface (``zoo.gpt.serve.engine``): the
server's stand-in until that engine lands, and the baseline the bench sets beside it. One worker thread decodes the
queued requests in turn with ``zoo.gpt.generate.decoding``, so a request's tokens are ``generate``'s."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from zoo.gpt.generate import decoding

_END = object()


class QueueFull(Exception):
    """More requests waiting than ``max_queue``: the caller answers 429 and the client retries later."""


@dataclass(frozen=True)
class SamplingParams:
    """One request's decoding: ``temperature`` 0 is greedy, ``top_k`` 0 and ``top_p`` 1 keep every token."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None


class Request:
    """A submitted prompt: iterate for its token ids as they are drawn (the stop id left out); ``cancel`` ends it at
    the next token boundary."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self.prompt_ids, self.params = prompt_ids, params
        self.finish_reason: str | None = None
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()

    def __iter__(self) -> Iterator[int]:
        while (token := self._tokens.get()) is not _END:
            yield token

    def cancel(self) -> None:
        self._cancelled.set()

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self._tokens.put(_END)


class Engine:
    def __init__(self, module_or_net, *, max_batch: int = 8, max_queue: int = 64, context: int | None = None) -> None:
        self.net = getattr(module_or_net, "net", module_or_net)
        self.context = context or self.net.block_size
        self._waiting: queue.Queue = queue.Queue(maxsize=max_queue)
        self._worker: threading.Thread | None = None
        self._closed = threading.Event()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        request = Request(list(prompt_ids), params)
        try:
            self._waiting.put_nowait(request)
        except queue.Full:
            raise QueueFull(f"{self._waiting.maxsize} requests are waiting") from None
        return request

    def start(self) -> None:
        self._worker = threading.Thread(target=self._run, name="zoo-serve-engine", daemon=True)
        self._worker.start()

    def close(self) -> None:
        self._closed.set()
        self._waiting.put(None)  # wakes the worker
        if self._worker is not None:
            self._worker.join()
        while True:  # whatever still waits ends, so no client iterates forever
            try:
                request = self._waiting.get_nowait()
            except queue.Empty:
                break
            if request is not None:
                request._finish("cancelled")

    def _run(self) -> None:
        while not self._closed.is_set():
            request = self._waiting.get()
            if request is None:
                continue
            try:
                self._decode(request)
            except Exception:  # one request's failure ends that request ("error"), not the engine
                logging.getLogger(__name__).exception("decoding a request failed")

    def _decode(self, request: Request) -> None:
        p = request.params
        generator = torch.Generator(self.net.tok_emb.weight.device)
        generator.manual_seed(p.seed) if p.seed is not None else generator.seed()
        stop = set(p.stop_ids)
        prompt = torch.tensor(request.prompt_ids, dtype=torch.long, device=self.net.tok_emb.weight.device)
        top_k, top_p = p.top_k or None, None if p.top_p >= 1 else p.top_p
        reason = "error"
        try:
            with torch.inference_mode():
                steps = decoding(
                    self.net, [prompt], p.max_new_tokens, p.temperature, top_k, top_p,
                    generator=generator, repetition_penalty=p.repetition_penalty,
                )  # fmt: skip
                for nxt in steps:
                    if request._cancelled.is_set() or self._closed.is_set():
                        reason = "cancelled"
                        break
                    if int(nxt[0]) in stop:
                        reason = "stop"
                        break
                    request._tokens.put(int(nxt[0]))
                else:
                    reason = "length"
        finally:
            request._finish(reason)
