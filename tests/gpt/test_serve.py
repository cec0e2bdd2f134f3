"""``python -m zoo.gpt serve`` through the clients people use: the ``openai`` package streams and fetches chat and text
completions whose greedy answers are ``generate``'s, ``n`` choices, stop sequences cut and never streamed in part, a
tool call there and back in the model's own template (ids equal to transformers'), conversations with earlier
assistant turns in every template family the README lists; raw requests for what a client gets wrong (each a 4xx in
OpenAI's error shape naming the field); a full queue, a timeout and a client that goes away mid-stream free their
requests. A server runs in a thread of the test process on a free port."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from zoo.gpt import GPT, CausalLMModule
from zoo.gpt.serve import server_for
from zoo.gpt.serve.api import Defaults, Limits
from zoo.gpt.serve.app import Background, QueueFull, Served, make_app
from zoo.gpt.serve.chat import prompt_ids, tool_calls
from zoo.gpt.serve.text import TextStream
from zoo.io.tokenizers import ByteTokenizer

openai = pytest.importorskip("openai")

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12+30?"}]
CHAT_IDS = ByteTokenizer().encode("<|system|>\nBe brief.\n<|user|>\nWhat is 12+30?\n<|assistant|>\n")
SETTINGS = dict(max_batch=4, max_queue=16, max_tokens_cap=None, max_prompt_tokens=None, max_n=4, timeout=60.0)


def tiny_module(block_size: int = 96) -> CausalLMModule:
    torch.manual_seed(0)
    module = CausalLMModule(GPT(vocab_size=257, block_size=block_size, n_layer=1, n_embd=16, n_head=2))
    with torch.no_grad():  # large random weights: replies that differ from prompt to prompt, in ASCII
        for p in module.net.parameters():
            p.normal_(0, 0.5)
        module.net.lm_head.weight[128:] = 0
    module.tokenizer = ByteTokenizer()
    return module.eval()


@pytest.fixture(scope="module")
def module() -> CausalLMModule:
    return tiny_module()


@pytest.fixture(scope="module")
def url(module):
    app, _ = server_for(module, "tiny", SimpleNamespace(**SETTINGS))
    with Background(app) as url:
        yield url


def client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def generated(module, ids, **settings) -> str:
    (out,) = module.generate([torch.tensor(ids)], **settings)
    return module.tokenizer.decode(out.tolist())


def test_greedy_chat_equals_generate_whole_and_streamed(module, url):
    want = generated(module, module.chat_prompt(CHAT).tolist(), max_new_tokens=12, temperature=0)
    c = client(url)
    whole = c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    assert whole.choices[0].message.content == want and whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(module.chat_prompt(CHAT)), 12)
    stream = c.chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_completion_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(pieces) > 1 and "".join(pieces) == want
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_text_completion_of_several_prompts_equals_generate(module, url):
    prompts = ["The cat", "A dog and a"]
    answer = client(url).completions.create(model="tiny", prompt=prompts, max_tokens=7, temperature=0)
    assert [c.text for c in answer.choices] == module.generate(prompts, max_new_tokens=7, temperature=0)
    assert answer.usage.prompt_tokens == sum(len(p.encode()) for p in prompts)


def test_n_sampled_choices_differ_and_a_seed_repeats_them_whole_and_streamed(url):
    ask = dict(model="tiny", messages=CHAT, max_tokens=10, temperature=1.0, n=3, seed=7)
    answer = client(url).chat.completions.create(**ask)
    first = [c.message.content for c in answer.choices]
    assert answer.usage.prompt_tokens == len(CHAT_IDS) and answer.usage.completion_tokens == 30  # the prompt once
    again = [c.message.content for c in client(url).chat.completions.create(**ask).choices]
    assert first == again and len(set(first)) == 3
    streamed = ["", "", ""]
    for chunk in client(url).chat.completions.create(**ask, stream=True):
        streamed[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert streamed == first


def test_a_stop_sequence_cuts_the_reply_and_is_never_streamed_in_part(module, url):
    want = generated(module, module.chat_prompt(CHAT).tolist(), max_new_tokens=16, temperature=0)
    stop = want[5:8]
    cut = want[: want.find(stop)]
    c = client(url)
    whole = c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=16, temperature=0, stop=[stop, "\x00"])
    assert whole.choices[0].message.content == cut and whole.choices[0].finish_reason == "stop"
    chunks = list(
        c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=16, temperature=0, stop=stop, stream=True)
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


class _Letters:
    """One character per id: decode is the letters joined."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_the_text_stream_holds_a_possible_stop_start_and_releases_it_when_no_stop_follows():
    text = TextStream(_Letters(), ["STOP", "xy"])
    sent = [text.push(ord(ch)) for ch in "abSTxSTOPzz"]
    assert sent == ["a", "b", "", "", "ST", "x", "", "", "", "", ""] and text.stopped and text.text == "abSTx"
    text = TextStream(_Letters(), ["STOP"])
    assert [text.push(ord(ch)) for ch in "aST"] == ["a", "", ""] and text.flush() == "ST" and not text.stopped
    text = TextStream(_Letters(), ["xyz"])
    assert [text.push(ord(ch)) for ch in "axyxyz"] == ["a", "", "", "xy", "", ""] and text.text == "axy"


