"""pgspec adapter for skyrl (see adapters/skyrl/README.md)."""


def make_adapter():
    raise ImportError("the skyrl adapter is not written yet")
