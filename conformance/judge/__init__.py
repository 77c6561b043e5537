"""pgspec.conformance.judge (see docs/architecture.md)."""
