"""A logged GPT answers chat ``messages`` (OpenAI's format) through ``mlflow.pyfunc.load_model``: the reply is what
``generate`` continues after the model's chat template with its generation prompt, the signature names the column,
and a bad conversation is MLflow's 400 naming the row. The chat config fits through ``cli.py`` from a fresh folder
(its task written there) and its logged model answers a held-out question."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import CONFIGS, fit_in_folder
from mlflow.exceptions import MlflowException

from zoo.tracking import load

CHAT = [{"role": "user", "content": "What is 2+3?"}]
GREEDY = {"temperature": 0.0, "max_new_tokens": 6}


def _chat_gpt(folder):
    """A tiny byte-level GPT's checkpoint: (its path, the module)."""
    from zoo.gpt import GPT, CausalLMModule
    from zoo.io.tokenizers import ByteTokenizer

    net = {"vocab_size": 257, "block_size": 64, "n_layer": 1, "n_embd": 16, "n_head": 2}
    torch.manual_seed(0)
    module = CausalLMModule(GPT(**net))
    with torch.no_grad():  # large random weights: replies that differ from prompt to prompt, in ASCII
        for p in module.net.parameters():
            p.normal_(0, 0.5)
        module.net.lm_head.weight[128:] = 0
    module.tokenizer = ByteTokenizer()
    hparams = {"_class_path": "zoo.gpt.CausalLMModule", "net": {"class_path": "zoo.gpt.GPT", "init_args": net}}
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": hparams}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, folder / "gpt.ckpt")
    return folder / "gpt.ckpt", module.eval()


def _reply(module, messages, **settings) -> str:
    (ids,) = module.generate([module.chat_prompt(messages)], **settings)
    return module.tokenizer.decode(ids.tolist())


def test_the_gpt_pyfunc_replies_to_messages_after_its_chat_template(tmp_path):
    """Through the pyfunc and MLflow's signature checks in-process (``zoo.tracking.load`` of a checkpoint: what a
    logged model runs, without the seconds of logging one; the slow test below loads a logged one)."""
    path, module = _chat_gpt(tmp_path)
    model = load(str(path))
    assert "messages" in model.metadata.get_input_schema().input_names()
    other = [{"role": "system", "content": "Add."}, *CHAT]
    want = [_reply(module, m, max_new_tokens=6, temperature=0) for m in (CHAT, other)]
    assert want[0] != want[1]
    one = model.predict({"messages": CHAT}, params=GREEDY)  # what {"messages": [...]} over HTTP becomes
    assert list(one["completion"]) == want[:1] and one["prompt"][0].endswith("What is 2+3?\n<|assistant|>\n")
    rows = model.predict(pd.DataFrame({"messages": [CHAT, other]}), params=GREEDY)
    assert list(rows["completion"]) == want
    prompts = module.generate(["ab", ""], max_new_tokens=6, temperature=0)
    assert list(model.predict(pd.DataFrame({"prompt": ["ab", ""]}), params=GREEDY)["completion"]) == prompts
    served = model.predict({"prompt": np.array(["ab", ""])}, params=GREEDY)  # the server's {"inputs": {"prompt": [..]}}
    assert list(served["completion"]) == prompts
    with pytest.raises(MlflowException, match="row 0: message 0 has the role 'tool'"):
        model.predict({"messages": [{"role": "tool", "content": "x"}]}, params=GREEDY)
    # a message without a field: the zoo's line naming the row, the message and the field, not MLflow's schema error
    for chat, said in [
        ([{"role": "user"}], "row 0: message 0 has no 'content'"),
        ([*CHAT, {"content": "x"}], "row 0: message 1 has no 'role'"),
    ]:
        with pytest.raises(MlflowException) as err:
            model.predict({"messages": chat}, params=GREEDY)
        assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(MlflowException, match="row 1: message 0 has no 'content'"):
        model.predict(pd.DataFrame({"messages": [CHAT, [{"role": "user", "content": None}]]}), params=GREEDY)


@pytest.mark.slow  # a cli.py fit: ~10 s beyond the imports
def test_the_chat_config_fits_from_a_fresh_folder_and_its_model_answers_a_held_out_question(tmp_path):
    small = [  # the task written into the test's folder (data/ is the tests' shared download cache)
        f"--data.init_args.path={tmp_path / 'arith'}",
        "--data.init_args.generate.train=64",
        "--data.init_args.generate.pairs=8",
        "--data.init_args.generate.test=8",
    ]
    fitted = fit_in_folder(
        tmp_path,
        "--config",
        str(CONFIGS / "gpt" / "chat_arithmetic.yaml"),
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        *small,
    )
    question = json.loads((tmp_path / "arith" / "test.jsonl").read_text().splitlines()[0])["question"]
    model = mlflow.pyfunc.load_model(f"runs:/{fitted.trainer.logger.run_id}/model")
    assert "messages" in model.metadata.get_input_schema().input_names()
    chat = [{"role": "user", "content": question}]
    out = model.predict({"messages": chat}, params={"max_new_tokens": 8})
    assert list(out["completion"]) == [_reply(fitted.model, chat, max_new_tokens=8, temperature=0)]
