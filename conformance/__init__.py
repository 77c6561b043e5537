"""pgspec.conformance: formula registry views, golden corpus, tolerance model, runner and CLI."""
