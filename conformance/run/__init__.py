"""pgspec.conformance.run: `pgspec run`: the golden cases and the property checks against an adapter.

Owns: ``runner`` (selecting cases, calling the adapter on each case in each dtype, comparing,
classifying, the run's summary), ``loading`` (loading an adapter by name or module:object and
checking its protocol), ``outputs`` (checking the shapes and dtypes an adapter returns), ``isolated``
(running an adapter in another interpreter over JSON lines), ``origin`` (whose code raised an
exception: the adapter's, its framework's or pgspec's), ``logs`` (saved tracebacks) and
``properties/`` (the property checks of spec/properties.md, also importable as
pgspec.conformance.properties).

May import: pgspec.adapters (it loads them), pgspec.conformance.verdicts, .judge, .corpus, .base and
pgspec.reference; never the check or the edges.

Add a property: a module in properties/ with its ``Property`` entries, listed in
properties/__init__.py's PROPERTIES, and its text in spec/properties.md.  Add an adapter: not here:
adapters/<name>/ (BUILTIN_ADAPTERS in loading.py names the built-in ones).
"""
