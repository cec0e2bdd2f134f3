"""A trained GPT on new inputs through cli.py: test on any text file, predict from a prompts file without the
training corpus, the vocabulary sized from the tokenizer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, cli, fit_in_folder, output

import datamodules.text
from zoo.gpt import CausalLMModule
from zoo.gpt.generate import Generation
from zoo.gpt.losses import causal_lm_loss

TINY = CONFIGS / "gpt" / "gpt_tiny.yaml"
TEXT = "Now is the winter of our discontent\nMade glorious summer by this sun of York.\n" * 12


@pytest.fixture(scope="module")
def tiny_last(tmp_path_factory) -> str:
    """The tiny config's 4 steps, fitted once for the file in a folder of its own: the tests only read its last
    checkpoint (each fitted its own, the same, before)."""
    c = fit_in_folder(
        tmp_path_factory.mktemp("gpt_tiny"),
        "--config",
        str(TINY),
        "--trainer.max_steps=4",
        "--trainer.limit_val_batches=1",
    )
    assert c.model.net.vocab_size == 257  # the byte tokenizer's, not written in the config
    return str(c.last)


def forbid_corpus(monkeypatch) -> None:
    """From here on, reading (downloading) the training corpus fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the training corpus was read")

    monkeypatch.setattr(datamodules.text, "shakespeare_dir", refuse)


def test_test_on_a_text_file_reports_its_loss_and_perplexity(monkeypatch, tiny_last):
    last = tiny_last
    forbid_corpus(monkeypatch)
    Path("new.txt").write_text(TEXT)
    c = cli("test", "--config", str(TINY), "--ckpt_path", last, "--data.init_args.test_path=new.txt")
    loss, ppl = c.trainer.callback_metrics["test/loss"], c.trainer.callback_metrics["test/ppl"]
    torch.testing.assert_close(ppl, loss.exp())

    # the same figure computed here: the file's bytes + EOS, in non-overlapping windows of 64, token-weighted
    module = CausalLMModule.load_from_checkpoint(last).eval()
    ids = torch.tensor(module.tokenizer.encode(TEXT) + [module.tokenizer.eos_id])
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, 64):
            window = ids[start : start + 65]
            out = causal_lm_loss(module(window[None, :-1]), window[None, 1:])
            total, tokens = total + out["loss"] * out["tokens"], tokens + out["tokens"]
    torch.testing.assert_close(loss, total / tokens, rtol=1e-5, atol=1e-5)
    assert loss < math.log(257) + 0.5


def test_predict_from_a_prompts_file_without_the_corpus(monkeypatch, tiny_last):
    last = tiny_last
    forbid_corpus(monkeypatch)
    Path("prompts.txt").write_text("ROMEO:\n\nTo be, or not\n")
    # the checkpoint's tokenizer: nothing is tokenised to a file either
    monkeypatch.setattr(datamodules.text, "tokenize_to_file", lambda *a, **k: pytest.fail("tokenised a corpus"))
    cli(
        "predict",
        "--config",
        str(TINY),
        "--ckpt_path",
        last,
        "--data.init_args.prompts_file=prompts.txt",
        "--model.init_args.generation.max_new_tokens=12",
        "--model.init_args.generation.temperature=0",
    )
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    prompts = ["ROMEO:", "", "To be, or not"]
    assert [r["prompt"] for r in rows] == prompts
    module = CausalLMModule.load_from_checkpoint(last).eval()
    assert [r["completion"] for r in rows] == module.generate(prompts, max_new_tokens=12, temperature=0)


def test_generation_past_block_size_slides_its_window_to_every_token_asked_for(tiny_last):
    last = tiny_last
    module = CausalLMModule.load_from_checkpoint(last).eval()
    prompt = "x" * 40  # 40 of the 64 positions: 50 new tokens go 26 past block_size
    out = module.generate([torch.tensor(module.tokenizer.encode(prompt))], max_new_tokens=50, temperature=0, top_k=None)
    assert len(out[0]) == 50


def test_a_vocab_size_that_disagrees_with_the_tokenizer_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"tokenizer has 257 ids but the net's vocab_size is 300"):
        cli("fit", "--config", str(TINY), "--trainer.fast_dev_run=1", "--model.init_args.net.init_args.vocab_size=300")
    # a larger multiple of 64 is padding on purpose (nanoGPT's 50304), and a matching size is fine
    for size in (320, 257):
        c = cli(
            "fit",
            "--config",
            str(TINY),
            "--trainer.fast_dev_run=1",
            f"--model.init_args.net.init_args.vocab_size={size}",
        )
        assert c.model.net.vocab_size == size


