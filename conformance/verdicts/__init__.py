"""pgspec.conformance.verdicts: what a result means for an adapter.

Owns: ``declarations`` (reading adapters/<name>/deviations.toml: unsupported formulas, capabilities,
rules), ``predicates`` (the named input predicates a rule's condition may use), ``classification``
(the outcomes, and turning a comparison into pass / fail / known bug / convention / stale / not
applicable, spec/verdicts.md), ``cells`` (a formula's verdict and the text of a matrix cell; re-exported
here, the former module pgspec.conformance.verdicts) and ``matrix`` (the conformance matrix across
adapters' reports, ``python -m pgspec.conformance.matrix``).

May import: pgspec.reference, pgspec.conformance.judge, .corpus and .base; never the run, the check,
the edges, nor pgspec.adapters (pgspec.adapters.base imports this room to read an adapter's
declarations).

Add a rule: in the adapter's deviations.toml (one root cause, a one-line reason, a link to the line
at the tested version), never in code here.  Add an input predicate a rule can name: predicates.py
(and its entry in spec/verdicts.md).  Add an outcome or change the policy: classification.py with
spec/verdicts.md.
"""

from .cells import cell_text, formula_verdicts, ratio_text, validation_text  # noqa: F401 - the former module's names
