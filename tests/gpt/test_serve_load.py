"""The server under load, bounded and local: many requests at once, one in ten malformed or from a client that leaves
mid-stream. Every good request is answered with its greedy ``generate`` reply, every bad one is a 4xx, and once the
load ends no request is left decoding (each the engine took has finished, the abandoned ones cancelled) and the
process's memory is flat between the halves of the run (the slow, 1,000-request pass)."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve import tiny_module

from zoo.gpt.serve.api import Limits
from zoo.gpt.serve.app import Background, Engine, make_app, served

PROMPTS = ["The cat", "A dog and a", "Once upon", "x"]
MAX_TOKENS = 4


class Recording:
    """The engine, keeping every request it was handed."""

    def __init__(self, engine) -> None:
        self.engine, self.requests, self.lock = engine, [], threading.Lock()

    def submit(self, prompt_ids, params):
        request = self.engine.submit(prompt_ids, params)
        with self.lock:
            self.requests.append(request)
        return request

    def start(self) -> None:
        self.engine.start()

    def close(self) -> None:
        self.engine.close()


def one(url: str, i: int) -> tuple[str, int, str | None]:
    """Request ``i``: every tenth a client that errs (odd tenths: bad JSON; even: leaves after the first event),
    the rest a completion, streamed every third time. Returns (kind, status, text)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS, "temperature": 0}
    try:
        if i % 10 == 0 and i % 20:
            conn.request("POST", "/v1/completions", b'{"model": "tiny", "prompt": ')
            return "bad", conn.getresponse().status, None
        stream = i % 3 == 0 or i % 10 == 0
        long = {"max_tokens": 80} if i % 10 == 0 else {}  # still decoding when its client leaves
        conn.request("POST", "/v1/completions", json.dumps(body | {"stream": stream} | long))
        response = conn.getresponse()
        if i % 10 == 0:  # reads the first event's start, then goes away
            response.read(6)
            conn.sock.close()
            return "left", response.status, None
        if not stream:
            return "good", response.status, json.loads(response.read())["choices"][0]["text"]
        events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return "good", response.status, "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    finally:
        conn.close()


def rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_load(total: int, concurrency: int) -> list[int]:
    module = tiny_module()
    want = dict(zip(PROMPTS, module.generate(PROMPTS, max_new_tokens=MAX_TOKENS, temperature=0), strict=True))
    # A step of at least 2 ms: a leaving client's 80 tokens then outlast the server's noticing it left (a tiny
    # net batched decodes them in less than the event loop's turn, and the test would see nothing cancelled).
    module.net.register_forward_hook(lambda *_: time.sleep(0.002))
    engine = Recording(Engine(module, max_batch=8, max_queue=64))
    app = make_app(engine, served(module, "tiny"), Limits(max_tokens=96, max_prompt=95, context=96))
    memory = []
    with Background(app) as url, ThreadPoolExecutor(concurrency) as pool:
        for half in range(2):
            results = list(pool.map(lambda i: one(url, i), range(half * total // 2, (half + 1) * total // 2)))
            for i, (kind, status, text) in enumerate(results, start=half * total // 2):
                if kind == "good":
                    assert status == 200 and text == want[PROMPTS[i % len(PROMPTS)]], (i, status, text)
                elif kind == "bad":
                    assert 400 <= status < 500, (i, status)
            memory.append(rss())
        deadline = time.monotonic() + 30
        while any(r.finish_reason is None for r in engine.requests) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(r.finish_reason is not None for r in engine.requests)
        assert any(r.finish_reason == "cancelled" for r in engine.requests)  # some clients left before the end
    return memory


def test_200_requests_at_concurrency_32_a_tenth_bad_all_answered_nothing_left(one_thread):
    run_load(200, 32)


@pytest.mark.slow  # ~1 minute on 2 cores
def test_1000_requests_at_concurrency_32_a_tenth_bad_all_answered_memory_flat(one_thread):
    first, second = run_load(1000, 32)
    assert second - first < 64 << 20, (first, second)
