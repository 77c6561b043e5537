"""pgspec adapter for areal (see adapters/areal/README.md)."""


def make_adapter():
    raise ImportError("the areal adapter is not written yet")
