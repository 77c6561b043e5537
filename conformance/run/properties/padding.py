"""prop.padding: extra masked tokens (any values, NaN and +-inf included) change nothing"""

from __future__ import annotations

from pgspec.reference import REGISTRY, evaluate

from ...corpus import strategies as pst
from ._common import (Falsified, Property, _assert_same, _flat, _has_mask, _need, _token_inputs, _torch, call,
                      compare_to_ref, formula_example, ref)


PADDING_EXCLUDED = ("dist.cp_split", "dist.cp_reduce", "dist.sdp_segment")


def _padding_formulas():
    return tuple(fid for fid in sorted(REGISTRY) if _has_mask(fid) and fid not in PADDING_EXCLUDED)


def _pad(fid, inputs, k, src):
    """Append k masked columns (junk values; 0 for integer inputs) and junk every masked position."""
    f = REGISTRY[fid]
    mask = inputs["mask"]
    out = {}
    for name, x in inputs.items():
        if name not in _token_inputs(fid, inputs):
            out[name] = x
            continue
        kind = f.input(name).kind
        rows = []
        for i, row in enumerate(x):
            new = []
            for t, v in enumerate(row):
                if kind == "real" and not mask[i][t]:
                    v = [pst.junk_value(src) for _ in v] if isinstance(v, list) else pst.junk_value(src)
                new.append(v)
            for _ in range(k):
                if name == "mask":
                    new.append(False)
                elif kind == "real":
                    new.append([pst.junk_value(src) for _ in row[0]] if row and isinstance(row[0], list)
                               else pst.junk_value(src))
                else:
                    new.append([0] * len(row[0]) if row and isinstance(row[0], list) else 0)
            rows.append(new)
        out[name] = rows
    return out


def _padding_build(src, fid):
    ex = formula_example(src, fid, options=True)
    ex["pad"] = src.integer(1, 3)
    ex["padded"] = _pad(fid, ex["inputs"], ex["pad"], src)
    return ex


def _per_token_output(f, name):
    for o in f.outputs:
        if o.name == name:
            return len(o.shape) >= 2 and tuple(o.shape[:2]) == ("B", "T")
    return False


def _padding_reference(fid, ex):
    f = REGISTRY[fid]
    a = ref(fid, ex["inputs"], ex["params"])
    b = evaluate(fid, ex["padded"], ex["params"])
    T = len(ex["inputs"]["mask"][0])
    for o in f.outputs:
        got = b[o.name]
        if _per_token_output(f, o.name):
            got = [row[:T] for row in got]
        _assert_same(f"{fid} {o.name} after padding", got, a[o.name], a["scale"].get(o.name))
    for name, g in b["grad"].items():
        if name in _token_inputs(fid, ex["inputs"]):
            for i, row in enumerate(g):
                if any(v != 0 for _, v in _flat(row[T:])):
                    raise Falsified(f"{fid} grad.{name}[{i}]: non-zero gradient on an appended masked column")
            g = [row[:T] for row in g]
        _assert_same(f"{fid} grad.{name} after padding", g, a["grad"][name], a["scale"].get(f"grad.{name}"))


def _padding_adapter(ctx, fid, ex):
    _need(ctx, fid)
    torch = _torch()
    r = ref(fid, ex["inputs"], ex["params"])
    T = len(ex["inputs"]["mask"][0])
    out, grads, tensors = call(ctx, fid, ex["padded"], ex["params"])
    compare_to_ref(ctx, fid, f"{fid} with {ex['pad']} appended masked column(s) and NaN/inf at masked positions",
                   out, grads, r, positions=T)
    mask = tensors["mask"]
    for name, g in grads.items():
        if g.dim() >= 2 and tuple(g.shape[:2]) == tuple(mask.shape):
            m = mask.reshape(mask.shape + (1,) * (g.dim() - 2)).expand_as(g)
            bad = g[~m]
            if bad.numel() and not bool((bad == 0).all()):
                v = bad[bad != 0][0].item()
                raise Falsified(f"{fid} grad.{name}: {v!r} at a masked position (must be exactly 0: NaN/inf there "
                                f"leaked through a product with the mask?)")
    return ctx.worst



PROPERTY = Property("prop.padding", "Padding invariance: masked tokens with any values (NaN, +-inf) change nothing",
                   _padding_formulas, _padding_build, _padding_reference, _padding_adapter)
