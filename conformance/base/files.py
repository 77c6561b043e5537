"""Every file pgspec reads is checked to be what it must be before it is opened (issue 39): a regular
file (not a directory, a FIFO that would block the read forever, or a device), readable, of bounded
size, and, for text, valid UTF-8; a problem is one line naming the file (and the line, for text).

The caller turns a FileProblem into its own usage error (GoldenError, PresetError, DeclarationError:
exit 2); a cache entry that is not a regular file is a cache miss (``cache_entry_ok``), which costs
only time.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MiB = 1 << 20
# Upper bounds on what pgspec reads (docs/bad-input.md): the largest golden family file is under
# 1 MiB today; a declarations or presets file is a few KiB.
MAX_GOLDEN_BYTES = 64 * MiB
MAX_CONFIG_BYTES = 4 * MiB       # presets, declarations, MANIFEST
MAX_CACHE_ENTRY_BYTES = 1024 * MiB


class FileProblem(Exception):
    """A file pgspec must read is not a readable regular file of bounded size, or not UTF-8 text."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path, max_bytes: int) -> int:
    """The size of ``path``; FileProblem unless it is a regular file (symbolic links followed) of at most
    ``max_bytes`` bytes that this process may read."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FileProblem(f"{p}: no such file") from None
    except OSError as e:
        raise FileProblem(f"{p}: cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(f"{p}: is {_kind(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise FileProblem(f"{p}: {st.st_size} bytes, more than the {max_bytes} bytes such a file may have")
    if not os.access(p, os.R_OK):
        raise FileProblem(f"{p}: cannot be read: permission denied")
    return st.st_size


def read_bytes(path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` bytes (check_regular), else FileProblem."""
    check_regular(path, max_bytes)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise FileProblem(f"{path}: cannot be read: {e.strerror or e}") from None
    if len(data) > max_bytes:    # it grew since it was checked
        raise FileProblem(f"{path}: more than the {max_bytes} bytes such a file may have")
    return data


def decode_text(path, data: bytes) -> str:
    """``data`` decoded as UTF-8 (a byte-order mark allowed), else FileProblem naming the line and column."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise FileProblem(f"{path}, line {line}, column {column}: not UTF-8 text (byte 0x{data[e.start]:02x}: "
                          f"{e.reason})") from None


def read_text(path, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The text of a regular UTF-8 file of at most ``max_bytes`` bytes, else FileProblem."""
    return decode_text(path, read_bytes(path, max_bytes))


def cache_entry_ok(path, max_bytes: int = MAX_CACHE_ENTRY_BYTES) -> bool:
    """Whether a cache entry may be read: a regular readable file of bounded size.  Anything else (a
    directory, a FIFO whose read would block forever, a file too large) is a miss."""
    try:
        check_regular(path, max_bytes)
    except FileProblem:
        return False
    return True
