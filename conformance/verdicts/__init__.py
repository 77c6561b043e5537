"""pgspec.conformance.verdicts (see docs/architecture.md)."""

from .cells import cell_text, formula_verdicts, ratio_text, validation_text  # noqa: F401 - the former module's names
