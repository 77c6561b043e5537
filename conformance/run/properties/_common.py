"""Shared by the property modules: results, examples, the reference (cached), adapter calls and
comparisons through the comparison core (conformance/judge/compare.py)."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import os
import pickle
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Callable

from mpmath import mp, mpf

from pgspec.adapters.base import Unsupported  # noqa: F401 - the adapter protocol's (an adapter raises it)
from pgspec.reference import REGISTRY, SpecError, evaluate

from ...corpus import strategies as pst
from ...judge import compare as core
from ...judge import prepared_cache as core_cache
from ...judge import tolerance
from ...base.gcpause import gc_paused


SPEC_PAGE = "spec/properties.md"
OUTCOMES = ("pass", "fail", "error", "unsupported", "not-applicable")
FIXED_EXAMPLES = 2          # seeded examples per (property, formula), plus hand-made ones where listed
REF_DIGITS = 40             # reference invariances hold to this many significant digits


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
    exception: dict | None = None     # an error: {"type", "message", "origin", "where"} (conformance/run/origin.py)
    declaration: dict | None = None   # not applicable: the declaration that refused the example (its summary)
    refused: list | None = None       # not applicable: the parameters that declaration restricts

    def to_json(self):
        # as dataclasses.asdict gives it (a deep copy), without its generic walk: the fields are
        # flat except the example, a tree of JSON values
        d = {name: getattr(self, name) for name in _PROPERTY_RESULT_FIELDS}
        if d["example"] is not None:
            d["example"] = copy.deepcopy(d["example"])
        if d["error_ratio"] is not None and not math.isfinite(d["error_ratio"]):
            d["error_ratio"] = str(d["error_ratio"])
        return d


_PROPERTY_RESULT_FIELDS = tuple(f.name for f in fields(PropertyResult))


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
    """One property check of one adapter at one dtype: ``worst`` is the largest error ratio of
    every comparison it made, evaluated exactly when read (``compare`` leaves each output's
    elements as ratio intervals, compare.largest_ratio evaluates only those that can be the
    largest)."""
    adapter: object
    dtype: str
    device: str
    _worst: float = field(default=0.0, init=False, repr=False)
    _deferred: list = field(default_factory=list, init=False, repr=False)
    _floor: float = field(default=0.0, init=False, repr=False)     # no ratio of the check is below it

    def note(self, ratio):
        """A ratio known exactly."""
        if ratio is not None and ratio > self._worst:
            self._worst = ratio
            self._floor = max(self._floor, ratio)

    def defer(self, d):
        """An output compared (compare.Deferred): its largest ratio, evaluated when ``worst`` is read."""
        if d.ub_max == 0.0 or d.ub_max < self._floor:
            return          # every ratio of it is 0, or below one the check already has
        self._deferred.append(d)
        self._floor = max(self._floor, d.lb_max)

    @property
    def worst(self) -> float:
        if self._deferred:
            self._worst = core.largest_ratio(self._deferred, self._worst)
            self._deferred = []
        return self._worst


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


def _json_key(*parts) -> str:
    # JSON with NaN and Infinity as json writes them (read back as floats): exact, and several times
    # faster than encoding the non-finite floats first
    return json.dumps(list(parts), sort_keys=True)


def _key(*parts) -> bytes:
    """The identity of a reference evaluation's arguments, as bytes: the pickle of the parts (each
    dict at their top two levels with its keys sorted) written without its memo, so that equal
    values give equal bytes whatever objects they share.  Equal keys mean equal types and values,
    so equal JSON (``_json_key``, what the evaluation decodes, see ``_parts``); equal values built
    differently (a tuple for a list, a dict deeper down in another order) may get two keys, which
    only costs a second evaluation.  Floats are written as their 8 bytes: on a long example (2 x
    4096 tokens) 0.5 ms, where the JSON text takes 15 ms."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=5)
    pickler.fast = True         # no memo: no reference to an object written earlier
    pickler.dump([_sorted(p) for p in parts])
    return buf.getvalue()


