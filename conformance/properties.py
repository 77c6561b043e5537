"""Property checks (DESIGN section 8, spec/properties.md): invariances every implementation must keep.

Each property has an ID (``prop.<name>``), a spec anchor, and the formula IDs it applies to
(computed from the registry at run time, so new ``loss.*`` recipes are covered when they land).
It is checked two ways:

- on the **reference** with hypothesis (``check_reference``): examples drawn from
  ``pgspec.conformance.strategies``, the invariance asserted at the working precision (agreement
  to 40 significant digits, or exactly for booleans);
- on an **adapter** (``run_properties``) with a *fixed* set of examples made from seeded sources
  (the same on every run and machine), the adapter's formulas called the way the runner calls them
  (``runner.to_tensors``, ``adapter.call``, autograd of the unmasked sum of ``grad_of``) and every
  number compared with the tolerance model (spec/tolerance.md) against the reference evaluated on
  the very inputs the adapter saw.  A property passes when every example does; a failure names
  the property, the formula, the first falsifying example (JSON) and a copy-paste repro.

Adapters expose formula IDs only, so each property is stated in terms of formula calls (for
example the CP rank sum is: the adapter's ``dist.cp_reduce`` partials, and its aggregator evaluated
on each rank's tokens with the whole batch's denominators, add up to the reference's cp = 1 value).
"""

from __future__ import annotations

import fnmatch
import json
import math
import traceback
import zlib
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Callable

from mpmath import mp, mpf

from pgspec.reference import REGISTRY, SpecError, evaluate
from pgspec.reference import agg as ref_agg
from pgspec.reference import dist as ref_dist

from . import strategies as pst
from . import tolerance

SPEC_PAGE = "spec/properties.md"
OUTCOMES = ("pass", "fail", "error", "unsupported")
FIXED_EXAMPLES = 2          # seeded examples per (property, formula), plus hand-made ones where listed
REF_DIGITS = 40             # reference invariances hold to this many significant digits


class Unsupported(Exception):
    """The adapter lacks a formula (or dtype) the property needs."""


class Falsified(AssertionError):
    """A property does not hold on an example (message says where and by how much)."""


@dataclass
class PropertyResult:
    property: str
    formula: str
    dtype: str
    device: str
    outcome: str
    message: str = ""
    example: dict | None = None
    repro: str = ""
    error_ratio: float | None = None
    examples: int = 0

    def to_json(self):
        d = asdict(self)
        if d["error_ratio"] is not None and not math.isfinite(d["error_ratio"]):
            d["error_ratio"] = str(d["error_ratio"])
        return d


@dataclass(frozen=True)
class Property:
    id: str
    title: str
    applies: Callable[[], tuple]                 # the formula IDs it applies to (from the registry)
    build: Callable                              # (Source, formula) -> example dict (JSON-able)
    reference: Callable                          # (formula, example) -> None, raises Falsified
    adapter: Callable                            # (Ctx, formula, example) -> worst error ratio, raises
    extra_examples: Callable = field(default=lambda fid: [])   # hand-made examples for adapters

    @property
    def spec(self) -> str:
        return f"{SPEC_PAGE}#{self.id}"

    @property
    def formulas(self) -> tuple:
        return tuple(self.applies())

    def to_json(self):
        return {"id": self.id, "title": self.title, "spec": self.spec, "formulas": list(self.formulas)}


@dataclass
class Ctx:
    adapter: object
    dtype: str
    device: str
    worst: float = 0.0

    def note(self, ratio):
        if ratio is not None and ratio > self.worst:
            self.worst = ratio


