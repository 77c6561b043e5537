"""Where pgspec keeps what it can compute again (golden records, prepared references, property
references, validation markers): ``$PGSPEC_CACHE``, by default ``$XDG_CACHE_HOME/pgspec`` or
``~/.cache/pgspec``; ``PGSPEC_CACHE=off`` keeps nothing.  Every entry is named by what it was
computed from, so a stale entry is never found; an unusable cache only costs time."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path | None:
    """The cache's folder ``name`` (not created), or None when caching is off."""
    root = os.environ.get("PGSPEC_CACHE")
    if root == "off":
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pgspec")
    return Path(root) / name
