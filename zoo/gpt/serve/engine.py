"""Continuous batching for the GPT: concurrent requests share one forward pass per token.

Requests join and leave the running batch at token boundaries (iteration-level scheduling: Yu et al. 2022, "Orca: A
Distributed Serving System for Transformer-Based Generative Models", OSDI), each sequence in its own row of a cache
preallocated in the layout its attention states (``cache_layout``: keys and values for MHA/GQA, MLA's latent and
shared RoPE key), so a step is one forward of the running rows however many requests came and went.

Rows are right-aligned: every running sequence writes its newest token at the same slot s, and row b's first pad[b]
slots are not its own. That is ``generate``'s left padding, so the GPT's ``pad`` argument (row b's positions are
slot - pad[b]; a mask hides its slots before pad[b]) serves the batch unchanged, sliding windows and mixtures of
experts included. The bookkeeping is two moves of whole rows:
  join:  the prompts joining at one boundary are prefilled together, left-padded (the call ``generate`` makes for
         a batch), straight into free rows, each ending just before slot s; a prompt longer than s first moves every
         row right.
  leave: the last row moves into the leaver's, so the running rows are always 0..n-1 and a step reads those only;
         then every row moves left by the smallest padding.
So some running row always has no padding: s is the longest running sequence's length, a step attends over no more
slots than that sequence holds, and s stays inside the context (a sequence that fills it ends with "length").
A greedy request's tokens are those ``generate`` decodes for it alone (tested for MHA, GQA, MLA, sliding windows and
MoE); each request samples with its own generator, so a seeded one repeats its tokens whatever runs beside it.

Notation: R max_batch rows, n running rows, N context slots, s the slot the next step writes, L a prompt's length,
V vocabulary.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.generate import cache_placement, device_memory, penalize_repetition, sample_next
from zoo.gpt.gpt import GPT

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """``max_queue`` requests already wait for a row: try again later (an HTTP layer answers 429 or 503)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request is continued.

    Args:
        max_new_tokens: tokens generated at most (fewer at a stop id, or where the sequence fills the context).
        temperature: softmax temperature; 0 is greedy.
        top_p: sample from the smallest set of ids whose probability reaches top_p; 1: all ids.
        top_k: sample among the k most likely ids; 0: all ids.
        repetition_penalty: CTRL's penalty on every id of the prompt and continuation, as ``generate`` applies it;
            1: none.
        stop_ids: ids that end the sequence, not yielded (the tokenizer's EOS and any others).
        seed: the request's own generator's seed; None: seeded from the system.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_ids", tuple(self.stop_ids))
        rules = (
            ("max_new_tokens", _is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "an integer, 1 or more"),
            ("temperature", self.temperature >= 0, "0 or more (0: greedy)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1] (1: all ids)"),
            ("top_k", _is_int(self.top_k) and self.top_k >= 0, "an integer, 0 or more (0: all ids)"),
            ("repetition_penalty", self.repetition_penalty > 0, "more than 0 (1: none)"),
            ("stop_ids", all(_is_int(i) for i in self.stop_ids), "integers"),
            ("seed", self.seed is None or _is_int(self.seed), "an integer or None"),
        )
        for name, ok, rule in rules:
            if not ok:
                raise InputError(f"{name}={getattr(self, name)!r} must be {rule}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_END = object()  # what a request's queue holds after its last token


class Request:
    """One sequence: iterating it yields its token ids as they are drawn (from any one thread) and ends at a stop id,
    at ``max_new_tokens`` or at ``cancel``; ``finish_reason`` then says which ("stop", "length", "cancelled"; "error"
    when the engine failed, and the iteration raises)."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self.prompt_ids, self.params = prompt_ids, params
        self.tokens: list[int] = []  # yielded so far: the continuation, stop id excluded
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled, self._done = threading.Event(), threading.Event()
        self._listener = None
        self._lock = threading.Lock()  # a listener sees every item once, in order, however late it came

    def __iter__(self) -> Iterator[int]:
        while (item := self._out.get()) is not _END:
            yield item
        self._out.put(_END)  # a second iteration ends at once instead of waiting forever
        if self.error is not None:
            raise RuntimeError(f"the engine failed while decoding this request: {self.error}") from self.error

    def cancel(self) -> None:
        """Stop decoding this request: its row is freed at the next token boundary (a queued one never runs)."""
        self._cancelled.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request has finished (or ``timeout`` seconds); whether it has."""
        return self._done.wait(timeout)

    def listen(self, callback) -> None:
        """Have the engine's thread call ``callback(token)`` for each token from now on, and ``callback(None)`` once
        at the end (``finish_reason`` and ``error`` set), the tokens drawn before this call first, instead of
        iterating: a server's event loop then needs no thread waiting per request (``loop.call_soon_threadsafe``)."""
        with self._lock:
            while not self._out.empty():
                item = self._out.get()
                callback(None if item is _END else item)
            self._listener = callback

    def _put(self, item) -> None:
        with self._lock:
            if self._listener is None:
                self._out.put(item)
            else:
                self._listener(None if item is _END else item)

    def _emit(self, token: int) -> None:
        self.tokens.append(token)
        self._put(token)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        if not self.done:
            self.finish_reason, self.error = reason, error
            self._done.set()
            self._put(_END)


@dataclass
class _Row:
    """A running request in its cache row: its padding and its own sampler."""

    request: Request
    pad: int
    generator: torch.Generator
    greedy: bool  # argmax of the unpenalized logits: taken from the batch's one argmax


class _RowsView:
    """Rows of one layer's buffers as a forward writes them (``attention.LayerCache``): tokens at ``start`` land at
    slot offset + start, and the view returns the slots from ``offset`` on."""

    def __init__(self, a: Tensor, b: Tensor | None, offset: int) -> None:
        self.a, self.b, self.offset = a, b, offset

    def update(self, a: Tensor, b: Tensor | None, start: int) -> tuple[Tensor, Tensor | None]:
        lo, hi = self.offset + start, self.offset + start + a.shape[2]
        self.a[:, :, lo:hi] = a
        if self.b is None:
            return self.a[:, :, self.offset : hi], None
        self.b[:, :, lo:hi] = b
        return self.a[:, :, self.offset : hi], self.b[:, :, self.offset : hi]


class SlotCache:
    """One layer's cache of R rows by N slots in its attention's ``(heads, da, db)`` layout: ``a`` (R, heads, N, da)
    and, when db > 0, ``b`` (R, heads, N, db)."""

    def __init__(self, rows: int, slots: int, layout: tuple[int, int, int], device, dtype) -> None:
        heads, da, db = layout
        self.a = torch.zeros(rows, heads, slots, da, device=device, dtype=dtype)
        self.b = torch.zeros(rows, heads, slots, db, device=device, dtype=dtype) if db else None

    def buffers(self) -> list[Tensor]:
        return [self.a] if self.b is None else [self.a, self.b]

    def view(self, first: int, last: int, offset: int) -> _RowsView:
        """Rows first..last-1, written from slot ``offset`` on."""
        return _RowsView(self.a[first:last], None if self.b is None else self.b[first:last], offset)

    def move(self, n: int, lo: int, hi: int, k: int) -> None:
        """Slots lo..hi-1 of rows 0..n-1 moved k slots (right when k > 0)."""
        for buf in self.buffers():
            buf[:n, :, lo + k : hi + k] = buf[:n, :, lo:hi].clone()

    def copy_row(self, src: int, dst: int, end: int) -> None:
        for buf in self.buffers():
            buf[dst, :, :end] = buf[src, :, :end]


class Engine:
    """Decodes every submitted request in one running batch of up to ``max_batch`` rows, with up to ``max_queue``
    more waiting for a row. ``start()`` runs the loop on a background thread until ``close()``; without it the
    caller drives ``step()`` itself (one token boundary each), which gives tests a schedule of their own.

    ``context``: the slots a sequence may fill, prompt and continuation (None: the net's ``block_size``); a request
    stops with "length" there rather than sliding its window as ``generate`` would past ``block_size``."""

    def __init__(self, module_or_net, *, max_batch: int = 8, max_queue: int = 64, context: int | None = None) -> None:
        net = getattr(module_or_net, "net", module_or_net)
        if not isinstance(net, GPT):
            raise InputError(f"Engine serves a zoo GPT or a CausalLMModule, not {type(module_or_net).__name__}")
        if hasattr(net.rope_scaling, "long_after"):
            raise InputError(
                "Engine cannot batch a LongRoPE net (rope_type longrope, Phi-3's long contexts): its tables change "
                "with each sequence's length; decode it with zoo.gpt.generate"
            )
        context = net.block_size if context is None else context
        for name, value, ok, rule in (
            ("max_batch", max_batch, _is_int(max_batch) and max_batch >= 1, "1 or more"),
            ("max_queue", max_queue, _is_int(max_queue) and max_queue >= 1, "1 or more"),
            ("context", context, _is_int(context) and 2 <= context <= net.block_size, f"in [2, {net.block_size}]"),
        ):
            if not ok:
                raise InputError(f"Engine {name}={value!r} must be {rule}")
        self._modes = [(m, m.training) for m in net.modules()]  # what close() puts back
        self.net, self.max_batch, self.max_queue, self.context = net.eval(), max_batch, max_queue, context
        self.device, dtype = cache_placement(net)
        layouts = [block.attn.cache_layout() for block in net.blocks]
        _check_cache_memory(max_batch, context, layouts, self.device, dtype)
        self._cache = [SlotCache(max_batch, context, layout, self.device, dtype) for layout in layouts]
        self._rows: list[_Row] = []  # row i of every buffer is self._rows[i]'s
        self._slot = 0  # s
        self._waiting: deque[Request] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- the public side: any thread ------------------------------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Request:
        """Queue a request; it joins the running batch at the next token boundary with a free row. Raises
        ``QueueFull`` when ``max_queue`` requests already wait, ``InputError`` for a prompt the net cannot take."""
        ids = self._checked_prompt(prompt_ids)
        request = Request(ids, params)
        with self._wake:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests already wait (max_queue={self.max_queue}): retry")
            self._waiting.append(request)
            self._wake.notify()
        return request

    def start(self) -> None:
        with self._wake:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="zoo-engine", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop the loop after its current step; every request not finished ends "cancelled"; the net's modules are
        back in the train or eval mode each was in before the engine took it."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._wake:
            left = [*self._waiting, *(row.request for row in self._rows)]
            self._waiting.clear()
        self._rows.clear()
        for module, training in self._modes:  # each module's own flag: train() would reset its children's too
            module.training = training
        for request in left:
            request._finish("cancelled")

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def running(self) -> int:
        return len(self._rows)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _checked_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        ids = prompt_ids.tolist() if isinstance(prompt_ids, Tensor) else list(prompt_ids)
        v = self.net.vocab_size
        if not ids or not all(_is_int(i) and 0 <= i < v for i in ids):
            raise InputError(f"prompt_ids must be a non-empty list of token ids in [0, {v})")
        if len(ids) >= self.context:
            raise InputError(
                f"a prompt of {len(ids)} tokens leaves no room in the context of {self.context}: shorten it to at "
                f"most {self.context - 1} tokens"
            )
        return ids

    # -- the loop: one thread ---------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._waiting and not self._rows:
                    self._wake.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as error:  # a failed forward ends the requests it held, never the server
                log.exception("the decoding step failed; its requests end with finish_reason 'error'")
                for row in self._rows:
                    row.request._finish("error", error)
                self._rows.clear()
                self._slot = 0

    @torch.inference_mode()
    def step(self) -> bool:
        """One token boundary: cancelled rows leave, waiting requests join the free rows (prefilled in one forward,
        each one's first token drawn), one forward draws the next token of every running row, finished rows leave.
        Whether any request is still running or waiting."""
        self._sweep()
        with self._wake:
            joining = [self._waiting.popleft() for _ in range(min(len(self._waiting), self.max_batch - self.running))]
        for request in joining:
            if request._cancelled.is_set():
                request._finish("cancelled")
        joining = [r for r in joining if not r.done]
        try:
            self._join(joining)
        except Exception:  # the running rows are whole; the joiners retry one by one: only a prompt failing alone fails
            for request in joining:
                try:
                    self._join([request])
                except Exception as error:
                    log.exception("a request's prefill failed; it ends with finish_reason 'error'")
                    request._finish("error", error)
        self._sweep()
        if self._rows:
            self._decode()
            self._sweep()
        return bool(self._rows or self._waiting)

    def _join(self, requests: list[Request]) -> None:
        """Prefill ``requests`` together into rows n..n+k-1, left-padded as ``generate`` pads a batch: request j's
        prompt in slots s-L_j..s-1, so its row's padding is s - L_j; and draw each one's first token. One forward,
        however many join at once (a wave of clients after a wave of answers)."""
        if not requests:
            return
        lengths = [len(r.prompt_ids) for r in requests]
        length = max(lengths)  # the longest joiner's prompt ends just before slot s, at no padding
        if not self._rows:
            self._slot = length
        elif self._slot < length:
            self._move(length - self._slot)
        i, k, first = len(self._rows), len(requests), self._slot - length
        ids = torch.zeros(k, length, dtype=torch.long)
        for j, r in enumerate(requests):
            ids[j, length - lengths[j] :] = torch.tensor(r.prompt_ids)
        pad = torch.tensor([length - n for n in lengths], device=self.device)  # (k,): within the window from first
        window = [c.view(i, i + k, first) for c in self._cache]
        logits = self.net(ids.to(self.device), window, 0, pad if bool(pad.any()) else None)[:, -1]  # (k, V)
        firsts = logits.argmax(dim=-1).tolist()  # the greedy rows' first tokens
        rows = []  # every row made before any is taken, so a failure here leaves no joiner half in
        for j, request in enumerate(requests):
            p = request.params
            generator = torch.Generator(self.device)
            if p.seed is None:
                generator.seed()
            else:
                generator.manual_seed(p.seed)
            greedy = p.temperature <= 0 and p.repetition_penalty == 1
            rows.append(_Row(request, self._slot - lengths[j], generator, greedy))
        for j, row in enumerate(rows):
            self._rows.append(row)
            self._draw(row, logits[j : j + 1], firsts[j])

    def _decode(self) -> None:
        """One forward of every running row's newest token at slot s, and the next token of each."""
        rows, n = self._rows, len(self._rows)
        newest = torch.tensor([[row.request.tokens[-1]] for row in rows], device=self.device)  # (n, 1)
        pad = torch.tensor([row.pad for row in rows], device=self.device)  # (n,)
        pad = pad if bool(pad.any()) else None  # no padding (one row, say): generate's own unmasked call
        logits = self.net(newest, [c.view(0, n, 0) for c in self._cache], self._slot, pad)[:, -1]  # (n, V)
        self._slot += 1
        greedy = logits.argmax(dim=-1).tolist()  # one transfer for every greedy row
        for i, row in enumerate(rows):
            self._draw(row, logits[i : i + 1], greedy[i])

    def _draw(self, row: _Row, logits: Tensor, greedy: int | None = None) -> None:
        """Draw the row's next token from its logits (1, V) (a greedy row's is ``greedy`` where the batch's argmax
        gave it) and take it. A draw that fails (probabilities that overflow at a tiny temperature, say) ends this
        request alone, with "error"."""
        try:
            token = greedy if row.greedy and greedy is not None else self._sample(row, logits)
        except Exception as error:
            log.exception("sampling a request's next token failed; it ends with finish_reason 'error'")
            row.request._finish("error", error)
            return
        self._take(row, token)

    def _sample(self, row: _Row, logits: Tensor) -> int:
        """The next id from one row's logits (1, V), drawn as ``generate`` draws it with this row's settings."""
        p = row.request.params
        if p.repetition_penalty != 1:
            ids = torch.tensor([row.request.prompt_ids + row.request.tokens], device=logits.device)  # (1, L + g)
            logits = penalize_repetition(logits, ids, torch.ones_like(ids, dtype=torch.bool), p.repetition_penalty)
        top_k, top_p = p.top_k or None, p.top_p if p.top_p < 1 else None
        return int(sample_next(logits, p.temperature, top_k, top_p, row.generator)[0])

    def _take(self, row: _Row, token: int) -> None:
        """Yield ``token`` to the row's request, or end it: at a stop id, at max_new_tokens, or where the sequence
        fills the context (its next token would have no slot)."""
        request = row.request
        if token in request.params.stop_ids:
            request._finish("stop")
            return
        request._emit(token)
        full = len(request.prompt_ids) + len(request.tokens) == self.context
        if len(request.tokens) == request.params.max_new_tokens or full:
            request._finish("length")

    def _sweep(self) -> None:
        """Finished and cancelled rows leave (the last row moving into each); the rest move left by their smallest
        padding."""
        for row in self._rows:
            if row.request._cancelled.is_set():
                row.request._finish("cancelled")
        gone = [i for i, row in enumerate(self._rows) if row.request.done]
        for i in reversed(gone):  # every leaver after i is gone already, so the last row is a keeper (or i)
            last = len(self._rows) - 1
            if i != last:
                for c in self._cache:
                    c.copy_row(last, i, self._slot)
                self._rows[i] = self._rows[last]
            self._rows.pop()
        if not self._rows:
            self._slot = 0
        elif gone and (shift := min(row.pad for row in self._rows)):
            self._move(-shift)

    def _move(self, k: int) -> None:
        """Every running row moved k slots (right when k > 0): its padding and the slot s with it."""
        lo = min(row.pad for row in self._rows)
        for c in self._cache:
            c.move(len(self._rows), lo, self._slot, k)
        for row in self._rows:
            row.pad += k
        self._slot += k


def _check_cache_memory(
    rows: int, slots: int, layouts: list[tuple[int, int, int]], device: torch.device, dtype: torch.dtype
) -> None:
    """Refuse, before allocating it, a cache larger than all of ``device``'s memory."""
    per_token = sum(heads * (da + db) for heads, da, db in layouts)
    need, total = rows * slots * per_token * torch.finfo(dtype).bits // 8, device_memory(device)
    if total is not None and need > total:
        raise InputError(
            f"Engine max_batch={rows} x context={slots} needs {need / 2**30:,.1f} GiB of cache, more than the "
            f"{total / 2**30:,.1f} GiB of {device}: lower max_batch or context"
        )
