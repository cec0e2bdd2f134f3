"""Serving one model four ways, same weights, same machine, one run (issue 56): time to first token and aggregate
tokens/s at concurrency 1, 8 and 32 for

  (a) zoo       the zoo's server (``python -m zoo.gpt serve``: its engine decodes concurrent requests together),
  (b) hf-1      transformers' ``generate`` one request at a time behind the same HTTP layer (what a user writes by
                hand: a worker thread, a ``BaseStreamer`` for the tokens),
  (c) mlflow    ``mlflow models serve`` of the same model registered in MLflow (the zoo's pyfunc; no streaming, so
                its first token is its whole answer),
  (d) llama.cpp llama-cpp-python's OpenAI server on the same weights as GGUF at the same precision, where the package
                and its converter are installed (the row says so where they are not).

The model is a Llama-style folder written here with random weights (``--hidden``, ``--layers``), float32; every row
serves it from that folder or its registered copy. Each client sends a completion of ``--tokens`` greedy tokens
(``ignore_eos``-like: the prompts are chosen so that no row stops early; the tokens each row generated are counted,
not assumed). Aggregate tokens/s = all generated tokens / wall time from the first request to the last answer;
tokens per server CPU-second = the same tokens / the CPU time of the server's processes meanwhile (what the figure
would be on cores of its own; other jobs on a shared machine move it less than the wall figure). Each server runs in
a process of its own, as its users run it, and the clients in this one.

    python bench/serve.py                                   # the table (minutes on 2 CPU cores)
    python bench/serve.py --rows zoo,hf-1 --concurrency 1,8 --requests 16 --tokens 16   # a quick look
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench._common import cpu_model, table

ROWS = ("zoo", "hf-1", "mlflow", "llama.cpp")
PROMPTS = ["The quick brown fox", "Once upon a time", "def f(x):", "In the beginning", "A café in Paris"]


# -- the model ------------------------------------------------------------------------------------------------------


def write_folder(folder: Path, hidden: int, layers: int) -> Path:
    """A Llama-style model with random weights and a byte-level BPE trained here, as transformers saves them."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator(PROMPTS * 50 + [open(__file__).read()], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    hf.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=hf.get_vocab_size(),
            hidden_size=hidden,
            intermediate_size=hidden * 8 // 3,
            num_hidden_layers=layers,
            num_attention_heads=max(1, hidden // 64),
            num_key_value_heads=max(1, hidden // 128),
            max_position_embeddings=512,
            eos_token_id=hf.token_to_id("<|endoftext|>"),
            bos_token_id=None,
        )
    )
    model.save_pretrained(folder)
    return folder


# -- (b): transformers' generate behind the same engine interface ---------------------------------------------------


class HFEngine:
    """transformers' ``generate`` one request at a time, tokens streamed through a ``BaseStreamer``: the zoo
    server's engine interface, so the same HTTP layer serves it."""

    def __init__(self, folder: Path) -> None:
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.waiting: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def submit(self, prompt_ids, params):
        from zoo.gpt.serve.engine import Request

        request = Request(list(prompt_ids), params)
        self.waiting.put(request)
        return request

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.waiting.put(None)

    def _run(self) -> None:
        from transformers.generation.streamers import BaseStreamer

        while (request := self.waiting.get()) is not None:

            class Tokens(BaseStreamer):
                prompt_seen = False

                def put(self, value):
                    if not self.prompt_seen:  # generate hands the prompt over first
                        self.prompt_seen = True
                        return
                    if request._cancelled.is_set():
                        raise InterruptedError
                    for token in value.reshape(-1).tolist():
                        if token not in request.params.stop_ids:
                            request._emit(token)

                def end(self):
                    pass

            reason = "length"
            try:
                with torch.inference_mode():
                    self.model.generate(
                        torch.tensor([request.prompt_ids]),
                        max_new_tokens=request.params.max_new_tokens,
                        do_sample=False,
                        streamer=Tokens(),
                        eos_token_id=list(request.params.stop_ids),
                        pad_token_id=0,
                    )
            except InterruptedError:
                reason = "cancelled"
            request._finish(reason)


# -- the rows' servers ------------------------------------------------------------------------------------------------


def zoo_app(module, engine):
    from zoo.gpt.serve.api import Limits
    from zoo.gpt.serve.app import make_app, served

    context = module.net.block_size
    limits = Limits(max_tokens=context, max_prompt=context - 1, context=context, timeout=3600)
    return make_app(engine, served(module, "bench"), limits, threads=128)


