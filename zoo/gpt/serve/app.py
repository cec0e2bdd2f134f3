"""The HTTP side of ``python -m zoo.gpt serve``: OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/models``, and ``/health``, on FastAPI and uvicorn, streamed as server-sent events.

Each choice is one ``Request`` of the engine (``zoo.gpt.serve.engine``: concurrent requests share its forward passes);
the engine's thread hands its tokens to the event loop (another engine's, iterated, through a bounded thread pool);
they become text through a ``TextStream`` (stop sequences cut, never sent in part) and leave as they come. A request
is checked whole before anything is submitted (``zoo.gpt.serve.api``): a bad one is a 4xx in OpenAI's error shape
naming the field; a full queue is 429; past ``Limits.timeout`` the choices are cancelled and the answer is 503
(streamed: an error event). A client that goes away cancels its requests, so their slots free at the next token.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.responses import StreamingResponse

from zoo.errors import InputError
from zoo.gpt.serve.api import APIError, Call, Defaults, Limits, parse, parse_json, token_budget
from zoo.gpt.serve.chat import ToolCallStream, prompt_ids, tool_calls
from zoo.gpt.serve.engine import Engine, QueueFull, SamplingParams  # noqa: F401
from zoo.gpt.serve.text import TextStream
from zoo.io.chat_template import tool_call_syntax
from zoo.io.tool_calls import Syntax


@dataclass(frozen=True)
class Served:
    """What the server needs of a model beside its engine: the name clients call it by, its tokenizer (with the chat
    template and stop ids), its generation defaults."""

    name: str
    tokenizer: Any
    defaults: Defaults
    stop_ids: tuple[int, ...]


def served(module, name: str) -> Served:
    """A ``CausalLMModule``'s serving facts: its tokenizer and its ``generation`` (a folder's generation_config.json,
    or what the registered model was trained with) as the defaults."""
    from zoo.gpt.generate import Generation

    if module.tokenizer is None:
        raise ValueError(f"{name} has no tokenizer: serve a checkpoint fitted on text or an imported folder")
    g = Generation.of(module.hparams.get("generation") or Generation())
    defaults = Defaults(g.max_new_tokens, g.temperature, g.top_p or 1.0, g.top_k or 0, g.repetition_penalty)
    return Served(name, module.tokenizer, defaults, tuple(module.tokenizer.stop_ids))


@dataclass
class Choice:
    request: Any
    text: TextStream
    prompt_tokens: int


def make_app(engine, model: Served, limits: Limits, threads: int = 96) -> FastAPI:
    """The FastAPI app serving ``model`` through ``engine`` (started and closed with the app). ``threads``: choices
    waiting for their next token at once (one thread each; as many as the engine holds, running and queued)."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="zoo-serve-tokens")
    syntax = tool_call_syntax(model.tokenizer)  # how its replies write a call: tags, or Llama 3's bare JSON

    @asynccontextmanager
    async def lifespan(_app):
        engine.start()
        try:
            yield
        finally:
            engine.close()
            pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="the zoo", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def refused(_request, err: APIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def http_error(_request, err: HTTPException):
        return JSONResponse(
            APIError(str(err.detail), code=str(err.status_code), status=err.status_code).body(),
            status_code=err.status_code,
        )

    @app.exception_handler(Exception)
    async def crashed(_request, err: Exception):
        return JSONResponse(APIError(f"the server failed: {type(err).__name__}", status=500).body(), status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model.name, "object": "model", "created": 0, "owned_by": "zoo"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await answer(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    async def answer(request, chat: bool):
        arrived = time.monotonic()
        call = parse(parse_json(await _body(request, limits.max_body)), chat, limits, model.defaults)
        if call.model != model.name:
            raise APIError(
                f"The model {call.model!r} does not exist: this server serves {model.name!r}",
                "model",
                "model_not_found",
                status=404,
            )
        choices = await asyncio.to_thread(submit, call, chat)  # a template render and tokenizing: off the loop
        deadline = arrived + limits.timeout
        events = _events(choices, pool, deadline)
        if call.stream:
            return EventStream(_sse(call, chat, choices, events, model.name, syntax), media_type="text/event-stream")
        watcher = asyncio.create_task(_cancel_on_disconnect(request, choices))
        try:
            async for _ in events:
                pass
        finally:
            watcher.cancel()
        return _whole(call, chat, choices, model.name, syntax)

    def submit(call: Call, chat: bool) -> list[Choice]:
        if chat:
            ids = prompt_ids(model.tokenizer, call.messages, call.tools)
            prompts, param = [ids] * call.n, "messages"
        else:
            encoded = [p if isinstance(p, list) else model.tokenizer.encode(p) for p in call.prompts]
            if any(t >= model.tokenizer.vocab_size or t < 0 for p in encoded for t in p):
                raise APIError("prompt holds a token id outside the vocabulary", "prompt", "invalid_value")
            prompts, param = [p for p in encoded for _ in range(call.n)], "prompt"
        if any(not p for p in prompts):
            raise APIError(f"{param} renders to no tokens", param, "invalid_value")
        budgets = [token_budget(call, len(p), limits, model.defaults, param) for p in prompts]
        choices = []
        for i, (ids, budget) in enumerate(zip(prompts, budgets, strict=True)):
            params = SamplingParams(
                max_new_tokens=budget,
                temperature=call.temperature,
                top_p=call.top_p,
                top_k=call.top_k,
                repetition_penalty=call.repetition_penalty,
                stop_ids=model.stop_ids,
                seed=None if call.seed is None else call.seed + i % call.n,  # each choice its own draw
            )
            try:
                request = engine.submit(ids, params)
            except InputError as err:  # what the engine refuses of a prompt the checks above let through
                for c in choices:
                    c.request.cancel()
                raise APIError(str(err), param, "invalid_value") from None
            except QueueFull:
                for c in choices:
                    c.request.cancel()
                raise APIError("the server is busy: its queue is full; retry later", None, "queue_full", status=429,
                               kind="rate_limit_exceeded") from None  # fmt: skip
            choices.append(Choice(request, TextStream(model.tokenizer, call.stops), len(ids)))
        return choices

    return app


async def _body(request, limit: int) -> bytes:
    """The request's body, refused past ``limit`` bytes before it is all read."""
    length = request.headers.get("content-length") or "0"
    if not length.isdigit() or int(length) > limit:
        raise APIError(f"the body is more than {limit} bytes", None, "body_too_large", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(f"the body is more than {limit} bytes", None, "body_too_large", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


_DONE = object()


async def _events(choices: list[Choice], pool, deadline: float) -> AsyncIterator[tuple[int, str, str | None]]:
    """``(choice index, text piece, finish reason or None)`` as the choices' tokens come, in the order they come; a
    choice's last event has its finish reason. Cancels every choice left when it ends early (a client gone, the
    deadline), so the engine frees their slots."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        tokens = iter(choices[i].request)
        try:
            while (token := await loop.run_in_executor(pool, next, tokens, _DONE)) is not _DONE:
                queue.put_nowait((i, token))
        except Exception:  # the engine failed on this request: its finish_reason says so, the answer is a 500
            pass
        queue.put_nowait((i, _DONE))

    def listener(i: int):
        def hand_over(token: int | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (i, _DONE if token is None else token))
            except RuntimeError:  # the loop closed (the server stopped): nobody is waiting for this request
                pass

        return hand_over

    pumps = []
    for i, choice in enumerate(choices):
        if hasattr(choice.request, "listen"):  # the engine's requests: handed over by its own thread
            choice.request.listen(listener(i))
        else:  # another engine's (a blocking iterator): a pool thread waits on each token
            pumps.append(asyncio.create_task(pump(i)))
    left = len(choices)
    try:
        while left:
            try:
                i, token = await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise APIError("the request ran past the server's timeout", None, "timeout", status=503) from None
            choice = choices[i]
            if token is _DONE:
                left -= 1
                reason = "stop" if choice.text.stopped else choice.request.finish_reason
                if reason not in ("stop", "length"):
                    raise APIError(f"a choice ended without an answer ({reason})", None, "engine", status=500)
                yield i, choice.text.flush(), reason
            elif piece := choice.text.push(token):
                yield i, piece, None
            if choice.text.stopped:
                choice.request.cancel()  # the rest is not wanted: its slot frees at the next token
    finally:
        for c in choices:
            c.request.cancel()
        for p in pumps:
            p.cancel()


async def _cancel_on_disconnect(request, choices: list[Choice]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for c in choices:
        c.request.cancel()


def _usage(choices: list[Choice], n: int) -> dict:
    prompt = sum(c.prompt_tokens for c in choices[::n])  # each prompt once, however many choices it has
    completion = sum(len(c.text.ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _whole(call: Call, chat: bool, choices: list[Choice], name: str, syntax: Syntax = "hermes") -> dict:
    """The non-streamed answer."""
    out = []
    for i, c in enumerate(choices):
        reason = "stop" if c.text.stopped else c.request.finish_reason
        if not chat:
            out.append({"index": i, "text": c.text.text, "finish_reason": reason, "logprobs": None})
            continue
        message: dict = {"role": "assistant", "content": c.text.text}
        if call.tools:
            message["content"], calls = tool_calls(c.text.text, syntax)
            if calls:
                message["tool_calls"], reason = calls, "tool_calls"
        out.append({"index": i, "message": message, "finish_reason": reason, "logprobs": None})
    kind = "chat.completion" if chat else "text_completion"
    return {"id": _id(chat), "object": kind, "created": int(time.time()), "model": name, "choices": out,
            "usage": _usage(choices, call.n)}  # fmt: skip


async def _sse(
    call: Call, chat: bool, choices: list[Choice], events, name: str, syntax: Syntax = "hermes"
) -> AsyncIterator[str]:
    """The streamed answer as server-sent events: a role delta per choice, its text deltas, its finish reason, the
    usage when asked, ``[DONE]``. With ``tools`` a chat choice's text streams until a call opens, then each call as a
    ``tool_calls`` delta once its block closes (``ToolCallStream``)."""
    head = {"id": _id(chat), "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": name}  # fmt: skip

    def event(i: int, delta: str | dict, reason: str | None) -> str:
        choice = {"index": i, "delta": delta} if chat else {"index": i, "text": delta}
        return f"data: {json.dumps(head | {'choices': [choice | {'finish_reason': reason, 'logprobs': None}]})}\n\n"

    tools = [ToolCallStream(syntax) for _ in choices] if chat and call.tools else None
    try:
        if chat:
            for i in range(len(choices)):
                yield event(i, {"role": "assistant", "content": ""}, None)
        async for i, piece, reason in events:
            if tools:
                for delta in tools[i].push(piece):
                    yield event(i, delta, None)
                if reason is not None:
                    deltas, called = tools[i].end()
                    for delta in deltas:
                        yield event(i, delta, None)
                    yield event(i, {}, "tool_calls" if called else reason)
                continue
            if piece:
                yield event(i, {"content": piece} if chat else piece, None)
            if reason is not None:
                yield event(i, {} if chat else "", reason)
        if call.include_usage:
            yield f"data: {json.dumps(head | {'choices': [], 'usage': _usage(choices, call.n)})}\n\n"
    except APIError as err:  # after the 200 went out: the error as the stream's last event
        yield f"data: {json.dumps(err.body())}\n\n"
    yield "data: [DONE]\n\n"


def _id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


class EventStream(StreamingResponse):
    """Closes its events however the response ends (a client gone mid-stream included), which cancels the choices
    still decoding."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def serve(app: FastAPI, host: str, port: int) -> None:
    """``app`` on ``host:port`` until Ctrl-C or SIGTERM."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)


class Background:
    """``app`` served by uvicorn in a thread of this process (tests, the bench): ``with Background(app) as url``."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import socket

        import uvicorn

        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="zoo-serve-http", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
