"""``gc_paused()``: Python's cyclic garbage collector paused for a block.

For blocks that build many objects holding no reference cycles: a parsed JSON document, marshal
data read back into mpf values, the reference's evaluation graph.  Every allocation counts towards
the collector's next pass, and a pass walks every live object of its generations, so building
several hundred thousand objects costs several passes over them (and over everything else alive).
Reference counting alone frees such objects; the collector is resumed after the block, whatever
happens, and then takes any cycle made during it."""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    if not gc.isenabled():      # already paused by a caller: leave it to that caller
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