# JSON-able examples (non-finite floats as strings) --------------------------------------------
def encode(x):
    if isinstance(x, dict):
        return {k: encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [encode(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def decode(x):
    """The inverse of ``encode``: "nan", "inf", "-inf" become floats again."""
    if isinstance(x, dict):
        return {k: decode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [decode(v) for v in x]
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    return x


def _key(*parts) -> str:
    return json.dumps(encode(list(parts)), sort_keys=True)


# The reference, cached (one evaluation serves every dtype and property) ------------------------
@lru_cache(maxsize=4096)
def _ref_cached(key: str):
    fid, inputs, params = decode(json.loads(key))
    try:
        return evaluate(fid, inputs, params, with_scale=True)
    except TypeError:
        # A reference defect (reported): the scale pass fails when every real input is tracked.
        # Fall back to the scale of the nodes built from the differentiable inputs only (the
        # operations on constant inputs are then not counted: a slight underestimate of S).
        r = evaluate(fid, inputs, params)
        r["scale"] = _scales_differentiable_only(fid, inputs, params)
        return r


def _scales_differentiable_only(fid, inputs, params):
    from pgspec.reference._evaluate import _scales, check_params, convert_inputs

    f = REGISTRY[fid]
    with mp.workdps(60):
        converted, leaves = convert_inputs(f, inputs, track_all=False)
        raw = f.func(**converted, **check_params(f, params))
        return _scales(f, raw, leaves)


def ref(fid, inputs, params=None):
    return _ref_cached(_key(fid, inputs, params or {}))


def _s(r, key, *path):
    """The reference's tolerance scale of output ``key`` at ``path`` (None when not available)."""
    x = r.get("scale", {}).get(key)
    for k in path:
        if x is None:
            return None
        x = x[k]
    return x


def _close(a, b, scale=None, digits=REF_DIGITS) -> bool:
    """Reference agreement: |a - b| <= 10^-digits max(|a|, |b|, scale, tiny)."""
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return a == b
    a, b = mpf(a), mpf(b)
    size = max(abs(a), abs(b), mpf(scale) if scale is not None else mpf(0))
    return abs(a - b) <= mpf(10) ** -digits * size + mpf(10) ** -(2 * digits)


def _flat(x, path=()):
    if isinstance(x, (list, tuple)):
        for k, item in enumerate(x):
            yield from _flat(item, path + (k,))
    else:
        yield path, x


def _at(x, path):
    for k in path:
        x = x[k]
    return x


def _fmt(x):
    if x is None or isinstance(x, bool):
        return repr(x)
    try:
        return mp.nstr(mpf(x), 12)
    except (TypeError, ValueError):
        return repr(x)


def _assert_same(label, a, b, scale=None):
    """Nested reference results a and b agree element by element (40 digits; booleans exactly)."""
    fa, fb = list(_flat(a)), list(_flat(b))
    if len(fa) != len(fb):
        raise Falsified(f"{label}: shapes differ ({len(fa)} vs {len(fb)} elements)")
    fs = dict(_flat(scale)) if scale is not None else {}
    for (path, x), (_, y) in zip(fa, fb):
        if not _close(x, y, fs.get(path)):
            raise Falsified(f"{label}{list(path)}: {_fmt(x)} != {_fmt(y)}")


# Calling an adapter the way runner.run_case does ------------------------------------------------
def _torch():
    import torch

    return torch


def _tensors(ctx, fid, inputs):
    from . import runner

    return runner.to_tensors(fid, inputs, ctx.dtype, ctx.device)


def _need(ctx, *fids):
    caps = ctx.adapter.capabilities()
    missing = [f for f in fids if f not in caps]
    if missing:
        raise Unsupported(f"{ctx.adapter.name} does not implement {', '.join(missing)}")
    if ctx.dtype not in ctx.adapter.dtypes:
        raise Unsupported(f"{ctx.adapter.name} does not support {ctx.dtype}")


def call(ctx, fid, inputs, params):
    """(outputs, gradients, tensors): the adapter's formula on ``inputs`` (nested lists) in the
    context's dtype and device, gradients of the unmasked sum of ``grad_of`` as the runner takes them."""
    from . import runner

    torch = _torch()
    f = REGISTRY[fid]
    tensors = _tensors(ctx, fid, inputs)
    with torch.enable_grad():
        out = ctx.adapter.call(fid, tensors, dict(params))
        grads = out.get("grad")
        diff = [n for n in f.differentiable if n in tensors]
        if grads is None and diff and f.grad_of in out:
            objective = runner._objective(out[f.grad_of], tensors.get("mask"))
            got = torch.autograd.grad(objective, [tensors[n] for n in diff], allow_unused=True)
            grads = {n: (g if g is not None else torch.zeros_like(tensors[n])) for n, g in zip(diff, got)}
    return out, grads or {}, tensors


def _pylist(t):
    if hasattr(t, "detach"):
        t = t.detach().to("cpu")
        if t.dtype.is_floating_point:
            t = t.double()
        return t.tolist()
    return t


def compare(ctx, label, got, reference, scale, family):
    """Every non-null element of ``reference`` against ``got`` (tensor or nested list) with the
    tolerance model; raises Falsified at the first element out of bound, returns the worst ratio."""
    g = _pylist(got)
    if not isinstance(reference, list):
        g = g if not isinstance(g, list) else (g[0] if len(g) == 1 else g)
    worst = 0.0
    fs = dict(_flat(scale)) if scale is not None else {}
    for path, r in _flat(reference):
        if r is None:
            continue
        try:
            value = _at(g, path) if path else g
        except (IndexError, TypeError):
            raise Falsified(f"{label}: the adapter's result has the wrong shape") from None
        if isinstance(value, list):
            raise Falsified(f"{label}{list(path)}: the adapter's result has the wrong shape")
        cmp = tolerance.compare(value, r, fs.get(path), family, ctx.dtype)
        worst = max(worst, cmp.ratio)
        if not cmp.passed:
            raise Falsified(f"{label}{list(path)}: got {value!r}, reference {_fmt(r)}, error {cmp.error:.3g} > "
                            f"bound {cmp.bound:.3g}" + (f" ({cmp.note})" if cmp.note else ""))
    ctx.note(worst)
    return worst


def compare_to_ref(ctx, fid, label, out, grads, r, *, outputs=None, positions=None):
    """Compare the adapter's outputs and gradients with a reference result ``r`` (with scales)."""
    f = REGISTRY[fid]
    names = outputs if outputs is not None else [o.name for o in f.outputs]
    primary = f.grad_of or f.outputs[0].name
    for name in names:
        if name not in out:
            if name != primary:
                continue  # as in the runner: outputs other than the primary one are optional
            raise Falsified(f"{label}: the adapter returned no {name!r}")
        compare(ctx, f"{label} {name}", _cut(out[name], positions), r[name], r["scale"].get(name), f.family)
    for name, g in r["grad"].items():
        if name not in grads:
            raise Falsified(f"{label}: the adapter returned no gradient for {name!r}")
        compare(ctx, f"{label} grad.{name}", _cut(grads[name], positions), g, r["scale"].get(f"grad.{name}"), f.family)


def _cut(t, positions):
    """The first ``positions`` columns of a per-token tensor (padding appended by a property)."""
    if positions is None or not hasattr(t, "dim") or t.dim() < 2:
        return t
    return t[:, :positions]


# Example builders ------------------------------------------------------------------------------
BASE_PARAMS = {"agg.constant": {"divisor": 16}, "dist.cp_reduce": {"ownership": "position"},
               "dist.cp_split": {"ownership": "position"}}
EXCLUDED = ("dist.cp_split",)   # no real inputs: padding/permutation of an owner map is dist's own business


def _adv_shapes(fid):
    try:
        shapes = REGISTRY[fid].input("advantages").shapes
    except KeyError:
        return ()
    return tuple(tuple(s) for s in shapes)


@lru_cache(maxsize=None)
def input_fields(fid: str) -> tuple:
    """The canonical inputs an example of ``fid`` needs with its base parameters: the required ones,
    plus optional ones the reference asks for (for example group_ids for loss.dapo's default
    prompt-mean aggregation), minus those it refuses (an unused log-prob input)."""
    import re

    f = REGISTRY[fid]
    fields = [i.name for i in f.inputs if not i.optional]
    for _ in range(8):
        ex = _batch(pst.SeededSource(1), fid, tuple(fields))
        try:
            evaluate(fid, ex["inputs"], ex["params"])
            return tuple(fields)
        except SpecError as e:
            msg = str(e)
            missing = re.search(r"missing input '(\w+)'", msg)
            given = re.search(r"input '(\w+)' was given", msg)
            if missing and missing.group(1) not in fields:
                fields.append(missing.group(1))
            elif given and given.group(1) in fields:
                fields.remove(given.group(1))
            else:
                raise
    raise RuntimeError(f"{fid}: could not find a valid input set")


def _batch(src, fid, fields, **kw):
    shapes = _adv_shapes(fid)
    if "advantages" in fields and ("B", "T") not in shapes:
        kw["per_token_advantages"] = False
    if "advantages" in fields and ("B",) not in shapes:
        kw["per_token_advantages"] = True
    kw.setdefault("max_B", 4)
    kw.setdefault("max_T", 6)
    data = pst.padded_batch(src, fields, **kw)
    return {"inputs": {k: data[k] for k in fields}, "params": dict(BASE_PARAMS.get(fid, {}))}


def formula_example(src, fid, **kw):
    """A random valid example of ``fid``: ragged mask, junk (NaN/inf) at masked positions."""
    return _batch(src, fid, input_fields(fid), **kw)


def _has_mask(fid):
    return REGISTRY[fid].mask_input is not None


def _token_inputs(fid, inputs):
    """Names of the inputs of ``inputs`` that are per-token ([B,T] or [B,T,V])."""
    f = REGISTRY[fid]
    out = []
    for name in inputs:
        shapes = f.input(name).shapes
        if any(len(s) >= 2 and s[0] == "B" and s[1] == "T" for s in shapes) and isinstance(inputs[name][0] if inputs[name] else None, list):
            out.append(name)
    return out


def _seq_inputs(fid, inputs):
    f = REGISTRY[fid]
    return [n for n in inputs if any(len(s) >= 1 and s[0] == "B" for s in f.input(n).shapes)]


# ================================================================================================
# prop.padding: extra masked tokens (any values, NaN and +-inf included) change nothing
# ================================================================================================
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
    ex = formula_example(src, fid)
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


# ================================================================================================
# prop.permutation: permuting the batch's rows permutes per-sequence results, keeps the rest
# ================================================================================================
def _perm_formulas():
    return tuple(fid for fid in sorted(REGISTRY) if REGISTRY[fid].family != "dist")


def _permute(fid, inputs, perm):
    seq = _seq_inputs(fid, inputs)
    return {n: ([x[p] for p in perm] if n in seq else x) for n, x in inputs.items()}


def _perm_build(src, fid):
    ex = formula_example(src, fid, max_B=5)
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


def _perm_adapter(ctx, fid, ex):
    _need(ctx, fid)
    a = _permuted_ref(fid, ref(fid, ex["inputs"], ex["params"]), ex["permutation"])
    out, grads, _ = call(ctx, fid, ex["permuted"], ex["params"])
    compare_to_ref(ctx, fid, f"{fid} with rows permuted {ex['permutation']}", out, grads, a)
    return ctx.worst


# ================================================================================================
# prop.group_relabel: renaming prompt groups (any injective map of the ids) changes nothing
# ================================================================================================
def _relabel_formulas():
    return tuple(fid for fid in sorted(REGISTRY) if "group_ids" in input_fields(fid))


def _relabel_build(src, fid):
    ex = formula_example(src, fid, max_B=6)
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


# ================================================================================================
# prop.cp_rank_sum: CP ranks' contributions (full-mask denominators) add up to the cp = 1 value
# ================================================================================================
AGGREGATORS = tuple(ref_agg.AGGREGATORS)

# recipe -> (aggregator, the recipe's params that are aggregator params); unknown recipes are inferred
RECIPE_AGGREGATORS = {
    "loss.grpo": "agg.sample_mean", "loss.gspo": "agg.sample_mean", "loss.sapo": "agg.sample_mean",
    "loss.gmpo": "agg.sample_mean", "loss.luspo": "agg.seq_mean_token_sum", "loss.minirl": "agg.seq_mean_token_sum",
    "loss.vespo": "agg.token_mean", "loss.bnpo": "agg.token_mean", "loss.dr_grpo": "agg.constant",
}


def recipe_aggregator(fid: str, params: dict) -> tuple[str, dict]:
    """(agg.* ID, its parameters) that recipe ``fid`` reduces its ``terms`` with."""
    f = REGISTRY[fid]
    defaults = {p.name: p.default for p in f.params}
    p = {**defaults, **params}
    if "aggregation" in defaults:
        return ("agg.prompt_mean" if p["aggregation"] == "prompt_mean" else "agg.token_mean"), {}
    if fid == "loss.dr_grpo":
        return "agg.constant", {"divisor": p["divisor"], "divide_by": p["divide_by"]}
    if fid in RECIPE_AGGREGATORS:
        return RECIPE_AGGREGATORS[fid], {}
    return _infer_aggregator(fid)


@lru_cache(maxsize=None)
def _infer_aggregator(fid):
    """For a recipe not in the table: the one aggregator (default parameters) that reproduces its
    loss from its terms on a ragged example (distinct lengths separate every candidate)."""
    ex = formula_example(pst.SeededSource(7), fid, B=4, T=6, empty=False)
    ex["inputs"]["mask"] = [[t < n for t in range(6)] for n in (1, 2, 4, 6)]
    if "group_ids" in ex["inputs"]:
        ex["inputs"]["group_ids"] = [0, 0, 0, 1]
    r = evaluate(fid, ex["inputs"], ex["params"])
    found = []
    for a in ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.prompt_mean"):
        inputs = {"values": [[v if v is not None else 0 for v in row] for row in r["terms"]], "mask": ex["inputs"]["mask"]}
        if a == "agg.prompt_mean":
            inputs["group_ids"] = ex["inputs"].get("group_ids", [0, 0, 0, 1])
        if _close(evaluate(a, inputs)["value"], r["loss"]):
            found.append(a)
    if len(found) != 1:
        raise Unsupported(f"{fid}: cannot tell which aggregator reduces its terms (candidates: {found or 'none'})")
    return found[0], {}


def _cp_formulas():
    return AGGREGATORS + tuple(fid for fid in sorted(REGISTRY) if fid.startswith("loss."))


def _cp_build(src, fid):
    cp = pst.cp_partition(src)
    min_prompt = 1 if cp["ownership"] == "logit" else 0
    short = src.boolean(3)   # sequences shorter than 2 cp
    max_T = 2 * cp["cp_size"] - 1 if short and 2 * cp["cp_size"] > 2 else 9
    if fid in AGGREGATORS:
        fields = ("values", "mask") + (("group_ids",) if fid == "agg.prompt_mean" else ()) + \
                 (("document_ids",) if fid == "agg.document_mean" else ())
        data = pst.padded_batch(src, fields, max_T=max(max_T, min_prompt + 1), min_prompt=min_prompt)
        ex = {"inputs": {k: data[k] for k in fields}, "params": dict(BASE_PARAMS.get(fid, {}))}
    else:
        ex = formula_example(src, fid, max_T=max(max_T, min_prompt + 1), min_prompt=min_prompt)
    ex["cp"] = cp
    return ex


def _owner(ex):
    cp = ex["cp"]
    ranks, _, _ = ref_dist.cp_owner_map(ex["inputs"]["mask"], cp["cp_size"], cp["layout"], cp["ownership"], None)
    return ranks


def _rank_masks(ex):
    ranks = _owner(ex)
    mask = ex["inputs"]["mask"]
    return [[[bool(m) and ranks[i][t] == r for t, m in enumerate(row)] for i, row in enumerate(mask)]
            for r in range(ex["cp"]["cp_size"])]


def full_denominator_params(aggregator, inputs, params):
    """``params`` plus every null denominator of ``aggregator`` counted over the whole batch (plain
    ints and lists): what each shard is given."""
    from pgspec.reference._evaluate import check_params

    checked = check_params(REGISTRY[aggregator], params)
    full = ref_agg.full_denominators(aggregator, inputs["mask"], inputs.get("group_ids"), inputs.get("document_ids"),
                                     checked)
    out = dict(params)
    for name in ref_agg.DENOMINATOR_PARAMS[aggregator]:
        out[name] = full[name]
    return out


def _agg_inputs(aggregator, values, inputs, mask=None):
    out = {"values": values, "mask": inputs["mask"] if mask is None else mask}
    if aggregator == "agg.prompt_mean":
        out["group_ids"] = inputs["group_ids"]
    if aggregator == "agg.document_mean":
        out["document_ids"] = inputs["document_ids"]
    return out


def _loss_rank_parts(fid, ex, masks):
    """Reference per-rank (value, gradient) of a recipe: its terms (as differentiable nodes, whole
    sequences seen by every rank) reduced over each rank's tokens with the full-mask denominators."""
    from pgspec.reference import _ad
    from pgspec.reference._evaluate import _collect, check_params, convert_inputs

    f = REGISTRY[fid]
    aggregator, agg_params = recipe_aggregator(fid, ex["params"])
    inputs = ex["inputs"]
    parts = []
    with mp.workdps(60):
        checked = check_params(REGISTRY[aggregator], agg_params)
        full = ref_agg.full_denominators(aggregator, inputs["mask"], inputs.get("group_ids"), None, checked)
        for mask_r in masks:
            converted, leaves = convert_inputs(f, inputs)
            raw = f.func(**converted, **check_params(f, ex["params"]))
            value = ref_agg.apply(aggregator, raw["terms"], mask_r, inputs.get("group_ids"), None, full)
            d = _ad.backward(value)
            parts.append((_ad.value_of(value), _collect(leaves["logprobs"], d)))
    return parts


def _sum_nested(items):
    with mp.workdps(60):
        first = items[0]
        if isinstance(first, list):
            return [_sum_nested([x[k] for x in items]) for k in range(len(first))]
        return mp.fsum(items)


def _cp_reference(fid, ex):
    masks = _rank_masks(ex)
    inputs, params, cp = ex["inputs"], ex["params"], ex["cp"]
    label = f"{fid} cp_size={cp['cp_size']} {cp['layout']} ownership={cp['ownership']}"
    if fid in AGGREGATORS:
        whole = ref(fid, inputs, params)
        fparams = full_denominator_params(fid, inputs, params)
        parts = [evaluate(fid, _agg_inputs(fid, inputs["values"], inputs, m), fparams) for m in masks]
        _assert_same(f"{label}: sum of rank values vs cp=1 value", _sum_nested([p["value"] for p in parts]),
                     whole["value"], _s(whole, "value"))
        _assert_same(f"{label}: sum of rank gradients vs cp=1 gradient",
                     _sum_nested([p["grad"]["values"] for p in parts]), whole["grad"]["values"])
        cpr = evaluate("dist.cp_reduce", inputs, {**cp, "aggregator": fid, "agg_params": params or None})
        _assert_same(f"{label}: dist.cp_reduce partials vs rank values", cpr["partials"], [p["value"] for p in parts])
        _assert_same(f"{label}: dist.cp_reduce gradient", cpr["grad"]["values"], whole["grad"]["values"])
        return
    whole = ref(fid, inputs, params)
    parts = _loss_rank_parts(fid, ex, masks)
    _assert_same(f"{label}: sum of rank losses vs cp=1 loss", _sum_nested([p[0] for p in parts]), whole["loss"],
                 _s(whole, "loss"))
    _assert_same(f"{label}: sum of rank gradients vs cp=1 gradient", _sum_nested([p[1] for p in parts]),
                 whole["grad"]["logprobs"])


def _cp_adapter(ctx, fid, ex):
    torch = _torch()
    inputs, params, cp = ex["inputs"], ex["params"], ex["cp"]
    label = f"{fid} cp_size={cp['cp_size']} {cp['layout']} ownership={cp['ownership']}"
    r = ref(fid, inputs, params)
    family = REGISTRY[fid].family
    if fid in AGGREGATORS:
        _need(ctx, fid)
        fparams = full_denominator_params(fid, inputs, params)
        total, grad_total = 0.0, None
        for k, m in enumerate(_rank_masks(ex)):
            out, grads, _ = call(ctx, fid, _agg_inputs(fid, inputs["values"], inputs, m), fparams)
            rr = ref(fid, _agg_inputs(fid, inputs["values"], inputs, m), fparams)
            compare(ctx, f"{label}: rank {k} value ({fid} on the rank's tokens, whole-batch denominators)",
                    out["value"], rr["value"], _s(rr, "value"), family)
            total += float(out["value"].detach().double())
            g = grads["values"].detach().double()
            grad_total = g if grad_total is None else grad_total + g
        compare(ctx, f"{label}: sum over ranks vs cp=1 value", total, r["value"], _s(r, "value"), family)
        compare(ctx, f"{label}: sum of rank gradients vs cp=1 gradient", grad_total, r["grad"]["values"],
                _s(r, "grad.values"), family)
        if "dist.cp_reduce" in ctx.adapter.capabilities():
            dparams = {**cp, "aggregator": fid, "agg_params": params or None}
            out, grads, _ = call(ctx, "dist.cp_reduce", inputs, dparams)
            cr = ref("dist.cp_reduce", inputs, dparams)
            s = float(out["partials"].detach().double().sum())
            compare(ctx, f"{label}: dist.cp_reduce partials sum vs cp=1 value", s, r["value"], _s(r, "value"),
                    "dist")
            compare(ctx, f"{label}: dist.cp_reduce partials", out["partials"], cr["partials"], _s(cr, "partials"),
                    "dist")
            compare(ctx, f"{label}: dist.cp_reduce gradient", grads["values"], r["grad"]["values"],
                    _s(r, "grad.values"), "dist")
        return ctx.worst
    # a loss recipe: its terms reduced by the adapter's dist.cp_reduce with the recipe's aggregator
    _need(ctx, fid, "dist.cp_reduce")
    aggregator, agg_params = recipe_aggregator(fid, params)
    tensors = _tensors(ctx, fid, inputs)
    with torch.enable_grad():
        out = ctx.adapter.call(fid, tensors, dict(params))
        if "terms" not in out:
            raise Unsupported(f"{ctx.adapter.name}'s {fid} returns no per-token 'terms'")
        cp_in = {"values": out["terms"], "mask": tensors["mask"]}
        if aggregator == "agg.prompt_mean":
            cp_in["group_ids"] = tensors["group_ids"]
        cpo = ctx.adapter.call("dist.cp_reduce", cp_in, {**cp, "aggregator": aggregator, "agg_params": agg_params or None})
        partials = cpo["partials"]
        (g,) = torch.autograd.grad(partials.sum(), [tensors["logprobs"]])
    compare(ctx, f"{label}: {fid} loss", out["loss"], r["loss"], _s(r, "loss"), family)
    compare(ctx, f"{label}: sum over ranks of {aggregator}(terms) vs cp=1 loss",
            float(partials.detach().double().sum()), r["loss"], _s(r, "loss"), family)
    compare(ctx, f"{label}: sum of rank gradients vs cp=1 gradient", g, r["grad"]["logprobs"],
            _s(r, "grad.logprobs"), family)
    return ctx.worst


# ================================================================================================
# prop.accumulation: micro-batches with global denominators add up; per-micro-batch means do not
# ================================================================================================
MEGATRON_7452 = {"inputs": {"values": [[6.0, 0.0, 0.0], [2.0, 4.0, 4.0]],
                            "mask": [[True, False, False], [True, True, True]]},
                 "params": {}, "micro_batch_sizes": [1, 1]}


def _acc_build(src, fid):
    fields = ("values", "mask") + (("group_ids",) if fid == "agg.prompt_mean" else ()) + \
             (("document_ids",) if fid == "agg.document_mean" else ())
    data = pst.padded_batch(src, fields, max_B=5, max_T=6)
    B = len(data["mask"])
    return {"inputs": {k: data[k] for k in fields}, "params": dict(BASE_PARAMS.get(fid, {})),
            "micro_batch_sizes": pst.micro_batch_sizes(src, B)}


def _acc_params(fid, ex):
    return {"micro_batch_sizes": ex["micro_batch_sizes"], "aggregator": fid, "agg_params": ex["params"] or None}


def _rows(fid, inputs, start, stop):
    return {n: (x[start:stop] if n in _seq_inputs(fid, inputs) else x) for n, x in inputs.items()}


def _micro_params(fid, fparams, start, stop):
    out = dict(fparams)
    for name in ref_agg.DENOMINATOR_PARAMS[fid]:
        v = out.get(name)
        if isinstance(v, list):
            out[name] = v[start:stop]
    return out


def _acc_reference(fid, ex):
    inputs, params = ex["inputs"], ex["params"]
    whole = ref(fid, inputs, params)
    acc = evaluate("dist.accumulate", inputs, _acc_params(fid, ex))
    label = f"{fid} micro_batch_sizes={ex['micro_batch_sizes']}"
    _assert_same(f"{label}: accumulated total vs whole-batch value", acc["total"], whole["value"], _s(whole, "value"))
    _assert_same(f"{label}: accumulated gradient", acc["grad"]["values"], whole["grad"]["values"])
    fparams = full_denominator_params(fid, inputs, params)
    start, parts = 0, []
    for s in ex["micro_batch_sizes"]:
        parts.append(evaluate(fid, _rows(fid, inputs, start, start + s), _micro_params(fid, fparams, start, start + s))["value"])
        start += s
    _assert_same(f"{label}: micro-batch values (whole-batch denominators) vs contributions", parts, acc["contributions"])


def _acc_adapter(ctx, fid, ex):
    _need(ctx, fid)
    inputs, params = ex["inputs"], ex["params"]
    label = f"{fid} micro_batch_sizes={ex['micro_batch_sizes']}"
    r = ref(fid, inputs, params)
    family = REGISTRY[fid].family
    fparams = full_denominator_params(fid, inputs, params)
    start, total, grads_rows = 0, 0.0, []
    for k, s in enumerate(ex["micro_batch_sizes"]):
        sub, p = _rows(fid, inputs, start, start + s), _micro_params(fid, fparams, start, start + s)
        out, grads, _ = call(ctx, fid, sub, p)
        rr = ref(fid, sub, p)
        compare(ctx, f"{label}: micro-batch {k} ({fid} with the whole batch's denominators)", out["value"], rr["value"],
                _s(rr, "value"), family)
        total += float(out["value"].detach().double())
        grads_rows += grads["values"].detach().double().tolist()
        start += s
    compare(ctx, f"{label}: sum over micro-batches vs whole-batch value", total, r["value"], _s(r, "value"), family)
    compare(ctx, f"{label}: accumulated gradient vs whole-batch gradient", grads_rows, r["grad"]["values"],
            _s(r, "grad.values"), family)
    if "dist.accumulate" in ctx.adapter.capabilities():
        dp = _acc_params(fid, ex)
        out, grads, _ = call(ctx, "dist.accumulate", inputs, dp)
        ra = ref("dist.accumulate", inputs, dp)
        compare_to_ref(ctx, "dist.accumulate", f"{label}: dist.accumulate", out, grads, ra)
    return ctx.worst


def naive_difference(fid, ex) -> tuple:
    """(global total, naive per-micro-batch mean, relative difference) from the reference: the
    documented non-invariance of per-micro-batch normalization (Megatron-LM#7452)."""
    acc = ref("dist.accumulate", ex["inputs"], _acc_params(fid, ex))
    total, naive = acc["total"], acc["naive"]
    with mp.workdps(60):
        rel = abs(naive - total) / abs(total) if total else abs(naive)
    return total, naive, rel


# ================================================================================================
# prop.opsm: OPSM = advantage-gated, negated geometric sequence masking; decided per sequence
# ================================================================================================
OPSM_DELTAS = (0.5, 0.125, 0.25, 0.0)


def _opsm_build(src, fid):
    tok = src.boolean(2)
    data = pst.padded_batch(src, ("logprobs", "sampler_logprobs", "advantages"), max_B=5, max_T=6,
                            per_token_advantages=tok, mismatch=64, empty=True)
    return {"inputs": {k: data[k] for k in ("logprobs", "sampler_logprobs", "advantages", "mask")},
            "params": {"delta": src.choice(OPSM_DELTAS)}}


def _opsm_extra(fid):
    """Hand-made: per-token advantages of both signs in sequences the sampler over-predicts by 0.5
    per token (delta 0.25): the sequence's mean advantage decides for every token."""
    return [{"inputs": {
        "logprobs": [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, "nan"]],
        "sampler_logprobs": [[-0.5, -0.5, -0.5], [-0.5, -0.5, -0.5], [-1.0, -1.0, "inf"]],
        "advantages": [[1.0, -1.0, -1.0], [-1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]],
        "mask": [[True, True, True], [True, True, True], [True, True, False]]},
        "params": {"delta": 0.25}}]


def _geo_params(delta):
    with mp.workdps(60):
        return {"numerator": "logprobs", "lower": mp.nstr(mp.exp(-mpf(delta)), 50), "upper": None}


def _geo_inputs(inputs):
    return {k: inputs[k] for k in ("logprobs", "sampler_logprobs", "mask")}


def _opsm_reference(fid, ex):
    inputs, delta = ex["inputs"], ex["params"]["delta"]
    o = ref(fid, inputs, ex["params"])
    g = evaluate("mask.geometric_sequence", _geo_inputs(inputs), _geo_params(delta))
    for i, row in enumerate(inputs["mask"]):
        if abs(o["seq_stat"][i] - mpf(delta)) <= mpf(10) ** -REF_DIGITS:
            continue   # a tie: exp(-delta) is rounded, the statistic is exact
        gate = o["seq_advantage"][i] >= 0 or g["seq_keep"][i]
        if o["seq_keep"][i] != gate:
            raise Falsified(f"mask.opsm row {i}: seq_keep {o['seq_keep'][i]} but advantage-gated geometric mask gives "
                            f"{gate} (kappa {_fmt(o['seq_stat'][i])}, delta {delta}, A {_fmt(o['seq_advantage'][i])})")
        for t, m in enumerate(row):
            if m and o["keep"][i][t] != o["seq_keep"][i]:
                raise Falsified(f"mask.opsm keep[{i}][{t}] = {o['keep'][i][t]} differs from its sequence's decision")


def _opsm_adapter(ctx, fid, ex):
    _need(ctx, fid)
    inputs, params = ex["inputs"], ex["params"]
    r = ref(fid, inputs, params)
    out, _, tensors = call(ctx, fid, inputs, params)
    seq_keep = _pylist(out["seq_keep"])
    keep = _pylist(out["keep"])
    has_geo = "mask.geometric_sequence" in ctx.adapter.capabilities()
    geo = _pylist(call(ctx, "mask.geometric_sequence", _geo_inputs(inputs), {**_geo_params(params["delta"]),
                                                                              "lower": float(_geo_params(params["delta"])["lower"])})[0]["seq_keep"]) if has_geo else None
    for i, row in enumerate(inputs["mask"]):
        scale = _s(r, "seq_stat", i)
        near = abs(r["seq_stat"][i] - mpf(params["delta"])) <= tolerance.bound("mask", ctx.dtype, scale) * 2
        if not near and bool(seq_keep[i]) != r["seq_keep"][i]:
            raise Falsified(f"mask.opsm row {i}: seq_keep {bool(seq_keep[i])}, reference {r['seq_keep'][i]} (kappa "
                            f"{_fmt(r['seq_stat'][i])}, delta {params['delta']}, sequence advantage "
                            f"{_fmt(r['seq_advantage'][i])})")
        for t, m in enumerate(row):
            if m and bool(keep[i][t]) != bool(seq_keep[i]):
                raise Falsified(f"mask.opsm keep[{i}][{t}] = {bool(keep[i][t])} but the sequence's decision is "
                                f"{bool(seq_keep[i])}: OPSM must be decided per sequence (by the sequence's mean "
                                f"advantage), not per token")
            if m and not near and bool(keep[i][t]) != r["seq_keep"][i]:
                raise Falsified(f"mask.opsm keep[{i}][{t}] = {bool(keep[i][t])}, reference {r['seq_keep'][i]}")
        if has_geo and not near:
            gate = r["seq_advantage"][i] >= 0 or bool(geo[i])
            if bool(seq_keep[i]) != gate:
                raise Falsified(f"mask.opsm row {i}: seq_keep {bool(seq_keep[i])} but the adapter's "
                                f"mask.geometric_sequence gated by the advantage's sign gives {gate}")
    return ctx.worst


# ================================================================================================
# prop.length_independence: repeating a sequence leaves geometric means unchanged; exp(sum) collapses
# ================================================================================================
GEOMETRIC = ("ratio.sequence_geometric", "is.geometric.truncate", "is.geometric.mask", "mask.geometric_sequence")
COLLAPSING = ("ratio.sequence_product",)


def _length_formulas():
    return tuple(f for f in GEOMETRIC + COLLAPSING if f in REGISTRY)


def _repeat(fid, inputs, k):
    tok = _token_inputs(fid, inputs)
    return {n: ([row * k for row in x] if n in tok else x) for n, x in inputs.items()}


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
    rep = _repeat(fid, ex["inputs"], k)
    rr = ref(fid, rep, ex["params"])
    out, grads, _ = call(ctx, fid, rep, ex["params"])
    L = max(sum(row) for row in rep["mask"])
    compare_to_ref(ctx, fid, f"{fid} with every sequence repeated {k} times ({L} tokens)", out, grads, rr)
    if fid in GEOMETRIC:
        r = ref(fid, ex["inputs"], ex["params"])
        out1, _, _ = call(ctx, fid, ex["inputs"], ex["params"])
        name = REGISTRY[fid].outputs[0].name if fid.startswith("ratio.") else "seq_ratio"
        a = _pylist(out1[name])
        b = _pylist(out[name])
        for i, (x, y) in enumerate(zip(a, b)):
            bound = float(tolerance.bound(REGISTRY[fid].family, ctx.dtype, _s(r, name, i)) +
                          tolerance.bound(REGISTRY[fid].family, ctx.dtype, _s(rr, name, i)))
            if not abs(x - y) <= bound:
                raise Falsified(f"{fid} {name}[{i}]: {x!r} for the sequence, {y!r} for it repeated {k} times: the "
                                f"geometric mean must not depend on length (exp(sum) where exp(mean) is specified?)")
    return ctx.worst


# ================================================================================================
# prop.on_policy: ratio = 1 => GSPO = GRPO sample-mean PG (value and gradient); clips inactive
# ================================================================================================
# formula -> (partner, how the partner is reduced to compare, whether values agree (else gradients only))
ON_POLICY = {
    "surrogate.ppo_clip": ("surrogate.pg", "token", True),
    "surrogate.dual_clip": ("surrogate.pg", "token", True),
    "surrogate.trl_delta": ("surrogate.pg", "token", True),
    "surrogate.cispo": ("surrogate.pg", "token", False),
    "surrogate.sapo": ("surrogate.pg", "token", False),
    "surrogate.gspo": ("surrogate.pg", "sequence", True),
    "surrogate.gmpo": ("surrogate.pg", "sequence", True),
    "loss.gspo": ("loss.grpo", "loss", True),
    "loss.gmpo": ("loss.grpo", "loss", True),
    "loss.sapo": ("loss.grpo", "loss", False),
}


def _on_policy_formulas():
    return tuple(f for f in ON_POLICY if f in REGISTRY and ON_POLICY[f][0] in REGISTRY)


def _on_policy_params(fid, src):
    p = {}
    if fid in ("surrogate.ppo_clip", "surrogate.dual_clip"):
        p = {"eps_low": src.choice((0.0, 0.2, 0.28)), "eps_high": src.choice((0.0, 0.2, 0.28))}
    if fid.startswith("loss."):
        p = {}
    return p


def _on_policy_build(src, fid):
    partner = ON_POLICY[fid][0]
    fields = tuple(dict.fromkeys(input_fields(fid) + input_fields(partner)))
    ex = _batch(src, fid, tuple(f for f in fields if f not in ("ref_logprobs",)))
    ex["inputs"]["old_logprobs"] = [list(row) for row in ex["inputs"]["logprobs"]]   # ratio = 1
    ex["params"] = _on_policy_params(fid, src)
    ex["partner_params"] = {"beta": 0.0} if partner == "loss.grpo" else {}
    return ex


def _partner_inputs(fid, ex):
    partner = ON_POLICY[fid][0]
    return {k: v for k, v in ex["inputs"].items() if k in input_fields(partner) or k == "old_logprobs"}


def _reduce_partner(fid, ex, p):
    """The partner's reference value (and gradient) in the shape of ``fid``'s result."""
    kind = ON_POLICY[fid][1]
    mask = ex["inputs"]["mask"]
    with mp.workdps(60):
        if kind == "sequence":
            vals = []
            for i, row in enumerate(mask):
                ts = [t for t, m in enumerate(row) if m]
                vals.append(mp.fsum(p["loss"][i][t] for t in ts) / len(ts) if ts else mpf(0))
            grad = [[(g / sum(row)) if row[t] else mpf(0) for t, g in enumerate(grow)]
                    for grow, row in zip(p["grad"]["logprobs"], mask)]
            return vals, grad
        return p["loss"], p["grad"]["logprobs"]


def _on_policy_reference(fid, ex):
    partner, _, values = ON_POLICY[fid]
    a = ref(fid, ex["inputs"], ex["params"])
    p = evaluate(partner, _partner_inputs(fid, ex), ex["partner_params"])
    value, grad = _reduce_partner(fid, ex, p)
    if values:
        _assert_same(f"{fid} at ratio 1 vs {partner}", a["loss"], value)
    _assert_same(f"{fid} gradient at ratio 1 vs {partner}", a["grad"]["logprobs"], grad)


def _on_policy_adapter(ctx, fid, ex):
    partner, _, values = ON_POLICY[fid]
    _need(ctx, fid)
    a = ref(fid, ex["inputs"], ex["params"])
    out, grads, _ = call(ctx, fid, ex["inputs"], ex["params"])
    label = f"{fid} at ratio 1 (logprobs = old_logprobs)"
    compare_to_ref(ctx, fid, label, out, grads, a)
    if partner in ctx.adapter.capabilities():
        pin = _partner_inputs(fid, ex)
        p = ref(partner, pin, ex["partner_params"])
        pout, pgrads, _ = call(ctx, partner, pin, ex["partner_params"])
        compare_to_ref(ctx, partner, f"{partner} at ratio 1 (the on-policy partner of {fid})", pout, pgrads, p)
        if ON_POLICY[fid][1] == "loss":
            if values:
                compare(ctx, f"{fid} vs the adapter's {partner} at ratio 1", _pylist(out["loss"]), p["loss"],
                        _s(p, "loss"), "loss")
            compare(ctx, f"{fid} gradient vs the adapter's {partner} at ratio 1", _pylist(grads["logprobs"]),
                    p["grad"]["logprobs"], _s(p, "grad.logprobs"), "loss")
    return ctx.worst


# ================================================================================================
# prop.clamp: clamp bounds hold at any input; clamped tokens have zero gradient on the clamped side
# ================================================================================================
def _kl_estimate(fid, x):
    return {"kl.k1": -x, "kl.k2": x * x / 2, "kl.k3": mp.expm1(x) - x, "kl.abs": abs(x)}[fid]


def _clamp_checks(fid, ex, out, grad, tol, closed_form=True):
    """Violations of the clamp spec of ``fid`` in (out, grad) (nested lists of floats or mpf).
    ``tol(value)`` is the slack allowed in a bound comparison (0 on the reference)."""
    with mp.workdps(60):
        return _clamp_checks_at_precision(fid, ex, out, grad, tol, closed_form)


def _clamp_checks_at_precision(fid, ex, out, grad, tol, closed_form):
    p, inputs = ex["params"], ex["inputs"]
    mask = inputs["mask"]
    bad = []
    exp = lambda x: mp.exp(mpf(x))  # noqa: E731
    rows = range(len(mask))

    def within(label, v, lo, hi):
        if v is None:
            return
        v = mpf(v)
        if not mp.isfinite(v) or (lo is not None and v < lo - tol(lo)) or (hi is not None and v > hi + tol(hi)):
            bad.append(f"{label} = {_fmt(v)} outside [{_fmt(lo)}, {_fmt(hi)}]")

    def zero_grad(label, g):
        if g != 0:
            bad.append(f"{label}: gradient {_fmt(g)} on the clamped side (must be exactly 0)")

    def d(i, t, a="logprobs", b="old_logprobs"):
        return mpf(inputs[a][i][t]) - mpf(inputs[b][i][t])

    if fid == "ratio.token":
        c = mpf(p["log_ratio_clamp"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                if m:
                    within(f"ratio[{i}][{t}]", out["ratio"][i][t], exp(-c), exp(c))
                    if abs(d(i, t)) > c:
                        zero_grad(f"ratio[{i}][{t}]", grad[i][t])
    elif fid == "ratio.sequence_product":
        c = mpf(p["log_ratio_clamp"])
        for i in rows:
            within(f"ratio[{i}]", out["ratio"][i], exp(-c), exp(c))
            if abs(mp.fsum(d(i, t) for t, m in enumerate(mask[i]) if m)) > c:
                for t, m in enumerate(mask[i]):
                    if m:
                        zero_grad(f"ratio[{i}] token {t}", grad[i][t])
    elif fid in ("ratio.sequence_geometric", "ratio.gspo_token"):
        c = mpf(p["log_ratio_max"])
        for i in rows:
            vals = out["ratio"][i] if isinstance(out["ratio"][i], list) else [out["ratio"][i]]
            for v in vals:
                within(f"ratio[{i}]", v, None, exp(c))
            ts = [t for t, m in enumerate(mask[i]) if m]
            if fid == "ratio.sequence_geometric" and ts and mp.fsum(d(i, t) for t in ts) / len(ts) > c:
                for t in ts:
                    zero_grad(f"ratio[{i}] token {t}", grad[i][t])
    elif fid.startswith("is.") and fid.endswith(".truncate"):
        lo = mpf(p["c_min"]) if p.get("c_min") is not None else None
        hi = mpf(p["c_max"]) if p.get("c_max") is not None else None
        for i in rows:
            for t, m in enumerate(mask[i]):
                if m:
                    within(f"weight[{i}][{t}]", out["weight"][i][t], lo, hi)
    elif fid.startswith("is.") and fid.endswith(".mask"):
        lo, hi = mpf(p["c_min"]), mpf(p["c_max"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                w = out["weight"][i][t]
                if m and w is not None and mpf(w) != 0:
                    within(f"weight[{i}][{t}] (kept)", w, lo, hi)
    elif fid in ("kl.k1", "kl.k2", "kl.k3", "kl.abs"):
        a, b = p.get("log_ratio_min"), p.get("log_ratio_max")
        lo, hi = p.get("output_min"), p.get("output_max")
        for i in rows:
            for t, m in enumerate(mask[i]):
                if not m:
                    continue
                x = d(i, t, "ref_logprobs", "logprobs")
                xc = min(max(x, mpf(a)), mpf(b)) if a is not None else x
                want = _kl_estimate(fid, xc)
                if lo is not None:
                    want = min(max(want, mpf(lo)), mpf(hi))
                v = out["kl"][i][t]
                if closed_form and (v is None or not mp.isfinite(mpf(v))
                                    or abs(mpf(v) - want) > tol(want) + mpf(10) ** -REF_DIGITS * (1 + abs(want))):
                    bad.append(f"kl[{i}][{t}] = {_fmt(v)} at x = {_fmt(x)}, but the clamp of x to [{a}, {b}] comes "
                               f"first: {fid} of the clamped x{' then clamped to the output bounds' if lo is not None else ''} "
                               f"is {_fmt(want)}")
                if (a is not None and (x < mpf(a) or x > mpf(b))) or (lo is not None and not (mpf(lo) < want < mpf(hi))):
                    zero_grad(f"kl[{i}][{t}]", grad[i][t])
    elif fid == "surrogate.ppo_clip":
        el, eh = mpf(p["eps_low"]), mpf(p["eps_high"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                if not m:
                    continue
                A = mpf(inputs["advantages"][i]) if not isinstance(inputs["advantages"][i], list) else mpf(inputs["advantages"][i][t])
                r = exp(d(i, t))
                if (A > 0 and r > 1 + eh) or (A < 0 and r < 1 - el):
                    zero_grad(f"loss[{i}][{t}] (A = {_fmt(A)}, r = {_fmt(r)})", grad[i][t])
    elif fid == "surrogate.cispo":
        if p.get("cap_form") == "absolute":
            lo, hi = None, mpf(p["eps_high"])
        else:
            lo, hi = 1 - mpf(p["eps_low"]), 1 + mpf(p["eps_high"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                if m:
                    within(f"weight[{i}][{t}]", out["weight"][i][t], lo, hi)
    return bad


CLAMP_PARAMS = {
    "ratio.token": ({"log_ratio_clamp": 20.0}, {"log_ratio_clamp": 0.125}),
    "ratio.sequence_product": ({"log_ratio_clamp": 20.0}, {"log_ratio_clamp": 1.0}),
    "ratio.sequence_geometric": ({"log_ratio_max": 10.0}, {"log_ratio_max": 0.0625}),
    "ratio.gspo_token": ({"log_ratio_max": 10.0}, {"log_ratio_max": 0.0625}),
    "is.token.truncate": ({"c_min": 0.5, "c_max": 2.0},),
    "is.sequence.truncate": ({"c_min": 0.5, "c_max": 2.0, "log_ratio_clamp": 20.0},),
    "is.geometric.truncate": ({"c_min": 0.5, "c_max": 2.0},),
    "is.token.mask": ({"c_min": 0.5, "c_max": 5.0},),
    "is.sequence.mask": ({"c_min": 0.5, "c_max": 5.0, "log_ratio_clamp": 20.0},),
    "is.geometric.mask": ({"c_min": 0.5, "c_max": 5.0},),
    "kl.k1": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
              {"log_ratio_min": -1.0, "log_ratio_max": 1.0}),
    "kl.k2": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
              {"log_ratio_min": -1.0, "log_ratio_max": 1.0}),
    "kl.k3": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
              {"log_ratio_min": -20.0, "log_ratio_max": 20.0}, {"log_ratio_min": -1.0, "log_ratio_max": 1.0}),
    "kl.abs": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},),
    "surrogate.ppo_clip": ({"eps_low": 0.2, "eps_high": 0.28, "log_ratio_clamp": 20.0}, {"eps_low": 0.2, "eps_high": 0.2}),
    "surrogate.cispo": ({"cap_form": "relative", "eps_low": 0.2, "eps_high": 0.28},
                        {"cap_form": "absolute", "eps_high": 5.0}),
}


def _clamp_formulas():
    return tuple(f for f in CLAMP_PARAMS if f in REGISTRY)


def _clamp_build(src, fid):
    ex = formula_example(src, fid, extreme=True, mismatch=48)
    ex["params"] = dict(src.choice(CLAMP_PARAMS[fid]))
    return ex


def _clamp_extra(fid):
    """Every parameter set of the formula on one batch with log-ratios of +-20 and +-200."""
    out = []
    for k, params in enumerate(CLAMP_PARAMS[fid]):
        ex = formula_example(pst.SeededSource(zlib.crc32(f"clamp/{fid}/{k}".encode())), fid, extreme=True, B=4, T=6,
                             empty=False)
        ex["params"] = dict(params)
        out.append(ex)
    return out


def _clamp_reference(fid, ex):
    r = ref(fid, ex["inputs"], ex["params"])
    bad = _clamp_checks(fid, ex, r, r["grad"].get("logprobs"), lambda v: 0)
    if bad:
        raise Falsified(f"{fid} {ex['params']}: " + "; ".join(bad[:3]))


def _clamp_adapter(ctx, fid, ex):
    _need(ctx, fid)
    r = ref(fid, ex["inputs"], ex["params"])
    out, grads, _ = call(ctx, fid, ex["inputs"], ex["params"])
    family = REGISTRY[fid].family
    got = {k: _pylist(v) for k, v in out.items() if k != "grad"}
    g = _pylist(grads["logprobs"]) if "logprobs" in grads else None
    bad = _clamp_checks(fid, ex, got, g, lambda v: tolerance.bound(family, ctx.dtype, abs(mpf(v))) if v is not None else 0,
                        closed_form=False)   # values: compared with the reference below, with its scales
    if bad:
        raise Falsified(f"{fid} {ex['params']}: " + "; ".join(bad[:3]))
    compare_to_ref(ctx, fid, f"{fid} {ex['params']} at log-ratios up to +-200", out, grads, r)
    return ctx.worst


# ================================================================================================
# prop.gradient_fd: the gradient equals a high-precision finite difference (no stop-gradient)
# ================================================================================================
def _constant_sg():
    """Stop-gradients that sit on non-differentiable inputs only (the recipes' IS weight and OPSM
    decision): with those options off, the recipe's gradient is the plain derivative."""
    try:
        from pgspec.reference.loss import STOP_GRADIENTS
    except ImportError:
        return ()
    return tuple(STOP_GRADIENTS)


def _fd_formulas():
    const = set(_constant_sg())
    return tuple(fid for fid, f in sorted(REGISTRY.items())
                 if f.differentiable and not (set(f.stop_gradients) - const) and fid not in EXCLUDED)


def _fd_build(src, fid):
    ex = formula_example(src, fid, max_B=3, max_T=4, junk=True)
    return ex


def _objective_value(fid, inputs, params, dps):
    f = REGISTRY[fid]
    out = evaluate(fid, inputs, params, dps=dps)[f.grad_of]
    with mp.workdps(dps):
        return mp.fsum(v for _, v in _flat(out) if v is not None and not isinstance(v, bool))


def _replace(x, path, value):
    if not path:
        return value
    x = list(x)
    x[path[0]] = _replace(x[path[0]], path[1:], value)
    return x


def _fd_reference(fid, ex):
    f = REGISTRY[fid]
    r = ref(fid, ex["inputs"], ex["params"])
    dps = 110
    for name in f.differentiable:
        if name not in ex["inputs"]:
            continue
        for path, g in _flat(r["grad"][name]):
            with mp.workdps(dps):
                x0 = mpf(_at(ex["inputs"][name], path)) if mp.isfinite(mpf(_at(ex["inputs"][name], path))) else None
                mask = ex["inputs"].get("mask")
                if x0 is None or (mask is not None and not mask[path[0]][path[1]]):
                    if g != 0:
                        raise Falsified(f"{fid} grad.{name}{list(path)} = {_fmt(g)} at a masked position")
                    continue
                h = mpf(10) ** -25
                vals = {}
                for s in (-1, 0, 1):
                    inp = dict(ex["inputs"], **{name: _replace(ex["inputs"][name], path, mp.nstr(x0 + s * h, 100))})
                    vals[s] = _objective_value(fid, inp, ex["params"], dps)
                right, left = (vals[1] - vals[0]) / h, (vals[0] - vals[-1]) / h
                if abs(right - left) > mpf(10) ** -15 * (1 + abs(right) + abs(left)):
                    continue   # a kink (clip bound, tie, |x| at 0): the derivative is the spec's convention
                fd = (vals[1] - vals[-1]) / (2 * h)
                if abs(fd - g) > mpf(10) ** -20 * max(1, abs(fd)):
                    raise Falsified(f"{fid} grad.{name}{list(path)} = {_fmt(g)}, finite difference {_fmt(fd)}")


@lru_cache(maxsize=4096)
def _adapter_fd(adapter_key, fid, key):
    """Central differences of the adapter's float64 objective (cached per adapter and example)."""
    ctx, ex = _FD_CTX[adapter_key], decode(json.loads(key))[0]
    torch = _torch()
    f = REGISTRY[fid]
    from . import runner

    def objective(inputs):
        tensors = runner.to_tensors(fid, inputs, "float64", ctx.device)
        with torch.no_grad():
            out = ctx.adapter.call(fid, tensors, dict(ex["params"]))
            return float(runner._objective(out[f.grad_of], tensors.get("mask")))

    res = {}
    f0 = objective(ex["inputs"])
    for name in f.differentiable:
        if name not in ex["inputs"]:
            continue
        mask = ex["inputs"].get("mask")
        for path, x in _flat(ex["inputs"][name]):
            if mask is not None and not mask[path[0]][path[1]]:
                continue
            h = 2.0 ** -20 * max(1.0, abs(x))
            fp = objective(dict(ex["inputs"], **{name: _replace(ex["inputs"][name], path, x + h)}))
            fm = objective(dict(ex["inputs"], **{name: _replace(ex["inputs"][name], path, x - h)}))
            right, left = (fp - f0) / h, (f0 - fm) / h
            err = 16 * 2.0 ** -53 * (abs(fp) + abs(fm) + abs(f0)) / h
            if abs(right - left) > 1e-3 * (1 + abs(right) + abs(left)):
                continue   # a kink: not comparable
            res[(name, path)] = ((fp - fm) / (2 * h), err + abs(right - left))
    return res


_FD_CTX: dict = {}


def _fd_adapter(ctx, fid, ex):
    _need(ctx, fid)
    if "float64" not in ctx.adapter.dtypes:
        raise Unsupported(f"{ctx.adapter.name} has no float64: no finite difference to compare with")
    r = ref(fid, ex["inputs"], ex["params"])
    out, grads, _ = call(ctx, fid, ex["inputs"], ex["params"])
    akey = f"{ctx.adapter.name}:{id(ctx.adapter)}"
    _FD_CTX[akey] = ctx
    fds = _adapter_fd(akey, fid, _key(ex))
    family = REGISTRY[fid].family
    worst = 0.0
    for (name, path), (fd, err) in fds.items():
        got = _at(_pylist(grads[name]), path)
        scale = _s(r, f"grad.{name}", *path)
        if scale is None:
            scale = abs(_at(r["grad"][name], path))
        bound = float(tolerance.bound(family, ctx.dtype, scale)) + err
        ratio = abs(got - fd) / bound if bound else (0.0 if got == fd else math.inf)
        worst = max(worst, ratio)
        if not abs(got - fd) <= bound:
            raise Falsified(f"{fid} grad.{name}{list(path)}: autograd {got!r}, central finite difference of the "
                            f"adapter's float64 value {fd!r} (bound {bound:.3g}): a wrong backward or a misplaced "
                            f"detach?")
    ctx.note(worst)
    return ctx.worst


# ================================================================================================
# The registry
# ================================================================================================
PROPERTIES: dict[str, Property] = {}


def _register(p: Property):
    PROPERTIES[p.id] = p


_register(Property("prop.cp_rank_sum", "CP rank-sum invariance (zig-zag split, thd and bshd, full-mask denominators)",
                   _cp_formulas, _cp_build, _cp_reference, _cp_adapter))
_register(Property("prop.accumulation", "Micro-batch accumulation invariance with global denominators",
                   lambda: AGGREGATORS, _acc_build, _acc_reference, _acc_adapter,
                   lambda fid: [MEGATRON_7452] if fid == "agg.token_mean" else []))
_register(Property("prop.opsm", "OPSM = advantage-gated negated geometric sequence masking, decided per sequence",
                   lambda: ("mask.opsm",) if "mask.opsm" in REGISTRY else (), _opsm_build, _opsm_reference,
                   _opsm_adapter, _opsm_extra))
_register(Property("prop.length_independence",
                   "Geometric means do not depend on length; the sequence product collapses exponentially",
                   _length_formulas, _length_build, _length_reference, _length_adapter, _length_extra))
_register(Property("prop.on_policy", "On-policy (ratio = 1): GSPO = GRPO sample-mean PG, clips inactive",
                   _on_policy_formulas, _on_policy_build, _on_policy_reference, _on_policy_adapter))
_register(Property("prop.padding", "Padding invariance: masked tokens with any values (NaN, +-inf) change nothing",
                   _padding_formulas, _padding_build, _padding_reference, _padding_adapter))
_register(Property("prop.permutation", "Batch permutation invariance",
                   _perm_formulas, _perm_build, _perm_reference, _perm_adapter))
_register(Property("prop.group_relabel", "Group relabeling invariance",
                   _relabel_formulas, _relabel_build, _relabel_reference, _relabel_adapter))
_register(Property("prop.clamp", "Clamp bounds hold at any input; zero gradient on the clamped side",
                   _clamp_formulas, _clamp_build, _clamp_reference, _clamp_adapter, _clamp_extra))
_register(Property("prop.gradient_fd", "Gradient = high-precision finite difference where no stop-gradient applies",
                   _fd_formulas, _fd_build, _fd_reference, _fd_adapter))


# ================================================================================================
# Public entry points
# ================================================================================================
def fixed_examples(prop_id: str, fid: str, n: int = FIXED_EXAMPLES) -> list[dict]:
    """The fixed examples ``run_properties`` uses: ``n`` drawn from seeded sources (seed = CRC-32
    of "<property>/<formula>/<k>"), then the property's hand-made ones.  Identical on every run."""
    prop = PROPERTIES[prop_id]
    out = [prop.build(pst.SeededSource(zlib.crc32(f"{prop_id}/{fid}/{k}".encode())), fid) for k in range(n)]
    return out + [decode(e) for e in prop.extra_examples(fid)]


_FIXED_CACHE: dict = {}


def _fixed(prop_id, fid):
    key = (prop_id, fid)
    if key not in _FIXED_CACHE:
        _FIXED_CACHE[key] = fixed_examples(prop_id, fid)
    return _FIXED_CACHE[key]


def check_reference(prop_id: str, formulas=None, **hypothesis_settings):
    """Check property ``prop_id`` on the reference with hypothesis, for each applicable formula
    (or those given).  Settings default to the CI profile: derandomize=True, max_examples=5,
    no deadline, no example database.  Raises on the first falsifying example."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    prop = PROPERTIES[prop_id]
    chosen = prop.formulas if formulas is None else tuple([formulas] if isinstance(formulas, str) else formulas)
    s = dict(derandomize=True, max_examples=5, deadline=None, database=None,
             suppress_health_check=list(HealthCheck))
    s.update(hypothesis_settings)
    def make(fid):
        @settings(**s)
        @given(st.data())
        def run(data):
            example = prop.build(pst.DrawSource(data.draw), fid)
            prop.reference(fid, example)

        return run

    for fid in chosen:
        make(fid)()
        for extra in prop.extra_examples(fid):
            prop.reference(fid, decode(extra))


def check_example(adapter, prop_id: str, fid: str, example: dict, dtype: str = "float64", device: str = "cpu",
                  adapter_spec: str | None = None) -> PropertyResult:
    """Run one property on one example (JSON form accepted) for an adapter: the repro entry point."""
    prop = PROPERTIES[prop_id]
    example = decode(example)
    ctx = Ctx(adapter, dtype, device)
    res = PropertyResult(prop_id, fid, dtype, device, "pass", examples=1)
    try:
        prop.adapter(ctx, fid, example)
        res.error_ratio = ctx.worst
    except Unsupported as e:
        res.outcome, res.message = "unsupported", str(e)
    except Falsified as e:
        res.outcome, res.message, res.error_ratio = "fail", f"{prop_id}: {e}", math.inf
        res.example = encode(example)
        res.repro = repro_snippet(adapter_spec or adapter.name, prop_id, fid, example, dtype, device)
    except Exception:  # noqa: BLE001 - a crash of the implementation is an outcome
        res.outcome, res.message = "error", traceback.format_exc(limit=-6)
        res.example = encode(example)
        res.repro = repro_snippet(adapter_spec or adapter.name, prop_id, fid, example, dtype, device)
    return res


def run_properties(adapter, dtype: str, device: str, formulas_glob: str = "*", *, properties: str = "*",
                   adapter_spec: str | None = None) -> list[PropertyResult]:
    """Every property on every applicable formula matching ``formulas_glob`` (comma-separated
    globs over formula IDs), on the fixed examples: one PropertyResult per (property, formula)."""
    globs = [g.strip() for g in formulas_glob.split(",") if g.strip()]
    pglobs = [g.strip() for g in properties.split(",") if g.strip()]
    results = []
    for pid, prop in PROPERTIES.items():
        if not any(fnmatch.fnmatchcase(pid, g) for g in pglobs):
            continue
        for fid in prop.formulas:
            if not any(fnmatch.fnmatchcase(fid, g) for g in globs):
                continue
            res = PropertyResult(pid, fid, dtype, device, "pass", error_ratio=0.0)
            examples = _fixed(pid, fid)
            for ex in examples:
                one = check_example(adapter, pid, fid, ex, dtype, device, adapter_spec)
                res.examples += 1
                if one.outcome != "pass":
                    one.examples = res.examples
                    res = one
                    break
                res.error_ratio = max(res.error_ratio or 0.0, one.error_ratio or 0.0)
            if res.outcome == "pass":
                res.message = f"{len(examples)} example(s); {prop.title}"
            results.append(res)
    return results


def repro_snippet(adapter: str, prop_id: str, fid: str, example: dict, dtype: str, device: str) -> str:
    data = json.dumps(encode(example), sort_keys=True)
    return (
        "import json\n"
        "from pgspec.conformance.properties import check_example\n"
        "from pgspec.conformance.runner import load_adapter\n"
        f"adapter = load_adapter({adapter!r})\n"
        f"example = json.loads({data!r})\n"
        f"print(check_example(adapter, {prop_id!r}, {fid!r}, example, {dtype!r}, {device!r}))\n"
    )


__all__ = ["PROPERTIES", "Property", "PropertyResult", "check_reference", "run_properties", "check_example",
           "fixed_examples", "formula_example", "recipe_aggregator", "full_denominator_params", "naive_difference",
           "ON_POLICY", "CLAMP_PARAMS"]
