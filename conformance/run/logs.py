"""Where pgspec saves what is too long for one line: an internal error's traceback, a worker's output.

Files go to ``$PGSPEC_LOG_DIR`` (default: ``<temp dir>/pgspec-logs``), one per event, and the one-line
message on the terminal names the file.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path


def log_dir() -> Path:
    return Path(os.environ.get("PGSPEC_LOG_DIR") or Path(tempfile.gettempdir()) / "pgspec-logs")


def save(text: str, prefix: str) -> str | None:
    """Write ``text`` to a new file named ``<prefix>-<time>-<random>.log``; its path, or None when
    nothing could be written (the caller then shows the text itself)."""
    try:
        directory = log_dir()
        directory.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        return path
    except OSError:
        return None