def _sorted(x):
    if type(x) is dict:
        return {k: (_sorted(v) if type(v) is dict else v) for k, v in sorted(x.items())}
    return x


def _parts(key: bytes):
    """The (fid, inputs, params) of a ``_key`` made in this process, as JSON gives them back (tuples
    as lists, the non-finite floats of an encoded example decoded)."""
    return decode(json.loads(_json_key(*pickle.loads(key))))


# The reference, cached (one evaluation serves every dtype and property) ------------------------
@lru_cache(maxsize=4096)
def _ref_cached(key: bytes):
    stored = _disk_get(key)
    if stored is not None:
        return stored
    result = _evaluate_ref(key)
    _disk_put(key, result)
    return result


def _evaluate_ref(key: bytes):
    fid, inputs, params, *rest = _parts(key)
    cotangent = rest[0] if rest else None       # ref(..., cotangent=c): the VJP with c
    try:
        return evaluate(fid, inputs, params, with_scale=True, cotangent=cotangent)
    except TypeError:
        # A reference defect (reported): the scale pass fails when every real input is tracked.
        # Fall back to the scale of the nodes built from the differentiable inputs only (the
        # operations on constant inputs are then not counted: a slight underestimate of S).
        r = evaluate(fid, inputs, params)
        r["scale"] = _scales_differentiable_only(fid, inputs, params)
        return r


# The reference results of the fixed examples, kept on disk between runs: an entry is named by the
# sha256 of the example's key (``_key``), in the folder of the reference's source files, mpmath's
# version, the comparison core's code and this module's (cache.version_dir), so it is the
# evaluation's result bit for bit (mpf values stored exactly as (sign, mantissa, exponent, bits)).
# Under $PGSPEC_CACHE/references/<version> (default ~/.cache/pgspec); PGSPEC_CACHE=off disables it.
def _cache_dir():
    from ...base.cache import version_dir

    # the entry also holds the comparison core's preparation: its code is part of the version; and
    # this module's, which makes the keys and the entries
    return version_dir("references", _reference_digest() + "\0" + core_cache._code_digest() + "\0" + _own_digest())


@lru_cache(maxsize=1)
def _own_digest() -> str:
    import hashlib
    from pathlib import Path

    return hashlib.sha256(Path(__file__).resolve().read_bytes()).hexdigest()


