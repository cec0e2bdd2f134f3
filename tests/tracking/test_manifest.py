"""The manifest of a logged model (issue 52 item 1), its pure parts: what differs is named file by file, and a recorded
manifest or a store's listing is data from a tracking store, checked and bounded before use. The recording and its
use by ``verify`` and the loaders are tests/tracking/test_code.py's."""

from __future__ import annotations

import pytest

from zoo.tracking.downloads import DownloadRefused, refusals
from zoo.tracking.manifest import (
    MAX_FILES,
    MAX_MANIFEST_CHARS,
    decode,
    differences,
    folder_files,
    folder_manifest,
    stored_manifest,
)


def test_differences_name_each_file_added_removed_or_changed_in_path_order():
    recorded = {"MLmodel": "a" * 64, "code/x.py": "b" * 64, "requirements.txt": "c" * 64}
    found = {"MLmodel": "a" * 64, "artifacts/pyfunc.py": "d" * 64, "requirements.txt": "e" * 64}
    assert differences(recorded, found) == [
        "artifacts/pyfunc.py added",
        "code/x.py removed",
        "requirements.txt changed",
    ]
    assert differences(recorded, dict(recorded)) == []


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "{not json",
        '{"../MLmodel": "' + "a" * 64 + '"}',
        '{"/etc/passwd": "' + "a" * 64 + '"}',
        '{"MLmodel": "not a digest"}',
        '{"MLmodel": ["' + "a" * 64 + '"]}',
        '{"": "' + "a" * 64 + '"}',
        '{"MLmodel": "' + "a" * 64 + '"}' + " " * MAX_MANIFEST_CHARS,
    ],
)
def test_a_recorded_manifest_that_is_not_one_is_refused_in_one_line(text):
    """The tag is read from a tracking store (a server may be hostile): paths inside the folder, sha256 digests,
    bounded."""
    with pytest.raises(DownloadRefused, match=r"^models:/x/1: its zoo\.manifest tag is not a manifest of files: "):
        decode(text, "models:/x/1")
    assert decode(None, "models:/x/1") is None


def test_a_store_listing_without_end_is_refused_at_the_bound():
    """A hostile store lists a folder inside every folder: the listing stops at ``MAX_FILES`` entries, one line."""
    from mlflow.entities import FileInfo

    class Endless:
        calls = 0

        def list_artifacts(self, path):
            self.calls += 1
            assert self.calls <= MAX_FILES, "the listing went on past its bound"  # not a hang when the bound is gone
            return [FileInfo(f"{path}/d", True, None), FileInfo(f"{path}/f", False, 1)]

    with pytest.raises(DownloadRefused, match=rf"^runs:/x/m: its folder lists over {MAX_FILES} entries"):
        folder_files(Endless(), "m", "runs:/x/m")


@pytest.mark.parametrize("where", ["this machine", "a server"])
def test_a_stored_folder_hashes_as_it_was_logged_and_a_link_in_it_is_refused(where, tmp_path):
    """Files of an artifact folder of this machine are hashed where they lie; another store's are fetched into a
    temporary folder first (a subclass of the local repository stands for one): the manifest is the same."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    class Remote(LocalArtifactRepository):
        pass

    folder = tmp_path / "store" / "m"
    (folder / "artifacts").mkdir(parents=True)
    (folder / "MLmodel").write_text("flavors: {}\n")
    (folder / "artifacts" / "module.json").write_text("{}")
    repo = (LocalArtifactRepository if where == "this machine" else Remote)(str(tmp_path / "store"))
    (tmp_path / "have").mkdir()
    assert stored_manifest(repo, "m", "runs:/x/m", tmp_path / "have") == folder_manifest(folder)
    (tmp_path / "secret").write_text("outside")
    (folder / "artifacts" / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(DownloadRefused, match=r"^runs:/x/m: "), refusals("runs:/x/m"):  # as a download calls it
        stored_manifest(repo, "m", "runs:/x/m", tmp_path / "have")
