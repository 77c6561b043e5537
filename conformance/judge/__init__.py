"""pgspec.conformance.judge: whether a result is within tolerance of the reference.

Owns: ``tolerance`` (the normative model K u(dtype) S + floor(dtype), and ``tolerance.compare``, the
exact comparison in mpmath), ``compare`` (judging a case's outputs: ``compare_output``,
``gather_case``, ``compare_cases``; it re-exports the parts below), ``prepared`` (the reference side
as double-doubles, prepared once), ``fast`` (the float64 fast path with its exact fall-back, the
process-wide mode and counters), ``prepared_cache`` (prepared references of the corpus on disk) and
``call`` (the call convention: how an adapter's formula is called and differentiated).

May import: pgspec.reference, pgspec.conformance.corpus and pgspec.conformance.base; never the
verdicts, the run, the check, the edges, nor pgspec.adapters (adapters arrive as objects).

Add a new dtype or a family's constant K: tolerance.py with spec/tolerance.md (K is justified by
error analysis there, never tuned to make an implementation pass).  A change to the fast path must
keep deciding exactly as ``tolerance.compare`` (tests/test_compare.py, tests/test_fast_paths.py).
"""
