"""pgspec.conformance: the golden corpus, the judge, the verdicts, the run and the production-size check.

Owns: the rooms below, and on top the user's edges: ``cli`` (the ``pgspec`` command; ``cli_help``
its help text), ``report`` (the table, json, md and html reports) and ``pytest_plugin`` (the
``pgspec`` pytest plugin); ``strategies``, ``properties`` and ``matrix`` are the documented import
paths of the public strategies, the property checks and ``python -m pgspec.conformance.matrix``.
The data it publishes stays where it always was: ``conformance/golden/`` (the golden files, schema and
MANIFEST) and ``conformance/presets/`` (the name map's framework presets).

The rooms, each importing only the rooms below it (.importlinter; tests/test_layers.py)::

    cli, report, pytest_plugin      the user's edges
    check/                          `pgspec check`: production-size checks against the float64 oracle
    run/                            the runner, the isolated worker, the property checks
    pgspec.adapters                 the adapter protocol and the adapters (the run loads them)
    verdicts/                       declarations, predicates, classification, verdict cells, matrix
    judge/                          the tolerance model and the comparison
    corpus/                         case tables, generator, golden files, name map, coverage, strategies
    base/                           cache folders, gc pause, did-you-mean
    pgspec.reference                the mpmath reference (imports none of these)

May import: pgspec.reference and pgspec.adapters (the edges and the run).

Add a formula: pgspec.reference (its module, REGISTRY), spec/, then its cases in corpus/cases/ and
its torch implementation in pgspec.adapters.torch; a case: corpus/cases/<family>.py; a property:
run/properties/; a rule: adapters/<name>/deviations.toml (its predicates: verdicts/predicates.py);
an adapter: adapters/<name>/ (docs/adapter-guide.md).  docs/architecture.md follows one case
through ``pgspec run``.
"""
