"""prop.group_relabel: renaming prompt groups (any injective map of the ids) changes nothing"""

from __future__ import annotations

from pgspec.reference import REGISTRY, evaluate

from ._common import Property, _assert_same, _need, call, compare_to_ref, formula_example, input_fields, ref


def _relabel_formulas():
    return tuple(fid for fid in sorted(REGISTRY) if "group_ids" in input_fields(fid))


def _relabel_build(src, fid):
    ex = formula_example(src, fid, max_B=6, options=True)
    labels = sorted(set(ex["inputs"]["group_ids"]))
    # an injective, order-reversing, sparse map (negative ids included)
    new = {g: 1000 - 37 * k - src.integer(0, 5) * 1000 for k, g in enumerate(labels)}
    ex["relabel"] = [[g, new[g]] for g in labels]
    ex["relabeled"] = dict(ex["inputs"], group_ids=[new[g] for g in ex["inputs"]["group_ids"]])
    return ex


def _relabel_reference(fid, ex):
    f = REGISTRY[fid]
    a = ref(fid, ex["inputs"], ex["params"])
    b = evaluate(fid, ex["relabeled"], ex["params"])
    for o in f.outputs:
        _assert_same(f"{fid} {o.name} after relabeling groups", b[o.name], a[o.name], a["scale"].get(o.name))
    for name in b["grad"]:
        _assert_same(f"{fid} grad.{name} after relabeling groups", b["grad"][name], a["grad"][name])


def _relabel_adapter(ctx, fid, ex):
    _need(ctx, fid)
    r = ref(fid, ex["inputs"], ex["params"])
    out, grads, _ = call(ctx, fid, ex["relabeled"], ex["params"])
    compare_to_ref(ctx, fid, f"{fid} with group ids relabeled {ex['relabel']}", out, grads, r)
    return ctx.worst



PROPERTY = Property("prop.group_relabel", "Group relabeling invariance",
                   _relabel_formulas, _relabel_build, _relabel_reference, _relabel_adapter)
