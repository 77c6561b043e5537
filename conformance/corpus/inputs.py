"""A golden case's inputs and parameters as the rooms above read them.

``case_inputs``: the case's inputs as ``golden.case_inputs`` decodes them, memoized by the case's
formula and stored inputs (a run, its rules' predicates and its output checks read them again and
again); ``resolved_params``: its parameters with the registry's defaults filled in.  Both were the
runner's and the declarations' (``runner.case_inputs``, ``declarations.resolved_params`` still name them).
"""

from __future__ import annotations

import json
from functools import lru_cache

from . import golden


@lru_cache(maxsize=64)
def _inputs_cached(key: str):
    return golden.case_inputs(json.loads(key))


def case_inputs(case: dict) -> dict:
    return _inputs_cached(json.dumps({"formula": case["formula"], "inputs": case["inputs"]}, sort_keys=True))


def resolved_params(case: dict) -> dict:
    """The case's parameters with the registry defaults filled in."""
    from pgspec.reference import REGISTRY

    f = REGISTRY[case["formula"]]
    out = {p.name: p.default for p in f.params}
    out.update(case.get("params") or {})
    return out
