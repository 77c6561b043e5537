"""pgspec.adapters: the adapter protocol, the built-in PyTorch backend and framework adapters."""
