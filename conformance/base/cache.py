"""Where pgspec keeps what it can compute again (golden records, prepared references, property
references, validation markers): ``$PGSPEC_CACHE``, by default ``$XDG_CACHE_HOME/pgspec`` or
``~/.cache/pgspec``; ``PGSPEC_CACHE=off`` keeps nothing.  Every entry is named by what it was
computed from, so a stale entry is never found; an unusable cache only costs time.

The cache stays bounded as pgspec changes: the entries computed by one version of the code that
computes them live in a folder of their own, ``<cache>/<name>/<digest>`` (``version_dir``), and
only the ``KEEP_VERSIONS`` most recently used version folders of each name are kept.  The first
use of a version folder in a process marks it used and removes the older ones, and the entries of
pgspec's earlier flat layout.  Only what pgspec names that way is ever removed: a file or folder
of another name under the cache is left alone."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

KEEP_VERSIONS = 3          # version folders kept per cache name (the one in use among them)
MARKER = ".pgspec-cache"   # in each version folder; its modification time is the folder's last use

_VERSION = re.compile(r"[0-9a-f]{16}")
# the entries of the flat layout before version folders (removed on first use of a version folder)
_LEGACY_FILE = re.compile(r"[0-9a-f]{64}(-[0-9a-f]{16})?(\.marshal|\.npz|\.json|\.\d+\.tmp|\.\d+\.tmp\.npz)")
_LEGACY_FOLDER = re.compile(r"[0-9a-f]{2}")
_CLAIMED: set = set()
_FOLDERS: dict = {}       # (name, digest, the environment naming the cache) -> its version folder


def cache_dir(name: str) -> Path | None:
    """The cache's folder ``name`` (not created), or None when caching is off."""
    root = os.environ.get("PGSPEC_CACHE")
    if root == "off":
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pgspec")
    return Path(root) / name


def version_dir(name: str, digest: str) -> Path | None:
    """The folder of cache ``name`` for the entries computed by the code whose digest is ``digest``
    (a string naming that code exactly, e.g. the sha256 of its sources): ``<cache>/<name>/<16 hex
    digits of the sha256 of digest>``, or None when caching is off.  The first
    call for a folder in a process creates it, marks it used, and prunes ``<cache>/<name>``
    (``prune``); a cache that cannot be written is left as it is."""
    where = (name, digest, os.environ.get("PGSPEC_CACHE"), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))
    folder = _FOLDERS.get(where)
    if folder is not None:
        return folder       # claimed already (asked once per entry: kept cheap)
    root = cache_dir(name)
    if root is None:
        return None
    folder = root / hashlib.sha256(digest.encode()).hexdigest()[:16]
    _FOLDERS[where] = folder
    if folder not in _CLAIMED:
        _CLAIMED.add(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / MARKER).touch()      # an existing marker's mtime is set to now
        except OSError:
            return folder   # read-only or unusable: entries are looked up, nothing is pruned
        prune(root, keep=folder)
    return folder


def prune(root: Path, keep: Path | None = None, versions: int = KEEP_VERSIONS) -> list[Path]:
    """Remove from ``root`` (one cache name's folder) the version folders beyond the ``versions``
    most recently used (``keep`` always kept), and the entries of the flat layout; return what was
    removed.  A version folder is one named by 16 hex digits that holds the marker; anything else
    stays, except files named like the flat layout's entries and two-hex-digit folders holding only
    such files."""
    removed = []
    try:
        children = list(os.scandir(root))
    except OSError:
        return removed
    folders = []
    for entry in children:
        try:
            if entry.is_dir(follow_symlinks=False):
                if _VERSION.fullmatch(entry.name):
                    try:
                        folders.append((os.stat(os.path.join(entry.path, MARKER)).st_mtime_ns, entry.name))
                    except OSError:
                        pass        # no marker: not a version folder of pgspec's
                elif _LEGACY_FOLDER.fullmatch(entry.name) and _only_legacy_files(entry.path):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False) and _LEGACY_FILE.fullmatch(entry.name):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    folders.sort(reverse=True)
    kept = 1 if keep is not None else 0
    for _, name in folders:
        if keep is not None and name == keep.name:
            continue
        if kept < versions:
            kept += 1
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(Path(root) / name)
    return removed


def _only_legacy_files(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return all(e.is_file(follow_symlinks=False) and _LEGACY_FILE.fullmatch(e.name) for e in it)
    except OSError:
        return False
