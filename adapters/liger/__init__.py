"""pgspec adapter for liger (see adapters/liger/README.md)."""


def make_adapter():
    raise ImportError("the liger adapter is not written yet")
