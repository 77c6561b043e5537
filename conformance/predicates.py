"""Named predicates over a golden case's inputs, for declarations (spec/verdicts.md).

A capability or a rule names input forms by these predicates (``inputs = ["empty_row"]``, or
``"not per_token_advantages"``).  Each function's docstring is its definition.  ``case`` is a golden
case; its inputs are read through :func:`inputs_of` (generated scale-case inputs included), real
values as Python floats, masks as bools.  A predicate that concerns an input the case does not
have is false.
"""

from __future__ import annotations

import math


def inputs_of(case: dict) -> dict:
    from .runner import case_inputs

    return case_inputs(case)


def _rows(x):
    return x if isinstance(x, list) else []


def _mask(case):
    return inputs_of(case).get("mask")


def _real_inputs(case):
    from pgspec.reference import REGISTRY

    f = REGISTRY[case["formula"]]
    ins = inputs_of(case)
    for name, value in ins.items():
        try:
            kind = f.input(name).kind
        except Exception:  # noqa: BLE001 - an input the registry does not know is not real
            continue
        if kind == "real":
            yield name, value


def _nonfinite(x) -> bool:
    if isinstance(x, list):
        return any(_nonfinite(v) for v in x)
    return isinstance(x, float) and not math.isfinite(x)


def nonfinite_masked(case: dict) -> bool:
    """Some real [B,T] (or [B,T,V]) input holds NaN or an infinity at a position whose mask is false."""
    mask = _mask(case)
    if mask is None:
        return False
    for _, value in _real_inputs(case):
        if not isinstance(value, list) or len(value) != len(mask) or not value or not isinstance(value[0], list):
            continue
        for row, mrow in zip(value, mask):
            if len(row) != len(mrow):
                continue
            if any(not m and _nonfinite(v) for v, m in zip(row, mrow)):
                return True
    return False


def empty_row(case: dict) -> bool:
    """Some sequence (row of ``mask``) has no unmasked token, while some other row has one."""
    mask = _mask(case)
    if not mask:
        return False
    counts = [sum(1 for m in row if m) for row in mask]
    return any(c == 0 for c in counts) and any(c > 0 for c in counts)


def all_masked(case: dict) -> bool:
    """No token of the batch is unmasked (``mask`` is false everywhere)."""
    mask = _mask(case)
    return mask is not None and not any(m for row in mask for m in row)


def per_token_advantages(case: dict) -> bool:
    """``advantages`` is given per token, shape [B,T], rather than per sequence [B]."""
    adv = inputs_of(case).get("advantages")
    return isinstance(adv, list) and bool(adv) and isinstance(adv[0], list)


def _groups(case):
    g = inputs_of(case).get("group_ids")
    if not isinstance(g, list):
        return None
    sizes = {}
    for x in g:
        sizes[x] = sizes.get(x, 0) + 1
    return sizes


def singleton_group(case: dict) -> bool:
    """Some prompt group (value of ``group_ids``) holds exactly one sequence."""
    sizes = _groups(case)
    return bool(sizes) and any(n == 1 for n in sizes.values())


def unequal_groups(case: dict) -> bool:
    """The prompt groups (values of ``group_ids``) do not all hold the same number of sequences,
    or the sequences of one group are not contiguous in the batch."""
    g = inputs_of(case).get("group_ids")
    if not isinstance(g, list) or not g:
        return False
    sizes = _groups(case)
    if len(set(sizes.values())) > 1:
        return True
    seen, prev = set(), object()
    for x in g:
        if x != prev and x in seen:
            return True
        seen.add(x)
        prev = x
    return False


def packed_documents(case: dict) -> bool:
    """``document_ids`` is given and some row holds more than one document."""
    d = inputs_of(case).get("document_ids")
    if not isinstance(d, list):
        return False
    return any(len(set(row)) > 1 for row in d if isinstance(row, list))


def predicates() -> dict:
    """{name: function} for every public predicate of this module (a function added here is known)."""
    import inspect
    import sys

    module = sys.modules[__name__]
    return {name: fn for name, fn in inspect.getmembers(module, inspect.isfunction)
            if not name.startswith("_") and fn.__module__ == __name__ and name not in ("inputs_of", "predicates")}


def zero_logprob(case: dict) -> bool:
    """Some unmasked ``logprobs`` entry is 0 or positive (probability 1): a framework fed through
    logits cannot carry the gradient of such a log-prob back through a two-class softmax."""
    x, m = inputs_of(case).get("logprobs"), _mask(case)
    if not isinstance(x, list) or m is None:
        return False
    for row, mrow in zip(x, m):
        for v, keep in zip(row, mrow):
            if keep and float(v) >= 0:
                return True
    return False
