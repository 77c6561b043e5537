"""pgspec.conformance.corpus (see docs/architecture.md)."""