def mlflow_server(module, folder: Path, port: int, work: Path, env: dict) -> subprocess.Popen:
    """The module registered as ``models:/bench/1`` in a store under ``work``, served by ``mlflow models serve``."""
    import lightning
    from mlflow.tracking import MlflowClient

    from zoo.tracking import log_checkpoint_model

    hparams = dict(module.hparams) | {"_class_path": "zoo.gpt.CausalLMModule"}
    ckpt = {
        "state_dict": module.state_dict(),
        "hyper_parameters": hparams,
        "pytorch-lightning_version": lightning.__version__,
    }
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, work / "bench.ckpt")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("bench", artifact_location=(work / "art").as_uri())).info.run_id
    log_checkpoint_model(work / "bench.ckpt", client, run, "bench")
    command = ["mlflow", "models", "serve", "-m", "models:/bench/1", "--env-manager", "local", "-p", str(port)]
    return subprocess.Popen(
        command, env=env | {"MLFLOW_TRACKING_URI": uri}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def llama_cpp_server(folder: Path, port: int, work: Path) -> subprocess.Popen | str:
    """llama-cpp-python's server of the folder as a float32 GGUF, or why not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed (pip install llama-cpp-python: no wheel for this platform)"
    converter = os.environ.get("LLAMA_CPP_CONVERT")  # llama.cpp's convert_hf_to_gguf.py
    if not converter:
        return "no GGUF converter: set LLAMA_CPP_CONVERT to llama.cpp's convert_hf_to_gguf.py"
    gguf = work / "bench-f32.gguf"
    subprocess.run([sys.executable, converter, str(folder), "--outtype", "f32", "--outfile", str(gguf)], check=True)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port), "--n_ctx", "512",
               "--model_alias", "bench", "--n_threads", str(torch.get_num_threads())]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- the clients ----------------------------------------------------------------------------------------------------


def one_request(port: int, i: int, tokens: int, openai_api: bool) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the end, tokens generated or -1 where the answer does not say) of
    prompt ``i``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    prompt = PROMPTS[i % len(PROMPTS)]
    start = time.perf_counter()
    if not openai_api:  # mlflow: the whole answer at once
        body = {"inputs": {"prompt": [prompt]}, "params": {"max_new_tokens": tokens, "temperature": 0.0}}
        conn.request("POST", "/invocations", json.dumps(body), {"Content-Type": "application/json"})
        text = json.loads(conn.getresponse().read())["predictions"][0]["completion"]
        end = time.perf_counter()
        assert isinstance(text, str)
        return end - start, end - start, -1  # its tokens: the same greedy continuation's, counted by the caller
    body = {"model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response, first, generated = conn.getresponse(), None, 0
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("choices") and event["choices"][0].get("text") and first is None:
            first = time.perf_counter() - start
        generated = (event.get("usage") or {}).get("completion_tokens", generated)
    conn.close()
    end = time.perf_counter() - start
    return first if first is not None else end, end, generated


def tree_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` and every process under it, children that ended included
    (mlflow's server runs its workers as children), from /proc; nan where there is none."""
    if pid is None:
        return float("nan")
    tick, stats = os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))  # ppid, u+s+cu+cs
    tree, total = {pid}, 0
    for _ in range(8):  # a few generations down
        tree |= {p for p, (ppid, _) in stats.items() if ppid in tree}
    total = sum(stats[p][1] for p in tree if p in stats)
    return total / tick if pid in stats else float("nan")


def measure(port: int, concurrency: int, requests: int, tokens: int, openai_api: bool, lengths: dict, pid) -> dict:
    one_request(port, 0, 4, openai_api)  # warm
    cpu, start = tree_cpu(pid), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: one_request(port, i, tokens, openai_api), range(requests)))
    wall, cpu = time.perf_counter() - start, tree_cpu(pid) - cpu
    ttft = sorted(r[0] for r in results)
    generated = sum(r[2] if r[2] >= 0 else lengths[PROMPTS[i % len(PROMPTS)]] for i, r in enumerate(results))
    return {"ttft_p50": statistics.median(ttft), "ttft_p99": ttft[min(len(ttft) - 1, round(0.99 * len(ttft)))],
            "tokens_per_s": generated / wall, "tokens": generated, "tokens_per_cpu_s": generated / cpu}  # fmt: skip


