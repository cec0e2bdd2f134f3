"""The GPT family through cli.py: fit, predict from the checkpoint, GPT-2 weights and tokenizer files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT, cli, output, terminal
from mlflow.tracking import MlflowClient

from zoo.gpt import CausalLMModule

TINY = CONFIGS / "gpt" / "gpt_tiny.yaml"


# The slow pass (the README test command's 10 minutes): the same config's fit, predict from its last checkpoint and
# reload alone run in test_gpt_use.py, the export's Hugging Face folder against transformers in test_gpt_export.py.
@pytest.mark.slow
def test_tiny_fits_then_predicts_from_its_checkpoint_and_reloads_alone():
    c = cli("fit", "--config", str(TINY))
    loss = c.trainer.callback_metrics["val/loss"].item()
    assert loss < math.log(257)  # learned something in 20 steps
    torch.testing.assert_close(c.trainer.callback_metrics["val/ppl"], torch.tensor(math.exp(loss)))
    last = c.trainer.checkpoint_callback.last_model_path

    run = c.trainer.logger.run_id
    client = MlflowClient(c.trainer.logger.tracking_uri)
    samples = [a.path for a in client.list_artifacts(run, "samples")]
    assert samples, "LogTextSamples wrote nothing at validation"
    assert client.get_run(run).data.tags["zoo.family"] == "gpt"

    cli(
        "predict",
        "--config",
        str(TINY),
        "--ckpt_path",
        last,
        '--data.init_args.prompts=["ROMEO:", "To be"]',
        "--model.init_args.generation.max_new_tokens=12",
        "--model.init_args.generation.temperature=0",
    )
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["ROMEO:", "To be"]

    module = CausalLMModule.load_from_checkpoint(last).eval()  # net and tokenizer from the file alone
    greedy = module.generate(["ROMEO:", "To be"], max_new_tokens=12, temperature=0)
    assert greedy == [r["completion"] for r in rows]

    # the checkpoint exports as a Hugging Face GPT-2 folder that transformers runs to the same logits
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.gpt", "export", last, "hf"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained("hf").eval()
    ids = torch.randint(0, 257, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, module(ids), atol=1e-4, rtol=0)
    assert hf.config.eos_token_id == module.tokenizer.eos_id == 256
    # whole: the tokenizer, its chat format and predict's decoding come with it
    text = "ROMEO: Ünïcödé  🤗"
    assert transformers.AutoTokenizer.from_pretrained("hf").encode(text) == module.tokenizer.encode(text)
    assert transformers.GenerationConfig.from_pretrained("hf").eos_token_id == 256


def test_vocab_too_small_for_the_tokenizer_is_named():
    with pytest.raises(ValueError, match=r"vocab_size=257"):
        cli("fit", "--config", str(TINY), "--trainer.fast_dev_run=1", "--model.init_args.net.init_args.vocab_size=100")


@pytest.mark.parametrize(
    "name",
    [
        "gpt_char_shakespeare.yaml",
        pytest.param("gpt_bpe_shakespeare.yaml", marks=pytest.mark.slow),  # the README test command's 10 minutes
        "mla_shakespeare.yaml",
        # the DeepSeek net's fit through cli.py: test_tiny_deepseek_fits_logs_each_depth_and_reloads_from_its_checkpoint
        pytest.param("deepseek_shakespeare.yaml", marks=pytest.mark.slow),
    ],
)
def test_shakespeare_configs_run_a_few_steps(name):
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "gpt" / name),
        "--trainer.fast_dev_run=2",
        "--trainer.enable_progress_bar=false",
    )
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])


MLA_CONFIG = CONFIGS / "gpt" / "mla_shakespeare.yaml"
ATTN = "--model.init_args.net.init_args.attention"


@pytest.mark.parametrize(
    ("config", "args", "key"),
    [
        (MLA_CONFIG, [f"{ATTN}.init_args.n_kv_head=2"], "n_kv_head"),  # a GQA option given to MLA
        (TINY, [f"{ATTN}.class_path=zoo.gpt.attention.MHA", f"{ATTN}.init_args.kv_lora_rank=16"], "kv_lora_rank"),
        (TINY, ["--model.init_args.net.init_args.kv_lora_rank=16"], "kv_lora_rank"),  # the old flat form
    ],
)
def test_attention_options_of_another_variant_fail_at_parse_time(config, args, key, monkeypatch, capsys):
    # In this process, as a terminal runs cli.py: a subprocess per case cost its imports again (seconds each).
    status, _, err = terminal(monkeypatch, capsys, "fit", "--config", str(config), *args, "--print_config")
    assert status != 0
    assert key in err, err[-2000:]


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_mla_checkpoint_reloads_its_attention_alone():
    c = cli(
        "fit",
        "--config",
        str(MLA_CONFIG),
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
        "--model.init_args.net.init_args.n_layer=1",
        "--data.init_args.samples_per_epoch=64",
        "--data.init_args.val_samples=32",
    )
    module = CausalLMModule.load_from_checkpoint(c.trainer.checkpoint_callback.last_model_path).eval()
    attn = module.net.blocks[0].attn
    assert type(attn).__name__ == "MLA" and attn.r == 128 and attn.dp == 16
    ids = torch.randint(0, 85, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(module(ids), c.model.eval()(ids))

    # the same checkpoint exports as a DeepSeek-V3 folder that transformers runs to the same logits
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zoo.gpt",
            "export",
            c.trainer.checkpoint_callback.last_model_path,
            "ds",
            "--format",
            "llama",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained("ds").eval()
    assert type(hf).__name__ == "DeepseekV3ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, module(ids), atol=1e-4, rtol=0)


@pytest.fixture
def gpt2_folder(tmp_path) -> Path:
    """A tiny random GPT-2 in Hugging Face's layout, with GPT-2-style vocab.json and merges.txt."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path / "gpt2"
    folder.mkdir()
    text = Path("data/shakespeare").glob("*.txt") if Path("data/shakespeare").is_dir() else []
    corpus = [p.read_text()[:200_000] for p in sorted(text)[:3]] or ["To be, or not to be, that is the question."]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(folder))
    vocab = bpe.get_vocab_size()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


