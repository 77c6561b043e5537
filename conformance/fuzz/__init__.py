"""`pgspec fuzz`: search an implementation for disagreements with the spec that the golden corpus
does not hold, shrink each to a minimal example, and keep it as a case definition (docs/fuzz.md).

- ``examples``: what is drawn (parameters from the spec's ranges, the presets and the adapter's
  capabilities; inputs from ``pgspec.conformance.strategies``);
- ``judge``: the fast float64 judgment against the built-in backend (``pgspec check``'s bound) and
  the exact confirmation (the example made a golden record by the generator, run by the runner);
- ``engine``: the hypothesis search per (formula, dtype), shrinking, and the trim pass;
- ``command``: the subcommand (arguments, workers, progress, the report, ``--save``).

It uses the corpus's code (generator, runner, classification, check's oracle scales), never the
golden files; nothing below it imports it.
"""
