"""pgspec.conformance.corpus: the golden corpus, from case tables to the files users read.

Owns: ``cases/`` (the case tables, one module per family, and ``Case``/``Generated``), ``generator``
(the documented input generator pgspec-splitmix64/1), ``golden`` (generating, writing, loading and
verifying conformance/golden/*.json and its MANIFEST), ``inputs`` (a case's decoded inputs and
resolved parameters, memoized), ``namemap`` (the framework presets in conformance/presets/),
``coverage`` (`pgspec golden coverage`) and ``strategies`` (the public hypothesis strategies, also
importable as pgspec.conformance.strategies).

May import: pgspec.reference and pgspec.conformance.base; never the judge, the verdicts, the run,
the check, the edges, nor pgspec.adapters.

Add a case: a ``Case`` in cases/<family>.py (its arithmetic in the description; a regression case
with its issue link), then ``pgspec golden generate`` (golden files are never edited by hand).  Add
a framework preset: conformance/presets/<framework>.toml.  Add a new input kind: generator.py and
spec/golden-format.md together.
"""
