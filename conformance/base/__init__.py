"""pgspec.conformance.base (see docs/architecture.md)."""
