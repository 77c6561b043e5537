"""pgspec adapter for openrlhf (see adapters/openrlhf/README.md)."""


def make_adapter():
    raise ImportError("the openrlhf adapter is not written yet")
