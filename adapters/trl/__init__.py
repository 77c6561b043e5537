"""pgspec adapter for trl (see adapters/trl/README.md)."""


def make_adapter():
    raise ImportError("the trl adapter is not written yet")