# Slow (the 10 minutes): a fit through cli.py from a transformers folder's weights and tokenizer stays in the default
# suite through test_gpt_pretrained.py's test_the_cli_fine_tunes_a_folder_with_no_net_block_and_the_folders_tokenizer.
@pytest.mark.slow
def test_gpt2_config_starts_from_hf_weights_and_tokenizer_files(gpt2_folder):
    import transformers

    n_vocab = json.loads((gpt2_folder / "config.json").read_text())["vocab_size"]
    args = [
        f"--model.init_args.net.init_args.{k}={v}"
        for k, v in dict(vocab_size=n_vocab, block_size=64, n_layer=2, n_embd=32, n_head=4).items()
    ]
    args += [
        f"--model.init_args.init_weights={gpt2_folder}",
        f"--data.init_args.gpt2_dir={gpt2_folder}",
        "--data.init_args.block_size=64",
        "--data.init_args.batch_size=2",
        "--trainer.limit_val_batches=2",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
    ]
    c = cli("validate", "--config", str(CONFIGS / "gpt" / "gpt2_124m.yaml"), *args)
    reference = transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder)
    torch.testing.assert_close(c.model.net.tok_emb.weight, reference.transformer.wte.weight)
    assert c.model.tokenizer.eos_id == reference.config.eos_token_id or c.model.tokenizer.eos_id < n_vocab
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "gpt" / "gpt2_124m.yaml"),
        *args,
        "--trainer.fast_dev_run=2",
        "--trainer.accumulate_grad_batches=1",
    )
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])


@pytest.mark.slow
def test_char_config_learns_well_below_the_unigram_entropy():
    # The README's figure is the full 500-step run (val loss 1.98 nats against an entropy of 3.33);
    # 80 steps already clear the unigram bound by a wide margin (2.6 measured at step 100).
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "gpt" / "gpt_char_shakespeare.yaml"),
        "--trainer.max_steps=80",
        "--data.init_args.samples_per_epoch=2560",
        "--data.init_args.val_samples=64",
        "--trainer.enable_progress_bar=false",
    )
    entropy = c.datamodule.unigram_entropy()
    assert entropy == pytest.approx(3.33, abs=0.01)
    assert c.trainer.callback_metrics["val/loss"].item() < entropy - 0.5


@pytest.mark.parametrize("text, short", [("ab", "validation"), ("abcdefghijklmnopqrstuvwxyz" * 4, None)])
def test_a_corpus_too_small_for_a_validation_window_fails_before_training_naming_the_file(
    tmp_path, text, short, monkeypatch, capsys
):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(text)
    status, _, err = terminal(
        monkeypatch,
        capsys,
        "fit",
        "--config",
        str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
        f"--data.init_args.path={corpus}",
        f"--data.init_args.root={tmp_path / 'data'}",
        "--trainer.max_steps=2",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
    )
    if short is None:  # 104 bytes: one window for validation, so it trains
        assert status == 0, err[-3000:]
        return
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 1 and len(errors) == 1, err[-3000:]
    assert str(corpus) in errors[0] and short in errors[0] and "val_fraction" in errors[0], errors[0]
    assert "Traceback" not in err, err[-3000:]


def test_tiny_deepseek_fits_logs_each_depth_and_reloads_from_its_checkpoint(one_thread):
    config = str(CONFIGS / "gpt" / "deepseek_tiny.yaml")
    steps = ["--data.init_args.samples_per_epoch=24", "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1"]
    c = cli("fit", "--config", config, *steps)  # 3 steps
    metrics = c.trainer.callback_metrics
    assert {"train/mtp_loss", "train/mtp_loss_1", "val/mtp_loss_1", "val/loss", "val/moe_bias_min"} <= set(metrics)
    assert metrics["val/mtp_loss_1"] < math.log(257) and "val/mtp_loss_2" not in metrics
    assert len(c.model.routers) == 2  # the MTP block is a mixture of experts like the last block
    last = c.trainer.checkpoint_callback.last_model_path

    module = CausalLMModule.load_from_checkpoint(last).eval()  # MTP rebuilt from the checkpoint alone
    assert module.hparams.mtp_weight == 0.3 and len(module.net.mtp) == 1
    ids = torch.randint(0, 257, (1, 16))
    with torch.no_grad():
        for a, b in zip(module.net(ids, mtp=True)[1], c.model.net.eval()(ids, mtp=True)[1], strict=True):
            torch.testing.assert_close(a, b)
    assert len(module.generate(["ROMEO:"], max_new_tokens=8, temperature=0)[0]) > 0  # the main model alone