def test_the_derived_vocab_size_is_in_the_checkpoint(tiny_last):
    last = tiny_last
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["hyper_parameters"]["net"]["init_args"]["vocab_size"] == 257
    assert CausalLMModule.load_from_checkpoint(last).net.tok_emb.weight.shape == (257, 32)


CHARS = CONFIGS / "gpt" / "gpt_char_shakespeare.yaml"
SMALL = (
    "--model.init_args.net.init_args.n_layer=1",
    "--model.init_args.net.init_args.n_embd=32",
    "--model.init_args.net.init_args.n_head=2",
)


def test_the_logged_model_scores_and_continues_new_text_with_its_own_characters(monkeypatch):
    # A character vocabulary is fitted on the corpus: only the model's own copy avoids reading the corpus again.
    c = cli(
        "fit",
        "--config",
        str(CHARS),
        *SMALL,
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        "--data.init_args.samples_per_epoch=32",
        "--data.init_args.val_samples=8",
    )
    assert c.model.net.vocab_size == 85  # 84 characters + EOS, not written in the config
    model = f"runs:/{c.trainer.logger.run_id}/model"
    forbid_corpus(monkeypatch)
    Path("new.txt").write_text("JULIET: O Romeo, Romeo, wherefore art thou Romeo?\n")
    t = cli("test", "--config", str(CHARS), *SMALL, "--ckpt_path", model, "--data.init_args.test_path=new.txt")
    torch.testing.assert_close(t.trainer.callback_metrics["test/ppl"], t.trainer.callback_metrics["test/loss"].exp())
    Path("prompts.txt").write_text("ROMEO:\nJULIET:\n")
    cli(
        "predict",
        "--config",
        str(CHARS),
        *SMALL,
        "--ckpt_path",
        model,
        "--data.init_args.prompts_file=prompts.txt",
        "--model.init_args.generation.max_new_tokens=8",
        "--model.init_args.generation.temperature=0",
        f"--model.init_args.generation.draft={model}",  # resolved as --ckpt_path is; exact, so the same output
    )
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["ROMEO:", "JULIET:"]
    assert [r["completion"] for r in rows] == c.model.eval().generate(["ROMEO:", "JULIET:"], 8, temperature=0)


def test_predict_decodes_speculatively_with_a_draft_checkpoint_and_logs_its_acceptance(capsys, tiny_last):
    last = tiny_last
    Path("prompts.txt").write_text("ROMEO:\nTo be, or not\n")
    args = ["predict", "--config", str(TINY), "--ckpt_path", last, "--data.init_args.prompts_file=prompts.txt"]
    args += ["--model.init_args.generation.max_new_tokens=12", "--model.init_args.generation.temperature=0"]
    c = cli(*args, f"--model.init_args.generation.draft={last}", "--model.init_args.generation.num_draft_tokens=3")
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    # the model drafting for itself: plain greedy output, every proposal accepted, one line printed for the predict
    module = CausalLMModule.load_from_checkpoint(last).eval()
    assert [r["completion"] for r in rows] == module.generate(["ROMEO:", "To be, or not"], 12, temperature=0)
    assert capsys.readouterr().out.count("Speculative decoding: ") == 1
    run = c.trainer.logger.experiment.get_run(c.trainer.logger.run_id)
    assert run.data.metrics["predict/acceptance_rate"] == 1.0 and run.data.metrics["predict/tokens_per_forward"] > 1


def test_a_draft_named_in_a_checkpoint_is_not_read(tiny_last):
    # A file does not choose which other file is read: the stored generation's draft is dropped on every load path.
    ckpt = torch.load(tiny_last, weights_only=True)
    ckpt["hyper_parameters"]["generation"]["draft"] = "/elsewhere/not-yours.ckpt"
    torch.save(ckpt, "planted.ckpt")
    module = CausalLMModule.load_from_checkpoint("planted.ckpt")
    assert Generation.of(module.hparams.generation).draft is None
    assert module.generate(["ROMEO:"], 4, temperature=0)  # plain decoding, nothing else read
    from zoo.io import build, trust

    part = build.resolve_model(ckpt["hyper_parameters"], "planted.ckpt", trust.zoo_allowlist())
    stored = part.plain()["init_args"]["generation"]
    assert "draft" not in stored and "model.init_args.generation.draft" in part.all_dropped()
    assert stored["max_new_tokens"] == Generation.of(ckpt["hyper_parameters"]["generation"]).max_new_tokens
