"""The Sphinx build of spec/ (docs/) succeeds with warnings as errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sphinx_build_has_no_warnings(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(tmp_path)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for family in ("conventions", "ratio"):
        assert (tmp_path / "spec" / f"{family}.html").exists()
