"""pgspec.conformance.base: what every room may use.

Owns: ``cache`` (the cache folders under $PGSPEC_CACHE, one per code version, and their pruning),
``gcpause`` (pausing Python's cyclic collector around allocation-heavy work) and ``suggest``
(did-you-mean hints for a mistyped formula, glob or option).

May import: the standard library only (and pgspec.reference for names to suggest); never another
room of pgspec.conformance, nor pgspec.adapters.

Add here only a helper that two rooms need and that knows nothing of cases, results or adapters;
anything else belongs to the room that uses it.
"""
