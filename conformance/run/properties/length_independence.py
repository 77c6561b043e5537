"""prop.length_independence: repeating a sequence leaves geometric means unchanged; exp(sum) collapses"""

from __future__ import annotations

from mpmath import mp

from pgspec.reference import REGISTRY, evaluate

from ...corpus import strategies as pst
from ...judge import tolerance
from ._common import (Falsified, Property, _assert_same, _need, _pylist, _s, _token_inputs, call, compare_to_ref,
                      formula_example, ref)
from .padding import _per_token_output


GEOMETRIC = ("ratio.sequence_geometric", "is.geometric.truncate", "is.geometric.mask", "mask.geometric_sequence")
COLLAPSING = ("ratio.sequence_product",)


def _length_formulas():
    return tuple(f for f in GEOMETRIC + COLLAPSING if f in REGISTRY)


def _repeat(fid, inputs, k):
    tok = _token_inputs(fid, inputs)
    return {n: ([row * k for row in x] if n in tok else x) for n, x in inputs.items()}


_REPEATED: dict = {}


def _repeated(fid, ex):
    """``_repeat`` of a fixed example, built once (the same object for every dtype)."""
    key = (fid, id(ex))
    hit = _REPEATED.get(key)
    if hit is None or hit[0] is not ex:
        hit = _REPEATED[key] = (ex, _repeat(fid, ex["inputs"], ex["repeat"]))
    return hit[1]


def _length_params(fid):
    return {"is.geometric.truncate": {"c_max": 4.0}, "is.geometric.mask": {"c_min": 0.25, "c_max": 4.0},
            "mask.geometric_sequence": {"lower": 0.875, "upper": 1.125}}.get(fid, {})


def _length_build(src, fid):
    ex = formula_example(src, fid, max_T=6)
    ex["params"] = _length_params(fid)
    ex["repeat"] = src.integer(2, 4)
    return ex


def _length_extra(fid):
    """The NeMo-RL#2269 scale: a 1024-token sequence repeated 9 times (9216 tokens)."""
    if fid not in ("ratio.sequence_geometric", "ratio.sequence_product"):
        return []
    inputs = pst.long_sequence_batch(2269, [1024, 700], fields=("logprobs", "old_logprobs"))
    return [{"inputs": inputs, "params": {}, "repeat": 9}]


def _length_reference(fid, ex):
    f = REGISTRY[fid]
    k = ex["repeat"]
    a = ref(fid, ex["inputs"], ex["params"])
    b = evaluate(fid, _repeat(fid, ex["inputs"], k), ex["params"])
    with mp.workdps(60):
        for o in f.outputs:
            if _per_token_output(f, o.name):
                want = [row * k for row in a[o.name]]
            elif fid in COLLAPSING:
                want = [x ** k for x in a[o.name]]
            else:
                want = a[o.name]
            _assert_same(f"{fid} {o.name} with every sequence repeated {k} times", b[o.name], want)
        for name, g in b["grad"].items():
            if fid in COLLAPSING:
                want = [[(a["ratio"][i] ** k) if a["grad"][name][i][t] != 0 else 0 for t in range(len(row))] * k
                        for i, row in enumerate(ex["inputs"]["mask"])]
            else:
                want = [[x / k for x in row] * k for row in a["grad"][name]]
            _assert_same(f"{fid} grad.{name} with every sequence repeated {k} times", g, want)


def _length_adapter(ctx, fid, ex):
    _need(ctx, fid)
    k = ex["repeat"]
    rep = _repeated(fid, ex)
    rr = ref(fid, rep, ex["params"])
    out, grads, _ = call(ctx, fid, rep, ex["params"])
    L = max(sum(row) for row in rep["mask"])
    compare_to_ref(ctx, fid, f"{fid} with every sequence repeated {k} times ({L} tokens)", out, grads, rr)
    if fid in GEOMETRIC:
        r = ref(fid, ex["inputs"], ex["params"])
        out1, _, _ = call(ctx, fid, ex["inputs"], ex["params"])
        name = REGISTRY[fid].outputs[0].name if fid.startswith("ratio.") else "seq_ratio"
        if name not in out1 or name not in out:
            return ctx.worst   # an adapter that does not produce the ratio is judged on what it produces (above)
        a = _pylist(out1[name])
        b = _pylist(out[name])
        for i, (x, y) in enumerate(zip(a, b)):
            bound = float(tolerance.bound(REGISTRY[fid].family, ctx.dtype, _s(r, name, i)) +
                          tolerance.bound(REGISTRY[fid].family, ctx.dtype, _s(rr, name, i)))
            if not abs(x - y) <= bound:
                raise Falsified(f"{fid} {name}[{i}]: {x!r} for the sequence, {y!r} for it repeated {k} times: the "
                                f"geometric mean must not depend on length (exp(sum) where exp(mean) is specified?)")
    return ctx.worst



PROPERTY = Property("prop.length_independence",
                   "Geometric means do not depend on length; the sequence product collapses exponentially",
                   _length_formulas, _length_build, _length_reference, _length_adapter, _length_extra)
