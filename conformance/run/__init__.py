"""pgspec.conformance.run (see docs/architecture.md)."""
