"""bench/serve.py's CPU-cheap parts: its refusals before any model is written, and the transformers engine behind
the zoo's HTTP layer answering a request with ``generate``'s greedy tokens."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "bench" / "serve.py")
bench = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_an_unknown_row_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(bench, "write_folder", lambda *a: pytest.fail("wrote a model before checking its arguments"))
    with pytest.raises(SystemExit, match="'vllm' is not one of zoo, hf-1, mlflow, llama.cpp"):
        bench.main(["--rows", "zoo,vllm"])


def test_the_transformers_engine_streams_generates_greedy_tokens(tmp_path):
    transformers = pytest.importorskip("transformers")
    from zoo.gpt.serve.engine import SamplingParams

    folder = bench.write_folder(tmp_path, 64, 1)
    engine = bench.HFEngine(folder)
    engine.start()
    prompt = [5, 9, 2]
    request = engine.submit(prompt, SamplingParams(max_new_tokens=6, temperature=0))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    want = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 3:]
    assert list(request) == want.tolist() and request.finish_reason == "length"
    engine.close()


def test_a_servers_cpu_time_counts_its_children():
    import math
    import os
    import subprocess
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass\ninput()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        before, deadline = bench.tree_cpu(os.getpid()), time.monotonic() + 60
        while bench.tree_cpu(child.pid) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert bench.tree_cpu(child.pid) >= 0.25  # its own CPU time
        assert bench.tree_cpu(os.getpid()) >= before + 0.25  # the busy child counted with this process
    finally:
        child.communicate(b"\n", timeout=30)
    assert math.isnan(bench.tree_cpu(None))
