"""A sharded (torch.distributed.checkpoint) folder is read without executing anything pickled in it.

torch unpickles a folder's ``.metadata`` and its non-tensor entries without restriction; the zoo reads both
through an allowlist (metadata) or weights-only (entries) before anything else does, in consolidation and
before Lightning resumes from a folder. Each payload here would create a marker file if it ran.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import CONFIGS, terminal

from cli import main
from zoo.io.weights import CheckpointError, UnsafeCheckpointError, read_sharded_metadata
from zoo.train.parallel import check_sharded_checkpoint, consolidate


class Payload:
    """Unpickles as ``open(marker, "w")``: a file appears if the pickle is ever run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _save(folder: Path, extra: dict | None = None) -> dict:
    state = {
        "state_dict": {"net.w": torch.randn(3, 4), "net.b": torch.zeros(2, dtype=torch.bfloat16)},
        "optimizer_0": {
            "state": {0: {"step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0], "fused": None}],
        },
        **(extra or {}),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    return state


def test_a_real_folder_reads_and_consolidates(tmp_path):
    state = _save(tmp_path / "ckpt")
    assert set(read_sharded_metadata(tmp_path / "ckpt").state_dict_metadata) >= {"state_dict.net.w", "state_dict.net.b"}
    check_sharded_checkpoint(tmp_path / "ckpt")
    one = torch.load(consolidate(tmp_path / "ckpt", tmp_path / "one.ckpt"), weights_only=True)
    torch.testing.assert_close(one["state_dict"]["net.w"], state["state_dict"]["net.w"], rtol=0, atol=0)
    assert one["optimizer_states"][0]["param_groups"][0]["betas"] == (0.9, 0.95)


def _crafted_metadata(folder: Path, marker: Path) -> Path:
    _save(folder)
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    return folder / ".metadata"


@pytest.mark.parametrize(
    "read", [read_sharded_metadata, check_sharded_checkpoint, lambda d: consolidate(d, d.parent / "out.ckpt")]
)
def test_crafted_metadata_is_refused_naming_the_file_and_runs_nothing(tmp_path, read):
    marker = tmp_path / "marker"
    file = _crafted_metadata(tmp_path / "ckpt", marker)
    with pytest.raises(
        UnsafeCheckpointError, match=rf"refused to read '{file}'.*open is not a checkpoint metadata class"
    ):
        read(tmp_path / "ckpt")
    assert not marker.exists()


def test_crafted_object_entry_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    _save(tmp_path / "ckpt", {"extra": Payload(marker)})  # a non-tensor entry: pickled into a shard
    assert not marker.exists()
    for read in (check_sharded_checkpoint, lambda d: consolidate(d, tmp_path / "out.ckpt")):
        with pytest.raises(Exception, match="refused entry 'extra'"):
            read(tmp_path / "ckpt")
        assert not marker.exists()


def test_resume_validate_and_predict_refuse_a_crafted_folder_before_lightning_reads_it(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "marker"
    file = _crafted_metadata(tmp_path / "ckpt", marker)
    for sub in ("fit", "validate", "predict"):
        with pytest.raises(UnsafeCheckpointError, match=str(file)):
            main(
                [
                    sub,
                    "--config",
                    str(CONFIGS / "cnn" / "convnet_digits.yaml"),
                    "--trainer.logger=false",
                    "--ckpt_path",
                    str(tmp_path / "ckpt"),
                ]
            )
        assert not marker.exists()
    # At the terminal (cli.run, in this process): one line naming the file, no traceback.
    digits = str(CONFIGS / "cnn" / "convnet_digits.yaml")
    status, _, err = terminal(monkeypatch, capsys, "test", "--config", digits, "--ckpt_path", str(tmp_path / "ckpt"))
    assert status == 1 and f"error: refused to read '{file}'" in err, err[-2000:]
    assert "Traceback" not in err and not marker.exists()


def _retarget(folder: Path, entry: str, **changes) -> Path:
    """Rewrite where ``.metadata`` says ``entry``'s bytes are (a tampered folder's metadata, still only metadata
    classes: the allowlist admits it)."""
    import dataclasses

    _save(folder)
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    (index,) = [i for i in metadata.storage_data if i.fqn == entry]
    metadata.storage_data[index] = dataclasses.replace(metadata.storage_data[index], **changes)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return folder / ".metadata"


@pytest.mark.parametrize(
    "changes, says",
    [
        (
            {"relative_path": "../outside.distcp"},
            r"places 'state_dict.net.w' in '../outside.distcp', not a data file of",
        ),
        ({"relative_path": "/etc/hostname"}, r"not a data file of"),
        ({"relative_path": "missing.distcp"}, r"not a data file of"),
        ({"offset": 2**62}, r"at bytes 4611686018427387904\+\d+, outside its \d+ bytes"),
        ({"length": 2**62}, r"at bytes \d+\+4611686018427387904, outside its"),
        ({"offset": -1}, r"at bytes -1\+"),
        ({"transform_descriptors": ["stream.zstd/1"]}, r"read through \['stream.zstd/1'\]"),
    ],
    ids=["outside", "absolute", "missing", "offset", "length", "negative", "decompressed"],
)
def test_metadata_that_places_an_entry_outside_the_folders_data_is_refused(tmp_path, changes, says):
    (tmp_path / "outside.distcp").write_bytes(bytes(1 << 16))  # what a path out of the folder would read
    file = _retarget(tmp_path / "ckpt", "state_dict.net.w", **changes)
    for read in (read_sharded_metadata, check_sharded_checkpoint, lambda d: consolidate(d, tmp_path / "out.ckpt")):
        with pytest.raises(CheckpointError, match=rf"'{file}' is corrupt: it .*{says}"):
            read(tmp_path / "ckpt")
    assert not (tmp_path / "out.ckpt").exists()
