"""Python's cyclic garbage collector, paused where pgspec builds many objects without cycles.

``gc_paused()``: the collector paused for a block.

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


class RunCollector:
    """Python's cyclic garbage collector during ``pgspec run``.  A pass walks every object of its
    generations, and a run makes millions that live until it ends (the adapter's framework and the
    corpus, loaded; the prepared references); reference counting alone frees nearly everything
    else a run builds.  So:

    - while the run loads (the adapter with its framework, the corpus), the collector is paused;
    - ``keep()`` (before each dtype's cases) exempts what exists then from the collector for the
      rest of the run (``gc.freeze``), and runs the collector with a first-generation threshold of
      RUN_THRESHOLD allocations: the few reference cycles a run makes are still collected, in
      two or three young passes of a default run instead of about 300 (a young pass costs about
      10 ms whatever its threshold: 13 passes at 20,000 took 0.15 s of a default run, 2 at
      200,000 take 0.01 s, at the same peak memory);
    - ``restore()``, at the end whatever happens, gives everything back: the objects to the
      collector, its thresholds and its state before the run (``main`` may be called again)."""

    RUN_THRESHOLD = 200_000

    def __init__(self):
        self.enabled, self.threshold = gc.isenabled(), gc.get_threshold()
        gc.disable()

    def keep(self) -> None:
        gc.freeze()
        gc.set_threshold(max(self.threshold[0], self.RUN_THRESHOLD), *self.threshold[1:])
        if self.enabled:
            gc.enable()

    def restore(self) -> None:
        gc.unfreeze()
        gc.set_threshold(*self.threshold)
        if self.enabled:
            gc.enable()
        else:
            gc.disable()