def wait_up(port: int, path: str, proc=None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"error: the server on port {port} exited ({proc.returncode})")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"error: nothing answered on port {port} within {timeout} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=0, help="requests per concurrency (default: 2 x it, >= 32)")
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens per request")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: PyTorch's)")
    ap.add_argument("--max-batch", type=int, default=32, help="the zoo engine's batch")
    ap.add_argument("--serve-hf", metavar="FOLDER", help=argparse.SUPPRESS)  # the hf-1 row's own process
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_hf:
        return serve_hf(args.serve_hf, args.port)
    rows = [r for r in args.rows.split(",") if r]
    if unknown := sorted(set(rows) - set(ROWS)):
        raise SystemExit(f"error: --rows {unknown[0]!r} is not one of {', '.join(ROWS)}")
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    from zoo.gpt import from_pretrained

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    folder = write_folder(work / "model", args.hidden, args.layers)
    module = from_pretrained(folder)
    # What a row that does not count its tokens generated: the same greedy continuation, up to a stop id.
    ids = [torch.tensor(module.tokenizer.encode(p)) for p in PROMPTS]
    ends = module.generate(ids, max_new_tokens=args.tokens, temperature=0)
    lengths = {p: len(e) for p, e in zip(PROMPTS, ends, strict=True)}
    print(
        f"# bench/serve.py: Llama-style {args.layers} layers x {args.hidden}, float32, {args.tokens} greedy tokens "
        f"per request; torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs"
    )
    print(f"# CPU: {cpu_model()}; load average at start: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    header = ["row", "concurrency", "requests", "TTFT p50 (s)", "TTFT p99 (s)", "tokens/s", "tokens/server CPU-s",
              "tokens"]  # fmt: skip
    lines, notes = [], []
    for row in rows:
        started = start_row(row, module, folder, work, args)
        if isinstance(started, str):
            notes.append(f"{row}: {started}")
            lines.append([row, "-", "-", "-", "-", "-", "-", "-"])
            continue
        port, stop, openai_api, pid = started
        try:
            for c in levels:
                n = args.requests or max(32, 2 * c)
                r = measure(port, c, n, args.tokens, openai_api, lengths, pid)
                lines.append([row, c, n, f"{r['ttft_p50']:.3f}", f"{r['ttft_p99']:.3f}", f"{r['tokens_per_s']:.1f}",
                              f"{r['tokens_per_cpu_s']:.1f}", r["tokens"]])  # fmt: skip
                print(" | ".join(map(str, lines[-1])), flush=True)
        finally:
            stop()
    print()
    print(table(header, lines))
    for note in notes:
        print(f"- {note}")
    if "mlflow" in rows:
        print("- mlflow streams nothing: its TTFT is its whole answer")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_row(row: str, module, folder: Path, work: Path, args):
    """``(port, stop, speaks OpenAI's API, process id)`` of the row's server, started in a process of its own (as its
    users run it: the clients' threads here take no CPU from its interpreter) and answering; or why it cannot run."""
    port = free_port()
    env = os.environ | ({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})
    if row == "zoo":
        command = [sys.executable, "-m", "zoo.gpt", "serve", str(folder), "--port", str(port), "--name", "bench",
                   "--max-batch", str(args.max_batch), "--max-queue", "256", "--timeout", "3600"]  # fmt: skip
    elif row == "hf-1":
        command = [sys.executable, __file__, "--serve-hf", str(folder), "--port", str(port)]
    if row in ("zoo", "hf-1"):
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        serve_row = mlflow_server if row == "mlflow" else None
        proc = serve_row(module, folder, port, work, env) if serve_row else llama_cpp_server(folder, port, work)
    if isinstance(proc, str):
        return proc

    def stop() -> None:
        proc.terminate()
        proc.wait(30)

    wait_up(port, "/ping" if row == "mlflow" else "/v1/models", proc)
    return port, stop, row != "mlflow", proc.pid


def serve_hf(folder: str, port: int) -> None:
    """The hf-1 row's server: transformers' generate one request at a time behind the zoo's HTTP layer."""
    from zoo.gpt import from_pretrained
    from zoo.gpt.serve.app import serve

    module = from_pretrained(folder)
    serve(zoo_app(module, HFEngine(Path(folder))), "127.0.0.1", port)


if __name__ == "__main__":
    main()
