"""The on-disk cache stays bounded as pgspec's code changes: entries live in a folder per version
of the code that computes them, only the most recently used version folders are kept, and nothing
pgspec did not name is ever removed."""

from __future__ import annotations

import hashlib
import os

from mpmath import mpf

from pgspec.conformance.base import cache
from pgspec.conformance.run.properties import _common as C


def _version(root, name, used_at):
    d = root / name
    d.mkdir(parents=True)
    (d / "entry.marshal").write_bytes(b"x")
    (d / cache.MARKER).touch()
    os.utime(d / cache.MARKER, (used_at, used_at))
    return d


def test_a_version_folder_is_named_by_the_digest_and_marked_used(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    d = cache.version_dir("references", "some code")
    assert d == tmp_path / "references" / hashlib.sha256(b"some code").hexdigest()[:16]
    assert (d / cache.MARKER).is_file()
    assert cache.version_dir("references", "some code") == d
    assert cache.version_dir("references", "other code") != d
    monkeypatch.setenv("PGSPEC_CACHE", "off")
    assert cache.version_dir("references", "some code") is None


def test_only_the_most_recently_used_versions_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    root = tmp_path / "golden"
    old = [_version(root, f"{k:016x}", 1_000_000 + k) for k in range(5)]    # old[4] the most recent
    h = "ab" * 32
    legacy = [root / f"{h}.marshal", root / f"{h}-{'c' * 16}.npz", root / f"{h}.4711.tmp"]
    for p in legacy:
        p.write_bytes(b"x")
    (root / "ab").mkdir()
    (root / "ab" / f"{h}.json").write_bytes(b"{}")
    # not pgspec's: kept whatever their age
    mine = [root / "notes.txt", root / "cd" / "notes.txt", root / ("e" * 16) / "data.bin"]
    for p in mine:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"mine")

    d = cache.version_dir("golden", "the code now")
    left = sorted(p.name for p in root.iterdir())
    assert sorted([d.name, old[4].name, old[3].name, "cd", "e" * 16, "notes.txt"]) == left
    for p in mine:
        assert p.read_bytes() == b"mine"
    assert (old[4] / "entry.marshal").exists()
    # the one in use is kept even when it is not among the most recent by its marker
    os.utime(d / cache.MARKER, (1, 1))
    assert cache.prune(root, keep=d, versions=2) == [old[3]]
    assert sorted(p.name for p in root.iterdir()) == sorted([d.name, old[4].name, "cd", "e" * 16, "notes.txt"])


def test_an_unusable_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    monkeypatch.setenv("PGSPEC_CACHE", str(blocker / "cache"))   # below a file: nothing can be made
    d = cache.version_dir("references", "some code")
    assert d is not None and not d.exists()
    result = {"value": mpf(1) / 3, "grad": {}, "scale": {"value": mpf(1) / 3}}
    key = C._key("agg.token_mean", {"values": [[1.0]], "mask": [[True]]}, {})
    C._disk_put(key, result)
    assert C._disk_get(key) is None


def test_the_property_references_of_an_earlier_code_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    result = {"value": mpf(1) / 3, "grad": {}, "scale": {"value": mpf(1) / 3}}
    key = C._key("agg.token_mean", {"values": [[1.0]], "mask": [[True]]}, {})
    folders = []
    for k in range(cache.KEEP_VERSIONS + 1):
        monkeypatch.setattr(C, "_reference_digest", lambda k=k: f"reference version {k}")
        C._disk_put(key, result)
        assert C._disk_get(key)["value"] == result["value"]
        folders.append(C._disk_path(key).parent)
        os.utime(folders[-1] / cache.MARKER, (1_000_000 + k, 1_000_000 + k))
    assert len(set(folders)) == cache.KEEP_VERSIONS + 1
    assert not folders[0].exists()                   # the oldest version, pruned by the newest's first use
    assert all(f.exists() for f in folders[1:])