# -- raw requests: what a client gets wrong -------------------------------------------------------------------------


def raw(url: str, path: str, body: bytes | str | dict | None, method: str = "POST") -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    data = json.dumps(body) if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    status, payload = response.status, json.loads(response.read() or b"null")
    conn.close()
    return status, payload


GOOD = {"model": "tiny", "messages": CHAT, "max_tokens": 2}
BAD = [  # (body, status, the field the error names)
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({**GOOD, "temperature": "hot"}, 400, "temperature"),
    ({**GOOD, "temperature": 2.5}, 400, "temperature"),
    ({**GOOD, "top_p": 0}, 400, "top_p"),
    ({**GOOD, "n": 1.5}, 400, "n"),
    ({**GOOD, "n": 99}, 400, "n"),
    ({**GOOD, "max_tokens": True}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": 10**9}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": 90}, 400, "max_tokens"),  # fits the cap, not beside this prompt in the context
    ({**GOOD, "messages": "hi"}, 400, "messages"),
    ({**GOOD, "messages": []}, 400, "messages"),
    ({**GOOD, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    ({**GOOD, "messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content"),
    ({**GOOD, "messages": [{"role": "user", "content": "x" * 200}]}, 400, "messages"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({**GOOD, "stop": 3}, 400, "stop"),
    ({**GOOD, "stream": "yes"}, 400, "stream"),
    ({**GOOD, "seed": "x"}, 400, "seed"),
    ({**GOOD, "logprobs": True}, 400, "logprobs"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),  # the default format
    ({**GOOD, "temprature": 0.5}, 400, "temprature"),
    ({**GOOD, "model": "gpt-4o"}, 404, "model"),
    ({k: v for k, v in GOOD.items() if k != "model"}, 400, "model"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_malformed_request_is_a_4xx_in_openais_shape_naming_the_field(url, body, status, param):
    got, payload = raw(url, "/v1/chat/completions", body)
    assert got == status, payload
    assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["param"] == param and payload["error"]["message"]


def test_completions_unknown_routes_and_methods_answer_in_openais_shape(url):
    assert raw(url, "/v1/completions", {"model": "tiny", "prompt": [300]})[1]["error"]["param"] == "prompt"
    assert raw(url, "/v1/completions", {"model": "tiny", "prompt": "a", "echo": True})[1]["error"]["param"] == "echo"
    for path, method, status in (("/v1/engines", "GET", 404), ("/v1/chat/completions", "GET", 405)):
        got, payload = raw(url, path, None, method)
        assert got == status and set(payload["error"]) == {"message", "type", "param", "code"}
    assert raw(url, "/health", None, "GET") == (200, {"status": "ok"})


# -- an engine that answers from a script: tool calls, a full queue, timeouts, clients that leave ------------------


class Scripted:
    """An engine with the server's interface that answers every request with ``reply`` (token ids), ``delay`` seconds
    a token; it keeps the prompts it was given and the requests it made."""

    def __init__(self, reply: list[int], delay: float = 0.0, max_queue: int = 64, gate=None) -> None:
        self.reply, self.delay, self.max_queue = reply, delay, max_queue
        self.gate = gate or threading.Event()
        if gate is None:
            self.gate.set()
        self.prompts: list[list[int]] = []
        self.requests: list[ScriptedRequest] = []

    def submit(self, prompt_ids, params):
        if sum(r.finish_reason is None for r in self.requests) >= self.max_queue:
            raise QueueFull("full")
        self.prompts.append(list(prompt_ids))
        self.requests.append(ScriptedRequest(self.reply[: params.max_new_tokens], self.delay, self.gate))
        return self.requests[-1]

    def start(self) -> None:
        pass

    def close(self) -> None:
        for r in self.requests:
            r.cancel()


class ScriptedRequest:
    def __init__(self, tokens: list[int], delay: float, gate: threading.Event) -> None:
        self.tokens, self.delay, self.gate = tokens, delay, gate
        self.finish_reason = None
        self.cancelled = threading.Event()

    def __iter__(self):
        for token in self.tokens:
            while not self.gate.wait(0.01) and not self.cancelled.is_set():
                pass
            if self.cancelled.wait(self.delay):
                self.finish_reason = "cancelled"
                return
            yield token
        self.finish_reason = "length"

    def cancel(self) -> None:
        self.cancelled.set()


def scripted_app(engine, tokenizer=None, **limits):
    model = Served("tiny", tokenizer or ByteTokenizer(), Defaults(), (256,))
    return make_app(engine, model, Limits(**{"max_tokens": 64, "max_prompt": 200, "context": 256} | limits))


def test_a_full_queue_is_429_and_a_request_past_the_timeout_is_503_and_cancelled():
    engine = Scripted(list(b"held reply"), max_queue=1, gate=threading.Event())  # no token until the gate opens
    with Background(scripted_app(engine, timeout=1.5)) as url:
        held = ThreadPoolExecutor(1).submit(raw, url, "/v1/chat/completions", GOOD)
        while not engine.requests:
            time.sleep(0.01)
        status, payload = raw(url, "/v1/chat/completions", GOOD)
        assert status == 429 and payload["error"]["code"] == "queue_full"
        status, payload = held.result()
        assert status == 503 and payload["error"]["code"] == "timeout"
    assert len(engine.requests) == 1 and engine.requests[0].finish_reason == "cancelled"


def test_a_body_past_the_limit_is_413_before_anything_is_submitted():
    engine = Scripted(list(b"reply"))
    with Background(scripted_app(engine, max_body=200)) as url:
        status, payload = raw(
            url, "/v1/chat/completions", GOOD | {"messages": [{"role": "user", "content": "x" * 300}]}
        )
    assert status == 413 and payload["error"]["code"] == "body_too_large" and not engine.requests


def test_a_choice_that_meets_its_stop_sequence_is_cancelled_at_once():
    engine = Scripted(list(b"abc STOP and much more that nobody wants to wait for"), delay=0.02)
    with Background(scripted_app(engine)) as url:
        answer = client(url).chat.completions.create(model="tiny", messages=CHAT, max_tokens=50, stop="STOP")
        assert answer.choices[0].message.content == "abc " and answer.choices[0].finish_reason == "stop"
        assert engine.requests[0].cancelled.is_set() and engine.requests[0].finish_reason == "cancelled"


def test_a_client_that_leaves_mid_stream_cancels_its_request():
    engine = Scripted(list(b"a long slow reply that nobody reads"), delay=0.05)
    with Background(scripted_app(engine)) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/v1/chat/completions", json.dumps(GOOD | {"stream": True, "max_tokens": 30}))
        response = conn.getresponse()
        assert response.status == 200 and response.read(6) == b"data: "
        conn.sock.close()
        conn.close()
        deadline = time.monotonic() + 10
        # the request's own thread names why it ended once it sees the cancel (up to one delay later)
        while engine.requests[0].finish_reason is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.requests[0].cancelled.is_set() and engine.requests[0].finish_reason == "cancelled"


# -- chat templates: tools there and back, earlier assistant turns -------------------------------------------------

transformers = pytest.importorskip("transformers")
TEMPLATES = Path(pytest.importorskip("trl").__file__).parent / "chat_templates"
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "<|start_of_role|>",
    "<|end_of_role|>",
    "<|end_of_text|>",
]
FAMILIES = {  # a template per family of the README's list: (its file in TRL or in templates/ here, bos, eos)
    "qwen2.5": ("qwen2_5.jinja", None, "<|im_end|>"),
    "qwen3": ("qwen3.jinja", None, "<|im_end|>"),
    "deepseek_v3": ("deepseekv3.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "llama3": ("llama3_2.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "phi3": ("phi3.jinja", None, "<|end|>"),
    "gemma3": ("gemma3.jinja", "<bos>", "<end_of_turn>"),
    "gemma2": ("gemma.jinja", "<bos>", "<end_of_turn>"),  # Gemma 1 and 2's (no system turn)
    # The published templates TRL does not ship, stored here: Mistral Small 3.1 (mistralai/Mistral-Small-3.1-24B-
    # Instruct-2503, as llama.cpp's models/templates stores it), SmolLM3 (HuggingFaceTB/SmolLM3-3B, as swift-jinja's
    # test templates store it), OLMo 2 (allenai/OLMo-2-1124-7B-Instruct's tokenizer_config.json), Granite 3.0
    # (ibm-granite/granite-3.0-8b-instruct, as llama.cpp's tests/test-chat-template.cpp stores it).
    "mistral": ("templates/mistral_small3.1_instruct.jinja", "<s>", "</s>"),
    "smollm3": ("templates/smollm3.jinja", None, "<|im_end|>"),
    "olmo2": ("templates/olmo2_instruct.jinja", "<|endoftext|>", "<|endoftext|>"),
    "granite": ("templates/granite3.0_instruct.jinja", "<|end_of_text|>", "<|end_of_text|>"),
    # Llama 2 chat (meta-llama/Llama-2-7b-chat-hf's, as several public copies agree) and Mistral 7B Instruct v0.2
    # (as llama.cpp's tests/test-chat-template.cpp stores it: no system turn), the older [INST] formats.
    "llama2": ("templates/llama2_chat.jinja", "<s>", "</s>"),
    "mistral7b": ("templates/mistral_7b_instruct_v0.2.jinja", "<s>", "</s>"),
}
TURNS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4, of course."},
    {"role": "user", "content": "And  3+3?  日本"},
    {"role": "assistant", "content": "6."},
    {"role": "user", "content": "Thanks!"},
]


def template_folder(folder: Path, family: str) -> Path:
    from test_gpt_pretrained import _byte_level, _train

    file, bos, eos = FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    _train(_byte_level(True), SPECIALS, 420).save(str(folder / "tokenizer.json"))
    template = (TEMPLATES / file if "/" not in file else Path(__file__).parent / file).read_text()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "chat_template": template}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_a_conversation_with_earlier_assistant_turns_renders_transformers_ids(tmp_path, family):
    from zoo.io.hf_tokenizer import from_folder

    folder = template_folder(tmp_path, family)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    turns = TURNS[1:] if family.startswith("gemma") or family == "mistral7b" else TURNS
    expected = theirs.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert prompt_ids(from_folder(folder), turns) == expected


INTEGERS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": INTEGERS}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_a_tool_call_goes_there_and_back_in_the_templates_own_format(tmp_path):
    """The model (scripted) answers with a Qwen2.5 ``<tool_call>`` block: the client gets a tool call; the
    conversation sent back with the call and the tool's answer renders transformers' ids."""
    from zoo.io.hf_tokenizer import from_folder

    folder = template_folder(tmp_path, "qwen2.5")
    ours, theirs = from_folder(folder), transformers.AutoTokenizer.from_pretrained(folder)
    engine = Scripted(ours.encode(CALL))
    messages = [{"role": "user", "content": "What is 2+3?"}]
    with Background(scripted_app(engine, ours, max_tokens=400, max_prompt=4000, context=4096)) as url:
        c = client(url)
        answer = c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=300)
        (call,) = answer.choices[0].message.tool_calls
        assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.content is None
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
        ask = dict(model="tiny", messages=messages, tools=TOOLS, max_tokens=300)
        streamed = list(c.chat.completions.create(**ask, stream=True))
        (delta,) = [ch.choices[0].delta for ch in streamed if ch.choices[0].delta.tool_calls]
        assert delta.tool_calls[0].function.name == "add" and streamed[-1].choices[0].finish_reason == "tool_calls"
        back = [
            *messages,
            answer.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        c.chat.completions.create(model="tiny", messages=back, tools=TOOLS, max_tokens=300)
    expected = [
        *messages,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
    ]
    for sent, conversation in ((engine.prompts[0], messages), (engine.prompts[-1], expected)):
        want = theirs.apply_chat_template(conversation, tools=TOOLS, add_generation_prompt=True, tokenize=True)
        assert sent == want["input_ids"]


def test_a_streamed_reply_with_tools_sends_its_text_as_it_comes_then_each_call_as_openai_streams_them(tmp_path):
    from zoo.io.hf_tokenizer import from_folder

    ours = from_folder(template_folder(tmp_path, "qwen2.5"))
    second = CALL.replace('"a": 2', '"a": 7')
    reply = f"Let me add  both.\n{CALL}\n<tool_call>not json</tool_call>{second} Done."
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Add."}], tools=TOOLS, max_tokens=300)
    with Background(
        scripted_app(Scripted(ours.encode(reply)), ours, max_tokens=400, max_prompt=4000, context=4096)
    ) as url:
        c = client(url)
        whole = c.chat.completions.create(**ask).choices[0]
        chunks = [ch.choices[0] for ch in c.chat.completions.create(**ask, stream=True)]
    texts = [ch.delta.content for ch in chunks if ch.delta.content]
    calls: dict[int, dict] = {}
    for ch in chunks:
        for d in ch.delta.tool_calls or []:
            got = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            got["id"] += d.id or ""
            got["name"] += d.function.name or ""
            got["arguments"] += d.function.arguments or ""
    assert whole.finish_reason == chunks[-1].finish_reason == "tool_calls"
    assert "".join(texts) == whole.message.content == "Let me add  both.\n\n<tool_call>not json</tool_call> Done."
    first_call = next(k for k, ch in enumerate(chunks) if ch.delta.tool_calls)
    before = [ch.delta.content for ch in chunks[:first_call] if ch.delta.content]
    assert len(before) > 3 and "".join(before) == "Let me add  both."  # streamed as it came, before the calls
    want = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert [(calls[k]["name"], calls[k]["arguments"]) for k in sorted(calls)] == want and len(want) == 2
    assert all(v["id"].startswith("call_") for v in calls.values())


@pytest.mark.parametrize(
    "pieces, content, calls",
    [
        (["Hi <tool", "_c", "all>", '{"name": "add", "arguments": {}}', "</tool_call>"], ["Hi"], 1),
        (["a <", "b"], ["a", " <b"], 0),  # a held tag start that was not one goes out
        (["Hi \n", CALL, "\n"], ["Hi"], 1),  # the whitespace before a call: the whole answer strips it
        (["x\n\n", "<tool_call>", "{}</tool_call>"], ["x", "\n\n<tool_call>{}</tool_call>"], 0),  # no call
    ],
)
def test_a_tool_call_stream_holds_only_what_may_open_a_call(pieces, content, calls):
    from zoo.gpt.serve.chat import ToolCallStream

    stream, deltas = ToolCallStream(), []
    for piece in pieces:
        deltas += stream.push(piece)
    last, called = stream.end()
    deltas += last
    assert [d["content"] for d in deltas if "content" in d] == content
    assert sum("tool_calls" in d for d in deltas) == calls and called == bool(calls)
    text = "".join(pieces)
    assert "".join(content) == (tool_calls(text)[0] or "")


def test_tool_call_blocks_that_are_not_calls_stay_text():
    assert tool_calls("no calls") == ("no calls", [])
    content, calls = tool_calls(f"Let me add.\n{CALL}\n<tool_call>not json</tool_call>")
    assert content == "Let me add.\n\n<tool_call>not json</tool_call>" and len(calls) == 1