@lru_cache(maxsize=1)
def _reference_digest() -> str:
    import hashlib
    from pathlib import Path

    import mpmath

    import pgspec.reference as package

    h = hashlib.sha256(mpmath.__version__.encode())
    for path in sorted(Path(package.__file__).resolve().parent.rglob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _disk_path(key: bytes):
    d = _cache_dir()
    return None if d is None else d / _disk_name(key)


def _disk_name(key: bytes) -> str:
    import hashlib

    return hashlib.sha256(key).hexdigest() + ".marshal"


# An entry is the sha256 of its payload, then the payload: ``marshal`` data (Python's own format
# for code objects: nested lists, dicts, strings and integers of any size, read back in C) of
# {"key": key, "result": packed, "prepared": [...]}.  An mpf is packed as the tuple (sign, mantissa,
# exponent, bits) of its exact value, and no other tuple occurs; "prepared" holds the comparison
# core's preparation of each output (compare.pack_prepared).  A damaged entry is evaluated again.
def _pack(x):
    if isinstance(x, mpf):
        return x._mpf_
    if isinstance(x, dict):
        return {k: _pack(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_pack(v) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    raise TypeError(f"cannot store {type(x).__name__}")


def _unpack(x, _make=mp.make_mpf):
    if type(x) is tuple:
        return _make(x)
    if type(x) is dict:
        return {k: _unpack(v) for k, v in x.items()}
    if type(x) is list:
        return [_make(v) if type(v) is tuple else _unpack(v) for v in x]
    return x


def _disk_get(key: bytes):
    import hashlib
    import marshal

    d = _cache_dir()
    if d is None:
        return None
    # the entry's file opened by its name (one call per reference: pathlib's joins and a separate
    # existence test cost more than the read)
    try:
        # O_NONBLOCK: a FIFO in the entry's place reads as empty (a miss) instead of blocking forever;
        # a regular file reads as usual
        fd = os.open(os.path.join(d, _disk_name(key)), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read()
    except OSError:         # none, a directory (or an unreadable cache): evaluated
        return None
    try:
        payload = memoryview(raw)[32:]
        if hashlib.sha256(payload).digest() != raw[:32]:
            return None         # damaged: evaluated again
        with gc_paused():   # up to tens of thousands of mpf values, no reference cycles
            stored = marshal.loads(payload)
            if stored.get("key") != key:
                return None
            result = _unpack(stored["result"])
            for (ref, scale), packed in zip(_compared_pairs(result), stored["prepared"]):
                if packed is not None:
                    core.remember_prepared(ref, scale, packed)
        return result
    except (OSError, ValueError, EOFError, KeyError, TypeError, AttributeError):
        return None


def _compared_pairs(result):
    """The (reference, scale) pairs of a result as ``compare`` is given them (a scalar wrapped in
    one-element lists), in a fixed order: the outputs, then the gradients."""
    scales = result.get("scale", {})
    pairs = [(result[k], scales.get(k)) for k in result if k not in ("grad", "scale")]
    pairs += [(g, scales.get(f"grad.{k}")) for k, g in result.get("grad", {}).items()]
    return [(ref, scale) if isinstance(ref, list) else _wrapped(ref, scale) for ref, scale in pairs]


def _disk_put(key: str, result) -> None:
    import hashlib
    import marshal
    import os

    path = _disk_path(key)
    if path is None:
        return
    try:
        # with the comparison core's preparation of each output, which the next run need not redo
        prepared = [core.pack_prepared(core.prepare(ref, scale)) for ref, scale in _compared_pairs(result)]
        data = marshal.dumps({"key": key, "result": _pack(result), "prepared": prepared})
        data = hashlib.sha256(data).digest() + data         # read back only when intact
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    except (OSError, TypeError, ValueError):
        pass  # a read-only or unusable cache only costs time


def _scales_differentiable_only(fid, inputs, params):
    from pgspec.reference._evaluate import _scales, check_params, convert_inputs

    f = REGISTRY[fid]
    with mp.workdps(60):
        converted, leaves = convert_inputs(f, inputs, track_all=False)
        raw = f.func(**converted, **check_params(f, params))
        return _scales(f, raw, leaves)


_BY_IDENTITY: dict = {}


def ref(fid, inputs, params=None, cotangent=None):
    """The reference result (with scales) of ``fid`` on ``inputs``; the same objects asked again
    (a fixed example, once per dtype) are answered without re-encoding them.  ``cotangent``: nested
    floats shaped like the grad_of output, for gradients as the VJP with it (None: ones)."""
    if cotangent is not None:
        return _ref_cached(_key(fid, inputs, params or {}, cotangent))
    ident = (fid, id(inputs), id(params))
    hit = _BY_IDENTITY.get(ident)
    if hit is not None and hit[0] is inputs and hit[1] is params:
        return hit[2]
    result = _ref_cached(_key(fid, inputs, params or {}))
    if len(_BY_IDENTITY) > 4096:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[ident] = (inputs, params, result)
    return result


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


# Calling an adapter the way runner.run_case does (conformance/judge/compare.py) -----------------------
def _torch():
    import torch

    return torch


def _tensors(ctx, fid, inputs):
    return core.to_tensors(fid, inputs, ctx.dtype, ctx.device)


def _need(ctx, *fids):
    caps = ctx.adapter.capabilities()
    missing = [f for f in fids if f not in caps]
    if missing:
        raise Unsupported(f"{ctx.adapter.name} does not implement {', '.join(missing)}")
    if ctx.dtype not in ctx.adapter.dtypes:
        raise Unsupported(f"{ctx.adapter.name} does not support {ctx.dtype}")


def call(ctx, fid, inputs, params, cotangent=None):
    """(outputs, gradients, tensors): the adapter's formula on ``inputs`` (nested lists) in the
    context's dtype and device, gradients as the runner takes them: the VJP of ``grad_of`` with
    ``cotangent`` (None: ones, the unmasked sum)."""
    admit(ctx, fid, inputs, params)
    tensors = _tensors(ctx, fid, inputs)
    out, grads = core.call(ctx.adapter, fid, tensors, params, cotangent=cotangent)
    return out, grads, tensors


def example_cotangent(label: str, fid: str, ex: dict, shape):
    """The cotangent of a property's example (spec/golden-format.md, "Cotangent"): pgspec-cotangent/1
    seeded like a case's, by the ID ``<label>/<fid>/<sha256 of the example>``, as nested floats."""
    import hashlib

    from ...corpus.generator import cotangent_seed, cotangent_values

    digest = hashlib.sha256(_key(fid, ex["inputs"], ex["params"])).hexdigest()[:16]
    return cotangent_values(cotangent_seed(f"{label}/{fid}/{digest}"), list(shape))


def _pylist(t):
    if hasattr(t, "detach"):
        t = t.detach().to("cpu")
        if t.dtype.is_floating_point:
            t = t.double()
        return t.tolist()
    return t


def compare(ctx, label, got, reference, scale, family):
    """Every non-null element of ``reference`` against ``got`` (tensor or nested list) with the
    tolerance model, through the comparison core; raises Falsified at the first element out of
    bound, and gives ``ctx`` the elements' ratios (``ctx.worst``, the largest, is evaluated when
    read)."""
    where = list
    if not isinstance(reference, list):          # a scalar: the result's single value
        g = _pylist(got)
        g = g if not isinstance(g, list) else (g[0] if len(g) == 1 else g)
        if isinstance(g, list):
            raise Falsified(f"{label}[]: the adapter's result has the wrong shape")
        got = [g]
        reference, scale = _wrapped(reference, scale)
        where = lambda path: []  # noqa: E731 - reported as the original path ()
    prep = core.prepare(reference, scale)
    g = core._gather(got, prep)     # a reference here is always a list (a scalar is wrapped above)
    if g is None:
        return _compare_loop(ctx, label, got, reference, scale, family)
    res, deferred = core.compare_deferred(g, prep, family, ctx.dtype)
    if res.failure is not None:
        cmp = res.failure
        raise Falsified(f"{label}{where(res.failure_path)}: got {res.failure_got!r}, reference "
                        f"{_fmt(res.failure_ref)}, error {cmp.error:.3g} > bound {cmp.bound:.3g}"
                        + (f" ({cmp.note})" if cmp.note else ""))
    if deferred is not None:
        ctx.defer(deferred)
    else:
        ctx.note(max(res.worst.ratio, 0.0) if res.worst is not None else 0.0)


_WRAPPED: dict = {}


def _wrapped(reference, scale):
    """A scalar reference and its scale as one-element lists, the same list objects each time the
    same reference is compared (so that its preparation is found again for the next dtype)."""
    key = (id(reference), id(scale))
    hit = _WRAPPED.get(key)
    if hit is None or hit[0] is not reference or hit[1] is not scale:
        if len(_WRAPPED) > 20000:
            _WRAPPED.clear()
        hit = _WRAPPED[key] = (reference, scale, [reference], [scale] if scale is not None else None)
    return hit[2], hit[3]


def _compare_loop(ctx, label, got, reference, scale, family):
    """Element by element (a result not laid out like the reference): wrong shapes are reported."""
    g = _pylist(got)
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


def formula_example(src, fid, *, options=False, **kw):
    """A random valid example of ``fid``: ragged mask, junk (NaN/inf) at masked positions.  With
    ``options`` the formula's options in ``OPTION_DRAWS`` are drawn too (after the batch, so the
    batch is the one drawn without them)."""
    ex = _batch(src, fid, input_fields(fid), **kw)
    return draw_options(src, fid, ex) if options else ex


# Options the property examples draw (issue 36 item 4), each on both sides of its binding region: a
# log-ratio clamp that binds (0.1 < the drawn |l - l_old| <= 1/4, never equal: they are multiples of
# 1/64) and one that does not (none, 3), every aggregation of the KL term, both step divisors and
# advantage gates, every IS level of a recipe.  The properties that hold whatever the options
# (padding, permutation, group relabelling, finite differences) draw them.
OPTION_DRAWS = {
    "log_ratio_clamp": (None, 0.1, 3.0),
    "kl_aggregation": ("policy", "sample_mean", "token_mean"),
    "step_divisor": ("groups", "sequences"),
    "advantage_gate": ("sequence_mean", "token"),
    "is_level": ("none", "token", "sequence", "geometric"),
}
IS_MISMATCH = 4   # |l_old - l_mu| <= 4/64 per token: a sequence's weight stays far inside the TIS cap 2


def draw_options(src, fid, ex):
    """``ex`` with the options of ``OPTION_DRAWS`` that ``fid`` has drawn from ``src`` (a value equal
    to the default is left out); an IS level brings sampler log-probs l_mu = l_old - j/64."""
    declared = {p.name: p for p in REGISTRY[fid].params}
    before = {"inputs": dict(ex["inputs"]), "params": dict(ex["params"])}
    params = ex["params"]
    refused = refused_options(src)
    for name, values in OPTION_DRAWS.items():
        p = declared.get(name)
        if p is None or name in params or name in refused:
            continue
        value = src.choice(values)
        if (value is None and not p.nullable) or value == p.default:
            continue
        params[name] = value
    inputs = ex["inputs"]
    if params.get("is_level", "none") != "none" and "sampler_logprobs" not in inputs:
        old, mask = inputs["old_logprobs"], inputs["mask"]
        inputs["sampler_logprobs"] = [[o - src.integer(-IS_MISMATCH, IS_MISMATCH) / 64 if m else o
                                       for o, m in zip(orow, mrow)] for orow, mrow in zip(old, mask)]
    if params != before["params"]:
        try:
            ref(fid, inputs, params)     # cached: the property evaluates the same example
        except SpecError:                # a combination the formula refuses (loss.vespo folds IS in itself)
            ex.update(before)
    note_drawn(src, *(name for name in ex["params"] if name not in before["params"]))
    return ex


# Drawn options and an adapter's capabilities.  A property's seeded example is shared by every
# adapter; the options it draws must not make it one the adapter cannot take.  The source carries
# the options an adapter refused (``refused_options``: the draws skip them) and records those drawn
# (``drawn_options``), so that run_properties can draw the example again without the refused ones.
def refused_options(src) -> frozenset:
    return getattr(src, "refused_options", frozenset())


def note_drawn(src, *names):
    src.drawn_options = tuple(getattr(src, "drawn_options", ())) + tuple(names)


class NotAdmitted(Unsupported):
    """A call the adapter's declarations place outside what it can take (a ``[[capability]]`` that
    does not admit it, or an ``[[unsupported]]`` entry whose ``when`` holds): as for a golden case,
    the example is not applicable to that adapter (spec/properties.md, "Options and capabilities")."""

    def __init__(self, declaration, fid: str):
        self.declaration = declaration
        self.params = tuple(name for name, _ in declaration.params)
        super().__init__(f"{fid}: {declaration.reason} ({declaration.label})")


def admit(ctx, fid, inputs, params):
    """Raise NotAdmitted when the adapter's declarations refuse ``fid`` on these inputs and
    parameters (what runner.start_case reads for a golden case)."""
    decl = getattr(ctx.adapter, "deviations", None)
    if decl is None or not (decl.capabilities or decl.unsupported):
        return
    case = {"id": "prop:" + hashlib.sha256(_key(fid, inputs, params)).hexdigest(), "formula": fid,
            "inputs": inputs, "params": params}
    for declared in (decl.unsupported_case(case), decl.not_applicable(case)):
        if declared is not None:
            raise NotAdmitted(declared, fid)


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
