"""What the ``pgspec`` subcommands share (``cli`` and ``fuzz.command``): one-line messages, an adapter's
own methods called as the user's code, a time limit as an argparse type, and a report path checked
before any work.  At the edge, beside
``cli``; it imports nothing above the run."""

from __future__ import annotations

import os
import sys


FORMULAS_HELP = "formula or case ID globs, comma-separated (e.g. 'kl.*,loss.grpo')"


def seconds_arg(text: str) -> float:
    """``--case-timeout`` / ``--startup-timeout`` as argparse reads them: run.untrusted.parse_seconds,
    a bad value a usage error (exit 2)."""
    import argparse

    from .run.untrusted import parse_seconds

    try:
        return parse_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _say(message: str) -> None:
    """One line on stderr, unwrapped (a usage message or a note of the run)."""
    print(message, file=sys.stderr, flush=True)


def _adapter_call(spec, adapter, method, *args):
    """An adapter's own method, whose crash is the user's adapter's error (one line, exit 2)."""
    from .run.runner import RunError, _one_line

    try:
        return getattr(adapter, method)(*args)
    except RunError:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's code: SystemExit included
        if isinstance(e, KeyboardInterrupt):
            raise
        raise RunError(f"adapter {spec!r}: its {method}() raised {_one_line(e)}") from None


def _report_path_problem(path: str) -> str | None:
    """Why a report cannot be written to ``path`` (None when it can): checked before the run."""
    import shutil
    import tempfile
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        return f"{path} is a directory; give a file path"
    if p.exists() and not p.is_file():
        return f"{path} exists and is not a regular file"
    parent = p.parent
    ancestor = parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a directory"
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create the directory {parent}: {e.strerror or e}"
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"cannot write in {parent}: {e.strerror or e}"
    if shutil.disk_usage(parent).free < MIN_FREE_BYTES:
        return f"the device holding {parent} is full ({shutil.disk_usage(parent).free} bytes free)"
    return None


MIN_FREE_BYTES = 1 << 20
