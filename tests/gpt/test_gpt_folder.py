"""A model folder is read once (``zoo.gpt.formats.folder.Folder``): a fit from one opens its config.json,
generation_config.json and tokenizer once, handed from the net builder to the DataModule and the loader; a config names
the folder once (the data's tokenizer folder is ``init_weights'``); what the user's config states, and only that, is its
own, whatever the class's default."""

from __future__ import annotations

import builtins
import io
import json
from collections import Counter
from pathlib import Path

import pytest
from test_gpt_pretrained import write_model

from zoo.errors import InputError
from zoo.gpt.formats.folder import Folder

pytest.importorskip("transformers")

GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 7}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3")
    write_model(folder, "qwen3")
    (folder / "generation_config.json").write_text(json.dumps(GENERATION))
    return folder


def _config(tmp_path: Path, folder: Path, data: dict | None = None, model: dict | None = None) -> list[str]:
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 100)
    text = {"path": str(tmp_path / "text.txt"), "tokenizer": "pretrained", "block_size": 8, "batch_size": 2}
    text |= {"samples_per_epoch": 2, "root": str(tmp_path)} | (data or {})
    init = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(folder)} | (model or {})
    config = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": init},
        "data": {"class_path": "datamodules.TextDataModule", "init_args": text},
        "trainer": {"max_steps": 1, "logger": False, "enable_progress_bar": False, "limit_val_batches": 0},
    }
    (tmp_path / "fit.yaml").write_text(json.dumps(config))
    return ["--config", str(tmp_path / "fit.yaml"), f"--trainer.default_root_dir={tmp_path / 'runs'}"]


def test_a_fit_from_a_folder_reads_its_config_once(tmp_path, folder, monkeypatch):
    """``cli.py fit`` naming the folder once (``init_weights``): every file of it opened once, by the one reader
    (``Folder``), however many parts use it: the net's architecture, the data's tokenizer, the loader, the decoding.
    One optimizer step of a 2-layer net: the reads are counted over a whole fit (15 s measured on 2 loaded cores)."""
    opened: Counter[str] = Counter()

    def spy(real):
        def open_(file, *args, **kwargs):
            if isinstance(file, (str, Path)) and Path(file).parent == folder:
                opened[Path(file).name] += 1
            return real(file, *args, **kwargs)

        return open_

    monkeypatch.setattr(io, "open", spy(io.open))  # pathlib's opens
    monkeypatch.setattr(builtins, "open", spy(builtins.open))
    from conftest import cli

    c = cli("fit", *_config(tmp_path, folder))
    assert c.trainer.global_step == 1
    assert opened["config.json"] == 1 and opened["generation_config.json"] == 1, opened
    assert opened["tokenizer.json"] == 1 and opened["tokenizer_config.json"] == 1, opened
    assert Path(c.datamodule.pretrained_dir) == folder  # init_weights' tokenizer, derived
    assert c.model.hparams.generation["temperature"] == 0.6  # the folder's decoding
    monkeypatch.undo()
    reference = Folder.read(folder)
    assert c.datamodule.tokenizer.to_dict() == reference.tokenizer.to_dict()


def test_a_data_folder_other_than_init_weights_is_refused_in_one_line(tmp_path, folder):
    from cli import main

    other = {"pretrained_dir": str(tmp_path)}
    with pytest.raises(InputError, match=r"pretrained_dir=.* is another folder than model.init_args.init_weights") as e:
        main(_config(tmp_path, folder, data=other), run=False)
    assert "\n" not in str(e.value)
    c = main(_config(tmp_path, folder, data={"pretrained_dir": str(folder)}), run=False)  # the same: fine
    assert c.datamodule.tokenizer is not None


def test_what_the_config_states_is_its_own_even_at_the_classs_default(tmp_path, folder):
    """``n_layer: 4`` and ``temperature: 0.8`` are GPT's and Generation's defaults: stated, they are the config's
    (a net the folder contradicts is refused; the decoding is the config's), where comparing with the defaults took
    them for left out."""
    from cli import main

    with pytest.raises(InputError, match=r"net\.init_args\.n_layer=4 \(the source's: 2\)"):
        main(
            _config(tmp_path, folder, model={"net": {"class_path": "zoo.gpt.GPT", "init_args": {"n_layer": 4}}}),
            run=False,
        )
    stated = {"generation": {"temperature": 0.8}}
    c = main(_config(tmp_path, folder, model=stated), run=False)
    assert c.model.hparams.generation["temperature"] == 0.8
    assert c.model.hparams.generation["top_p"] == 0.9 and c.model.hparams.generation["max_new_tokens"] == 7


def test_a_folder_is_handed_only_to_the_parts_that_name_it(tmp_path, folder):
    from datamodules import TextDataModule
    from zoo.gpt import GPT, CausalLMModule

    read = Folder.read(folder)
    module = CausalLMModule(GPT(vocab_size=8, block_size=8, n_layer=1, n_embd=8, n_head=2), init_weights=str(tmp_path))
    with pytest.raises(ValueError, match="is not init_weights"):
        module.use_folder(read)
    data = TextDataModule(tokenizer="pretrained", pretrained_dir=str(tmp_path))
    with pytest.raises(ValueError, match="is not pretrained_dir"):
        data.use_folder(read)
    module = CausalLMModule(GPT(vocab_size=8, block_size=8, n_layer=1, n_embd=8, n_head=2), init_weights=str(folder))
    module.use_folder(read)  # its own folder: taken
