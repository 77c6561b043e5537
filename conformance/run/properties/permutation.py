"""prop.permutation: permuting the batch's rows permutes per-sequence results, keeps the rest"""

from __future__ import annotations

from pgspec.reference import REGISTRY, evaluate

from ._common import Property, _assert_same, _need, _seq_inputs, call, compare_to_ref, formula_example, ref


def _perm_formulas():
    return tuple(fid for fid in sorted(REGISTRY) if REGISTRY[fid].family != "dist")


def _permute(fid, inputs, perm):
    seq = _seq_inputs(fid, inputs)
    return {n: ([x[p] for p in perm] if n in seq else x) for n, x in inputs.items()}


def _perm_build(src, fid):
    ex = formula_example(src, fid, max_B=5, options=True)
    B = len(next(iter(v for k, v in ex["inputs"].items() if k in _seq_inputs(fid, ex["inputs"]))))
    perm = list(range(B))
    for k in range(B - 1, 0, -1):
        j = src.integer(0, k)
        perm[k], perm[j] = perm[j], perm[k]
    ex["permutation"] = perm
    ex["permuted"] = _permute(fid, ex["inputs"], perm)
    return ex


def _seq_output(f, name):
    for o in f.outputs:
        if o.name == name:
            return len(o.shape) >= 1 and o.shape[0] == "B"
    return False


def _permuted_ref(fid, r, perm):
    """The reference result of the original batch, rearranged as the permuted batch's should be."""
    f = REGISTRY[fid]
    out = {"grad": {}, "scale": {}}
    for o in f.outputs:
        p = _seq_output(f, o.name)
        out[o.name] = [r[o.name][q] for q in perm] if p else r[o.name]
        s = r["scale"].get(o.name)
        out["scale"][o.name] = ([s[q] for q in perm] if p and s is not None else s)
    for name, g in r["grad"].items():
        out["grad"][name] = [g[q] for q in perm]
        s = r["scale"].get(f"grad.{name}")
        out["scale"][f"grad.{name}"] = [s[q] for q in perm] if s is not None else None
    return out


def _perm_reference(fid, ex):
    f = REGISTRY[fid]
    a = _permuted_ref(fid, ref(fid, ex["inputs"], ex["params"]), ex["permutation"])
    b = evaluate(fid, ex["permuted"], ex["params"])
    for o in f.outputs:
        _assert_same(f"{fid} {o.name} after permuting rows {ex['permutation']}", b[o.name], a[o.name],
                     a["scale"].get(o.name))
    for name in b["grad"]:
        _assert_same(f"{fid} grad.{name} after permuting rows", b["grad"][name], a["grad"][name],
                     a["scale"].get(f"grad.{name}"))


_PERMUTED: dict = {}


def _perm_adapter(ctx, fid, ex):
    _need(ctx, fid)
    r = ref(fid, ex["inputs"], ex["params"])
    # built once per example and reference (the same objects for every dtype: their preparation for
    # the comparison is found again)
    hit = _PERMUTED.get((fid, id(ex)))
    if hit is None or hit[0] is not ex or hit[1] is not r:
        hit = _PERMUTED[(fid, id(ex))] = (ex, r, _permuted_ref(fid, r, ex["permutation"]))
    a = hit[2]
    out, grads, _ = call(ctx, fid, ex["permuted"], ex["params"])
    compare_to_ref(ctx, fid, f"{fid} with rows permuted {ex['permutation']}", out, grads, a)
    return ctx.worst



PROPERTY = Property("prop.permutation", "Batch permutation invariance",
                   _perm_formulas, _perm_build, _perm_reference, _perm_adapter)
