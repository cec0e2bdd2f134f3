"""The serve commands as a user types them: ``python -m zoo.gpt serve <folder | checkpoint>`` and ``python -m
zoo.tracking serve models:/<name>/<version>`` build the server of that model (its tokenizer, chat template and
generation defaults) and the ``openai`` client streams its greedy ``generate`` answer; a bad setting is one line."""

from __future__ import annotations

import uuid

import lightning
import pytest
import torch

import zoo.gpt.serve.app as serve_app
from zoo.gpt import __main__ as gpt_main
from zoo.gpt.serve.app import Background

openai = pytest.importorskip("openai")
CHAT = [{"role": "user", "content": "The quick brown fox"}, {"role": "assistant", "content": "jumps."},
        {"role": "user", "content": "And then?"}]  # fmt: skip


def streamed_through(monkeypatch, name: str, ask: dict) -> tuple[str, str]:
    """Runs the command's server in a thread instead of in the foreground: (the streamed reply, the whole one)."""
    got = []

    def serve(app, host, port):
        with Background(app, host) as url:
            c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            chunks = c.chat.completions.create(model=name, messages=CHAT, stream=True, **ask)
            got.append("".join(ch.choices[0].delta.content or "" for ch in chunks))
            got.append(c.chat.completions.create(model=name, messages=CHAT, **ask).choices[0].message.content)

    monkeypatch.setattr(serve_app, "serve", serve)
    return got


def greedy(module, n: int) -> str:
    (ids,) = module.generate([module.chat_prompt(CHAT)], max_new_tokens=n, temperature=0)
    return module.tokenizer.decode(ids.tolist())


def test_an_imported_llama_folder_streams_its_greedy_generate_answer(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from test_gpt_pretrained import TEMPLATE, write_model

    from zoo.gpt import from_pretrained

    folder = tmp_path / "llama-tiny"
    write_model(folder, "llama")
    got = streamed_through(monkeypatch, "llama-tiny", {"max_tokens": 8, "temperature": 0})
    gpt_main.main(["serve", str(folder), "--port", "0", "--max-batch", "2"])
    want = greedy(from_pretrained(folder), 8)
    assert TEMPLATE and got == [want, want] and want


@pytest.mark.slow  # logging the model (its environment, signature and example): ~40 s on 2 shared cores
def test_a_registered_model_streams_by_name_with_its_own_generation_defaults(tmp_path, monkeypatch):
    """Registered greedy (``generation.temperature: 0``): a request that says nothing decodes greedily."""
    from mlflow.tracking import MlflowClient
    from test_serve import tiny_module

    from zoo.tracking import log_checkpoint_model
    from zoo.tracking.__main__ import main as tracking

    module = tiny_module()
    net = {"vocab_size": 257, "block_size": 96, "n_layer": 1, "n_embd": 16, "n_head": 2}
    hparams = {"_class_path": "zoo.gpt.CausalLMModule", "net": {"class_path": "zoo.gpt.GPT", "init_args": net},
               "generation": {"temperature": 0.0, "max_new_tokens": 9}}  # fmt: skip
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": hparams}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, tmp_path / "chat.ckpt")
    import mlflow

    # the session's store (no migrations to wait for), named to the command too: an earlier test in the worker may
    # have pointed mlflow's process-wide default elsewhere
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow.get_tracking_uri())
    client, name = MlflowClient(), f"chat-{uuid.uuid4().hex[:8]}"
    run_id = client.create_run(client.create_experiment(name)).info.run_id
    log_checkpoint_model(tmp_path / "chat.ckpt", client, run_id, name)
    got = streamed_through(monkeypatch, f"{name}/1", {})
    tracking(["serve", f"models:/{name}/1", "--port", "0"])
    assert got == [greedy(module, 9)] * 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["models:/chat/1"], "python -m zoo.tracking serve models:/chat/1"),
        (["{ckpt}", "--max-tokens-cap", "500"], "--max-tokens-cap=500 must be in 1..96"),
        (["{ckpt}", "--max-batch", "0"], "--max-batch=0 must be 1 or more"),
    ],
)
def test_a_bad_serve_setting_is_one_line(tmp_path, monkeypatch, capsys, args, says):
    from test_serve import tiny_module

    module = tiny_module()
    net = {"vocab_size": 257, "block_size": 96, "n_layer": 1, "n_embd": 16, "n_head": 2}
    ckpt = {
        "state_dict": module.state_dict(),
        "hyper_parameters": {"net": {"class_path": "zoo.gpt.GPT", "init_args": net}},
    }
    ckpt["pytorch-lightning_version"] = lightning.__version__
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, tmp_path / "m.ckpt")
    monkeypatch.setattr(serve_app, "serve", lambda *a: pytest.fail("served"))
    with pytest.raises(SystemExit) as exit_:
        gpt_main.main(["serve", *[a.format(ckpt=tmp_path / "m.ckpt") for a in args]])
    assert says in str(exit_.value) and str(exit_.value).startswith("error: ")
