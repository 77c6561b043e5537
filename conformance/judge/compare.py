"""The comparison core, below both the runner and the property checks.

Two things live here:

- the **call convention**: how an adapter's formula is called on inputs (``to_tensors``, the
  adapter's ``call``, and the gradients of the unmasked sum of the ``grad_of`` output,
  ``objective``), so that the runner and every property call adapters the same way;
- the **vectorized comparison** of an adapter's result with the reference under the tolerance
  model (spec/tolerance.md).  Every element is first judged in numpy: the reference as a
  double-double (``r_hi + r_lo``), the bound and the error in float64, together with an a-priori
  bound on how far those float64 numbers can be from the exact ones.  An element whose margin
  ``bound - error`` is larger than that slack is decided there; the others (and the non-finite
  ones) are decided by the exact comparison, ``tolerance.compare`` (mpmath).  The worst error
  ratio and the first failure are always evaluated by ``tolerance.compare``, on the few elements
  whose ratio interval can hold the maximum, so what is reported is bit-for-bit what the exact
  comparator reports.  The argument that the fast path decides exactly as the exact comparison
  is in spec/tolerance.md ("Evaluating the comparison").

``PGSPEC_COMPARE=exact`` (or ``set_mode("exact")``) compares every element with
``tolerance.compare``: the reference behaviour the fast path is tested against.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
from dataclasses import dataclass, field
from decimal import Context, Decimal

import numpy as np
from mpmath import libmp, mp, mpf

from pgspec.reference import REGISTRY

from . import tolerance
from ..base.gcpause import gc_paused

# ------------------------------------------------------------------------------------------------
# The call convention
# ------------------------------------------------------------------------------------------------
TORCH_DTYPES = {"float64": "float64", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def to_tensors(formula_id: str, inputs: dict, dtype: str, device: str):
    """The inputs (nested lists as the golden corpus gives them) as tensors of ``dtype``: reals
    in ``dtype`` (exact: golden inputs are bfloat16-exact), masks bool, ids long; the formula's
    differentiable inputs require grad."""
    import torch

    f = REGISTRY[formula_id]
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    tensors = {}
    for name, value in inputs.items():
        kind = f.input(name).kind
        # through numpy: the same values as torch.tensor(nested list), built several times faster
        # (np.array copies: the tensors never share memory with the caller's arrays, see runner.case_arrays)
        if kind == "bool":
            t = torch.from_numpy(np.array(value, dtype=np.bool_))
            t = t if device == "cpu" else t.to(device)
        elif kind == "int":
            t = torch.from_numpy(np.array(value, dtype=np.int64))
            t = t if device == "cpu" else t.to(device)
        else:
            # golden inputs are bfloat16-exact: float64 -> dtype is exact
            t = torch.from_numpy(np.array(value, dtype=np.float64)).to(device=device, dtype=tdtype)
            if name in f.differentiable:
                t.requires_grad_(True)
        tensors[name] = t
    return tensors


def objective(out, mask):
    """Sum of the unmasked elements of the grad_of output (masked ones selected away, never x 0)."""
    import torch

    if mask is not None and out.dim() >= 2 and tuple(out.shape[:2]) == tuple(mask.shape):
        m = mask.reshape(mask.shape + (1,) * (out.dim() - 2))
        out = torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.sum()


def call(adapter, formula_id: str, tensors: dict, params: dict):
    """(outputs, gradients) of the adapter's formula on ``tensors``: the adapter's own gradients
    when it returns them (``out["grad"]``), else autograd of ``objective`` of the ``grad_of``
    output with respect to every differentiable input given (zeros where unused)."""
    import torch

    f = REGISTRY[formula_id]
    with torch.enable_grad():
        out = adapter.call(formula_id, tensors, dict(params))
        grads = out.get("grad")
        diff = [n for n in f.differentiable if n in tensors]
        if grads is None and diff and f.grad_of in out:
            obj = objective(out[f.grad_of], tensors.get("mask"))
            got = torch.autograd.grad(obj, [tensors[n] for n in diff], allow_unused=True)
            grads = {n: (g if g is not None else torch.zeros_like(tensors[n])) for n, g in zip(diff, got)}
    return out, grads or {}


# ------------------------------------------------------------------------------------------------
# Mode and counters
# ------------------------------------------------------------------------------------------------
_MODE = os.environ.get("PGSPEC_COMPARE", "fast")
if _MODE not in ("fast", "exact"):
    raise ValueError(f"PGSPEC_COMPARE must be 'fast' or 'exact', got {_MODE!r}")


def set_mode(mode: str) -> str:
    """Select "fast" (numpy with exact fall-backs) or "exact" (tolerance.compare per element);
    returns the previous mode."""
    global _MODE
    if mode not in ("fast", "exact"):
        raise ValueError(f"mode must be 'fast' or 'exact', got {mode!r}")
    old, _MODE = _MODE, mode
    return old


def mode() -> str:
    return _MODE


@dataclass
class Stats:
    elements: int = 0        # elements compared
    fast: int = 0            # decided in float64 (booleans included: decided exactly by equality)
    fallbacks: int = 0       # finite elements whose margin was within the rounding slack: decided exactly
    special: int = 0         # non-finite reference or result (and float64 overflow): decided exactly
    ratio_evals: int = 0     # exact evaluations of a candidate for the worst ratio or the first failure
    small: int = 0           # elements of outputs of at most SMALL elements, compared exactly

    def reset(self):
        self.elements = self.fast = self.fallbacks = self.special = self.ratio_evals = self.small = 0


STATS = Stats()


# ------------------------------------------------------------------------------------------------
# The reference side, prepared once per (reference, scale) object
# ------------------------------------------------------------------------------------------------
U = 2.0 ** -53                     # float64 unit roundoff
SMALL = 8                          # compare_prepared compares outputs of at most this many elements
                                   # exactly, one by one (each costs about 15 us, the vectorized pass
                                   # about 140 us); compare_deferred judges outputs of up to LEAN
                                   # elements in Python floats
BATCH_MIN = 3                      # compare_cases: cases of at least this many elements join the
                                   # shared pass (there a case costs about one exact evaluation)
TINY = 2.0 ** -1060                # covers every absolute (underflow) rounding term, see the proof
_DEC = Context(prec=80, Emax=999999999999999999, Emin=-999999999999999999)            # r - r_hi for a 40-digit decimal: exact to 80 digits (far more than needed)
_KIND_REAL, _KIND_BOOL, _KIND_SPECIAL = 0, 1, 2


class Prepared:
    """The non-null elements of one reference output, flattened in comparison order.

    ``paths`` (index tuples into the result), ``refs`` (the raw reference values: str, mpf, int,
    bool) and ``scales`` (the raw scale values, None: |ref|) are lists; a Prepared read back from
    the on-disk cache (``prepare_output``) builds them from the reference itself when first asked,
    since the comparison needs the raw values of only a few elements (``ref_at``, ``scale_at``,
    ``path_at``)."""

    __slots__ = ("_paths", "_refs", "_scales", "kind", "r_hi", "r_lo", "r_exact", "s", "rbool", "index", "scalar",
                 "shape", "token", "mp", "_source", "plain", "_lists")

    def __init__(self, paths, refs, scales, kind, r_hi, r_lo, r_exact, s, rbool, index=None, scalar=False,
                 shape=None, token=False, source=None):
        self._paths, self._refs, self._scales = paths, refs, scales
        self.kind = kind                # _KIND_*
        self.r_hi = r_hi                # nearest float64 of the reference
        self.r_lo = r_lo                # nearest float64 of ref - r_hi
        self.r_exact = r_exact          # ref == r_hi exactly
        self.s = s                      # nearest float64 of the scale (|r_hi| where the scale is None)
        self.rbool = rbool              # boolean references
        self.index = index              # numpy index arrays into the result (None: gather element by element)
        self.scalar = scalar            # a single element at path ()
        self.shape = shape              # the reference's shape (not for per-token outputs at positions)
        self.token = token              # stored at (b, t) positions of a scale case
        self.mp = None                  # element -> (ref, scale) as mpmath tuples, for _exact (filled lazily)
        self._source = source           # (ref, scale, non-null k of a token output) when the lists are lazy
        self.plain = bool((kind == _KIND_REAL).all())   # every reference real: the float64 pass needs no selection
        self._lists = None              # (r_hi, r_lo, s, r_exact) as Python lists, for _float64_pass_list

    def lists(self):
        """``(r_hi, r_lo, s, r_exact)`` as Python lists (made once): what ``_float64_pass_list`` reads."""
        if self._lists is None:
            self._lists = (self.r_hi.tolist(), self.r_lo.tolist(), self.s.tolist(), self.r_exact.tolist())
        return self._lists

    def __len__(self):
        return len(self.r_hi)

    # the raw values of element k, without building the lists
    def path_at(self, k):
        if self._paths is not None:
            return self._paths[k]
        return tuple(int(i[k]) for i in self.index)     # one path, without listing them all

    def _raw_at(self, tree, k):
        if tree is None:
            return None
        ks = self._source[2]
        if ks is not None:
            return tree[int(ks[k])]
        x = tree
        for i in self.path_at(k):
            x = x[i]
        return x

    def ref_at(self, k):
        return self._refs[k] if self._refs is not None else self._raw_at(self._source[0], k)

    def scale_at(self, k):
        return self._scales[k] if self._scales is not None else self._raw_at(self._source[1], k)

    @property
    def paths(self):
        if self._paths is None:
            self._paths = list(zip(*[i.tolist() for i in self.index])) if len(self) else []
        return self._paths

    def _raw_list(self, tree):
        """The raw values of every element of ``tree`` (the reference or the scale) in order."""
        n = len(self)
        if tree is None:
            return [None] * n
        ks = self._source[2]
        if ks is not None:
            return [tree[int(ks[k])] for k in range(n)]
        if self.index is None:
            return [self._raw_at(tree, k) for k in range(n)]
        return np.array(tree, dtype=object)[self.index].tolist()

    @property
    def refs(self):
        if self._refs is None:
            self._refs = self._raw_list(self._source[0])
        return self._refs

    @property
    def scales(self):
        if self._scales is None:
            self._scales = self._raw_list(self._source[1])
        return self._scales


def _hi_lo(r):
    """(r_hi, r_lo, exact, kind) of one reference value."""
    if isinstance(r, bool):
        return 0.0, 0.0, True, _KIND_BOOL
    if isinstance(r, str):
        try:
            d = Decimal(r)
        except ArithmeticError:     # an exponent beyond the decimal module's range (mpmath has none)
            return math.nan, 0.0, False, _KIND_SPECIAL
        if not d.is_finite():
            return math.nan, 0.0, False, _KIND_SPECIAL
        hi = float(r)                                       # correctly rounded
        if not math.isfinite(hi):
            return math.nan, 0.0, False, _KIND_SPECIAL
        diff = _DEC.subtract(d, Decimal(hi))
        return hi, float(diff), diff == 0, _KIND_REAL
    if isinstance(r, int):
        hi = float(r) if abs(r) < 2 ** 1000 else math.inf
        if not math.isfinite(hi):
            return math.nan, 0.0, False, _KIND_SPECIAL
        rest = r - int(hi)
        return hi, float(rest), rest == 0, _KIND_REAL
    if isinstance(r, float):
        return (r, 0.0, True, _KIND_REAL) if math.isfinite(r) else (math.nan, 0.0, False, _KIND_SPECIAL)
    x = (r if isinstance(r, mpf) else mpf(r))._mpf_   # never round an mpf to the current precision
    if x[1] == 0 and x != libmp.fzero:                  # nan, +inf, -inf
        return math.nan, 0.0, False, _KIND_SPECIAL
    try:
        hi = libmp.to_float(x, rnd=libmp.round_nearest)
    except OverflowError:
        return math.nan, 0.0, False, _KIND_SPECIAL
    if not math.isfinite(hi):
        return math.nan, 0.0, False, _KIND_SPECIAL
    diff = libmp.mpf_sub(x, libmp.from_float(hi), 0)    # prec 0: exact
    return hi, libmp.to_float(diff, rnd=libmp.round_nearest), diff == libmp.fzero, _KIND_REAL


def _scale_float(s):
    """The scale as float64 (NaN for None or a boolean; a non-finite scale goes to the exact path)."""
    if s is None or isinstance(s, bool):
        return math.nan
    try:
        return float(s)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _flat(x, path=()):
    if isinstance(x, (list, tuple)):
        for k, item in enumerate(x):
            yield from _flat(item, path + (k,))
    else:
        yield path, x


def _shape(x):
    """The shape of a rectangular nested list, or None when ragged."""
    if not isinstance(x, (list, tuple)):
        return ()
    if not x:
        return (0,)
    subs = [_shape(i) for i in x]
    if any(s is None or s != subs[0] for s in subs):
        return None
    return (len(x),) + subs[0]


_PREPARED: dict = {}
_PREPARED_MAX = 20000


def prepare(ref, scale, positions=None) -> Prepared:
    """Prepare a reference output (nested list) and its scale tree, or a per-token output stored at
    ``positions`` (scale cases).  Cached by the identity of the reference and scale objects."""
    key = (id(ref), id(scale), id(positions))
    hit = _PREPARED.get(key)
    if hit is not None and hit[0] is ref and hit[1] is scale and hit[2] is positions:
        return hit[3]
    if positions is not None:
        paths, refs, scales = [], [], []
        for k, (b, t) in enumerate(positions):
            if ref[k] is not None:
                paths.append((b, t))
                refs.append(ref[k])
                scales.append(scale[k] if scale is not None else None)
        index = (np.array([p[0] for p in paths], dtype=np.int64), np.array([p[1] for p in paths], dtype=np.int64))
        shape_ok, scalar = True, False
    else:
        fast = _prepare_strings(ref, scale)
        if fast is not None:
            if len(_PREPARED) > _PREPARED_MAX:
                _PREPARED.clear()
            _PREPARED[key] = (ref, scale, positions, fast)
            return fast
        flat_scale = dict(_flat(scale)) if scale is not None else {}
        paths, refs, scales = [], [], []
        for path, r in _flat(ref):
            if r is None:
                continue
            paths.append(path)
            refs.append(r)
            scales.append(flat_scale.get(path))
        shp = _shape(ref)
        scalar = shp == ()
        shape_ok = shp is not None
        index = None
        if shape_ok and not scalar:
            index = tuple(np.array([p[d] for p in paths], dtype=np.int64) for d in range(len(shp))) if paths else \
                tuple(np.zeros(0, dtype=np.int64) for _ in shp)
    n = len(refs)
    r_hi, r_lo, exact, kind = np.empty(n), np.empty(n), np.zeros(n, dtype=bool), np.empty(n, dtype=np.int8)
    rbool = np.zeros(n, dtype=bool)
    s = np.empty(n)
    none_scale = np.zeros(n, dtype=bool)
    for k, (r, sc) in enumerate(zip(refs, scales)):
        r_hi[k], r_lo[k], exact[k], kind[k] = _hi_lo(r)
        if kind[k] == _KIND_BOOL:
            rbool[k] = bool(r)
        none_scale[k] = sc is None
        s[k] = _scale_float(sc)
    none_scale &= kind == _KIND_REAL
    s[none_scale] = np.abs(r_hi[none_scale])      # tolerance.compare's S = |ref|
    # a scale that is not a finite float64 (or a None scale of an int/bool-free reference we could
    # not express) sends the element to the exact comparison
    kind[(kind == _KIND_REAL) & ~np.isfinite(s)] = _KIND_SPECIAL
    prep = Prepared(paths, refs, scales, kind, r_hi, r_lo, exact, s, rbool, index if shape_ok else None, scalar,
                    _shape(ref) if positions is None else None, positions is not None)
    if len(_PREPARED) > _PREPARED_MAX:
        _PREPARED.clear()
    _PREPARED[key] = (ref, scale, positions, prep)
    return prep


def _object_array(x):
    """A rectangular nested list (at least one dimension) as a numpy object array of its leaves, or
    None (not a list, ragged, or a leaf that is itself a list or tuple)."""
    if not isinstance(x, list):
        return None
    try:
        arr = np.array(x, dtype=object)
    except ValueError:          # ragged
        return None
    if arr.ndim == 0 or any(isinstance(v, (list, tuple)) for v in arr.flat):
        return None
    return arr


def _mpf_hi_lo(x):
    """(r_hi, r_lo, exact) of a finite mpf, as ``_hi_lo`` computes them; None otherwise."""
    t = x._mpf_
    if t[1] == 0 and t != libmp.fzero:
        return None
    try:
        hi = libmp.to_float(t, rnd=libmp.round_nearest)
    except OverflowError:
        return None
    if not math.isfinite(hi):
        return None
    diff = libmp.mpf_sub(t, libmp.from_float(hi), 0)
    return hi, libmp.to_float(diff, rnd=libmp.round_nearest), diff == libmp.fzero


def _prepare_strings(ref, scale) -> Prepared | None:
    """``prepare`` for the common case, with the nested lists walked by numpy: a rectangular (at
    least one-dimensional) reference of decimal strings or of mpf numbers (nulls allowed) whose
    float64 values are all finite, and no scale or a scale of the same shape of decimal strings or
    mpf numbers.  The same Prepared as the general path; None (use the general path) otherwise."""
    arr = _object_array(ref)
    if arr is None:
        return None
    shp = arr.shape
    try:
        flat = arr.reshape(-1)
        keep = np.fromiter((x is not None for x in flat), dtype=bool, count=flat.size)
        refs = flat[keep].tolist()
        if scale is None:
            scales = [None] * len(refs)
        else:
            sarr = _object_array(scale)
            if sarr is None or sarr.shape != shp:
                return None
            scales = sarr.reshape(-1)[keep].tolist()
        if all(type(x) is str for x in refs):
            his = [float(r) for r in refs]
            r_hi = np.array(his, dtype=np.float64)
            if not np.isfinite(r_hi).all():
                return None
            dec, sub = Decimal, _DEC.subtract
            diffs = [sub(dec(r), dec(h)) for r, h in zip(refs, his)]
            if not all(d.is_finite() for d in diffs):
                return None
            r_lo = np.array([float(d) for d in diffs], dtype=np.float64)
            exact = np.array([d == 0 for d in diffs], dtype=bool)
        elif all(type(x) is mpf for x in refs):
            parts = [_mpf_hi_lo(x) for x in refs]
            if any(p is None for p in parts):
                return None
            r_hi = np.array([p[0] for p in parts], dtype=np.float64)
            r_lo = np.array([p[1] for p in parts], dtype=np.float64)
            exact = np.array([p[2] for p in parts], dtype=bool)
        else:
            return None
        if scale is None:
            s = np.abs(r_hi)
        elif all(type(x) is str or type(x) is mpf for x in scales):
            s = np.array([float(x) for x in scales], dtype=np.float64)
        else:
            return None
    except (ArithmeticError, ValueError, TypeError, OverflowError):
        return None
    n = len(refs)
    kind = np.full(n, _KIND_REAL, dtype=np.int8)
    kind[~np.isfinite(s)] = _KIND_SPECIAL
    index = tuple(i.astype(np.int64, copy=False) for i in np.nonzero(keep.reshape(shp)))
    paths = list(zip(*[i.tolist() for i in index])) if n else []
    return Prepared(paths, refs, scales, kind, r_hi, r_lo, exact, s, np.zeros(n, dtype=bool), index, False,
                    shp, False)


# ------------------------------------------------------------------------------------------------
# The comparison
# ------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """The comparison of one output: what the element-by-element loop over tolerance.compare
    gives, without running it."""
    compared: int = 0
    worst: tolerance.Comparison | None = None     # the first element attaining the largest ratio
    worst_path: tuple | None = None
    failure: tolerance.Comparison | None = None   # the first failing element
    failure_path: tuple | None = None
    failure_got: float | None = None
    failure_ref: object = None
    passed: np.ndarray | None = field(default=None, repr=False)


def _gather(got, prep: Prepared):
    """The result's values at the prepared paths as float64 (numpy), or None when the result is not
    laid out like the reference (then the element-by-element loop decides, errors included)."""
    if hasattr(got, "detach"):
        t = got.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        arr = t.double().numpy()
    else:
        try:
            arr = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            return None
    if prep.scalar:
        return arr.reshape(1) if arr.size == 1 else None
    if prep.index is None:
        return None
    if prep.token:
        if arr.ndim != 2:
            return None
    elif arr.shape != prep.shape:
        return None
    elif arr.size == len(prep):
        return arr.reshape(-1)      # every element compared: the index lists them all, in C order
    try:
        return arr[prep.index]
    except IndexError:
        return None


def _exact(value, prep, k, family, dtype):
    """tolerance.compare(value, ref[k], scale[k], family, dtype), evaluated with mpmath's low-level
    functions on the reference and scale converted once (the same operations at the same precision
    and rounding, so the same Comparison bit for bit; tests/test_compare.py checks it against
    tolerance.compare).  Booleans, non-finite values and other types go to tolerance.compare."""
    if _MODE == "fast" and type(value) is float and math.isfinite(value):
        conv = prep.mp
        if conv is None:
            conv = prep.mp = {}
        c = conv.get(k)
        if c is None:
            c = conv[k] = _mp_pair(prep.ref_at(k), prep.scale_at(k))
        if c is not False:
            return _compare_mp(value, c[0], c[1], family, dtype)
    return tolerance.compare(value, prep.ref_at(k), prep.scale_at(k), family, dtype)


_PREC = libmp.dps_to_prec(tolerance.COMPARE_DPS)   # tolerance.compare's working precision (mp.workdps)
_RND = libmp.round_nearest


def _to_mpf(x):
    """``mpf(x)`` at tolerance.compare's precision as a raw tuple (None: a type handled there only)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, str):
        try:
            return libmp.from_str(x, _PREC, _RND)
        except ValueError:
            return None
    if type(x) is mpf:
        sign, man, exp, bc = x._mpf_
        if not man and exp:
            return None                                   # nan, +inf, -inf
        return libmp.normalize(sign, man, exp, bc, _PREC, _RND)
    return None


def _mp_pair(ref, scale):
    """(ref, scale) as mpmath tuples at the comparison's precision, or False when tolerance.compare
    must decide (a boolean, a non-finite reference or scale, another type)."""
    r = _to_mpf(ref)
    if r is None or (r[1] == 0 and r[2]) or r in (libmp.finf, libmp.fninf, libmp.fnan):
        return False
    if scale is None:
        s = libmp.mpf_abs(r, _PREC, _RND)
    else:
        s = _to_mpf(scale)
        if s is None:
            return False
    return r, s


_KU: dict = {}


def _compare_mp(g: float, r, s, family, dtype) -> tolerance.Comparison:
    ku = _KU.get((family, dtype))
    if ku is None:
        with mp.workdps(tolerance.COMPARE_DPS):
            ku = _KU[(family, dtype)] = ((tolerance.K[family] * tolerance.UNIT_ROUNDOFF[dtype])._mpf_,
                                         tolerance.FLOOR[dtype]._mpf_)
    b = libmp.mpf_add(libmp.mpf_mul(ku[0], s, _PREC, _RND), ku[1], _PREC, _RND)
    err = libmp.mpf_abs(libmp.mpf_sub(libmp.from_float(g, _PREC, _RND), r, _PREC, _RND), _PREC, _RND)
    ratio = libmp.mpf_div(err, b, _PREC, _RND)
    return tolerance.Comparison(libmp.mpf_cmp(err, b) <= 0, libmp.to_float(err, rnd=_RND),
                                libmp.to_float(b, rnd=_RND), libmp.to_float(ratio, rnd=_RND))


def _float64_pass(gg, hi, lo, s, r_exact, ku, floor):
    """The float64 judgement of results ``gg`` against references ``hi + lo`` with scales ``s``
    (spec/tolerance.md, "Evaluating the comparison"): (passed, decided, ratio lower bound, ratio
    upper bound) per element; an element not ``decided`` has its margin within the rounding slack."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        b = ku * s + floor
        d1 = gg - hi                                    # TwoSum(g, -hi): g - hi = d1 + t exactly
        bb = d1 - gg
        t = (gg - (d1 - bb)) + (-hi - bb)
        e = np.abs(d1 + (t - lo))
        slack_e = U * e + 4 * U * U * (np.abs(d1) + np.abs(hi)) + TINY
        slack_b = 4 * U * b + TINY
        slack = 2 * (slack_e + slack_b)
        # a non-finite e or b makes the slack inf or NaN, and no margin exceeds inf or NaN: such an
        # element is never decided here
        decided = np.abs(e - b) > slack
        lb = np.maximum(e - slack_e, 0.0) / (b + slack_b) * (1 - 2.0 ** -48)
        ub = (e + slack_e) / (b - slack_b) * (1 + 2.0 ** -48)
        zero = r_exact & (d1 == 0)                      # error exactly 0: ratio exactly 0
        lb[zero] = 0.0
        ub[zero] = 0.0
    return e <= b, decided, lb, ub


_KU_FLOOR: dict = {}


def _ku_floor(family: str, dtype: str):
    """(K u, floor) of ``family`` at ``dtype`` as the float64 pass takes them."""
    hit = _KU_FLOOR.get((family, dtype))
    if hit is None:
        hit = _KU_FLOOR[(family, dtype)] = (tolerance.K[family] * float(tolerance.UNIT_ROUNDOFF[dtype]),
                                            float(tolerance.FLOOR[dtype]))
    return hit


def compare_prepared(g, prep: Prepared, family: str, dtype: str, *, stop_at_failure: bool = False) -> Outcome:
    """Compare float64 values ``g`` (gathered at ``prep.paths``) with the prepared reference."""
    n = len(prep)
    out = Outcome(compared=n)
    STATS.elements += n
    if n == 0:
        return out
    if _MODE == "exact":
        return _compare_exact(g, prep, family, dtype, out, stop_at_failure)
    if n <= SMALL:
        # the worst element needs one exact evaluation anyway: for a handful of elements the exact
        # comparison of each costs less than the vectorized pass
        STATS.small += n
        return _compare_exact(g, prep, family, dtype, out, stop_at_failure)
    ku, floor = _ku_floor(family, dtype)
    # exact-known results: cmp objects by position
    known: dict[int, tolerance.Comparison] = {}
    kind = prep.kind
    finite_g = np.isfinite(g)
    if prep.plain and finite_g.all():
        # every reference real and every result finite (the common case): the float64 pass on the
        # whole arrays, no selection
        passed, decided, ratio_lb, ratio_ub = _float64_pass(g, prep.r_hi, prep.r_lo, prep.s, prep.r_exact, ku, floor)
        undecided = np.flatnonzero(~decided)
        STATS.fallbacks += len(undecided)
        STATS.fast += n - len(undecided)
    else:
        passed = np.zeros(n, dtype=bool)
        ratio_lb = np.zeros(n)
        ratio_ub = np.zeros(n)
        # booleans: equality of truth values (tolerance.compare's rule), exactly
        bmask = kind == _KIND_BOOL
        if bmask.any():
            ok = (g[bmask] != 0) == prep.rbool[bmask]
            passed[bmask] = ok
            ratio_lb[bmask] = ratio_ub[bmask] = np.where(ok, 0.0, math.inf)
        # the float64 pass on the real references with finite results
        fast = (kind == _KIND_REAL) & finite_g
        ok, decided, lb, ub = _float64_pass(g[fast], prep.r_hi[fast], prep.r_lo[fast], prep.s[fast],
                                            prep.r_exact[fast], ku, floor)
        idx_fast = np.flatnonzero(fast)
        passed[idx_fast] = ok
        ratio_lb[idx_fast] = lb
        ratio_ub[idx_fast] = ub
        # the rest, exactly: non-finite elements, and margins within the rounding slack
        undecided = np.sort(np.concatenate([np.flatnonzero(~fast & ~bmask), idx_fast[~decided]]))
        STATS.special += int((~fast & ~bmask).sum())
        STATS.fallbacks += int((~decided).sum())
        STATS.fast += int(decided.sum()) + int(bmask.sum())
    return _select(out, g, prep, passed, ratio_lb, ratio_ub, undecided, known, family, dtype, stop_at_failure)


def _select(out: Outcome, g, prep, passed, ratio_lb, ratio_ub, undecided, known: dict, family, dtype,
            stop_at_failure) -> Outcome:
    """The second half of ``compare_prepared``, after the float64 pass: the ``undecided`` elements
    exactly, then the first failure and the worst ratio, evaluated exactly (``passed``, ``ratio_lb``
    and ``ratio_ub`` are updated in place for the undecided elements)."""
    _resolve(g, prep, passed, ratio_lb, ratio_ub, undecided, known, family, dtype)
    fails = np.flatnonzero(~passed)
    return _finish(out, g, prep, passed, known, family, dtype, stop_at_failure,
                   int(fails[0]) if fails.size else -1, _candidates(ratio_lb, ratio_ub))


def _resolve(g, prep, passed, ratio_lb, ratio_ub, undecided, known: dict, family, dtype) -> None:
    """The elements the float64 pass left ``undecided``, exactly (into ``known``, and ``passed``,
    ``ratio_lb`` and ``ratio_ub`` in place; ``undecided``: a list or a numpy array of positions)."""
    for k in (undecided if type(undecided) is list else undecided.tolist()):
        c = _exact(float(g[k]), prep, k, family, dtype)
        known[k] = c
        passed[k] = c.passed
        ratio_lb[k] = ratio_ub[k] = c.ratio


def _candidates(ratio_lb, ratio_ub):
    """The elements whose ratio interval can hold the largest ratio."""
    best = float(ratio_lb.max())
    if best == 0.0:
        # every ratio is 0 except possibly those with ub > 0: the max is among them, or it is 0
        return np.flatnonzero(ratio_ub > 0)
    return np.flatnonzero(ratio_ub >= best)


def _finish(out: Outcome, g, prep, passed, known: dict, family, dtype, stop_at_failure, first_fail: int,
            cand) -> Outcome:
    """The first failure (element ``first_fail``, -1 for none) and the worst ratio (among the
    candidates ``cand``), evaluated exactly."""
    out.passed = passed
    if first_fail >= 0:
        k = first_fail
        c = known.get(k) or _exact(float(g[k]), prep, k, family, dtype)
        if k not in known:
            STATS.ratio_evals += 1
            known[k] = c
        out.failure, out.failure_path, out.failure_got, out.failure_ref = c, prep.path_at(k), float(g[k]), prep.ref_at(k)
        if stop_at_failure:
            return out
    # the worst ratio: exact evaluation of every element whose interval can hold the maximum
    exact_ratio = {k: c.ratio for k, c in known.items()}
    seen: dict = {}     # equal (result, reference, scale) give the equal comparison: ties cost one evaluation
    if len(cand) > 32:  # many ties: the raw values of every element, listed at once
        refs, scales = prep.refs, prep.scales
        ref_at, scale_at = refs.__getitem__, scales.__getitem__
    else:
        ref_at, scale_at = prep.ref_at, prep.scale_at
    tie = len(cand) > 1     # one candidate (the common case) has nothing to share: no key is made
    for k in cand.tolist():
        if k not in exact_ratio:
            same = (float(g[k]), _hashable(ref_at(k)), _hashable(scale_at(k))) if tie else None
            c = seen.get(same)
            if c is None:
                c = seen[same] = _exact(float(g[k]), prep, k, family, dtype)
                STATS.ratio_evals += 1
            known[k] = c
            exact_ratio[k] = c.ratio
    if exact_ratio:
        top = max(exact_ratio.values())
    else:
        top = 0.0
    if top == 0.0:
        # the first element overall has ratio 0 (every lower bound is 0 and no candidate is above)
        k = 0
    else:
        k = min(i for i, r in exact_ratio.items() if r == top)
    if k not in known:
        known[k] = _exact(float(g[k]), prep, k, family, dtype)
        STATS.ratio_evals += 1
    out.worst, out.worst_path = known[k], prep.path_at(k)
    return out


def _hashable(x):
    """A key equal for equal values: the string, number, or an mpf's exact (sign, man, exp, bc)."""
    return x._mpf_ if isinstance(x, mpf) else (x if isinstance(x, (str, int, float, type(None))) else repr(x))


def _compare_exact(g, prep, family, dtype, out, stop_at_failure):
    passed = np.zeros(len(prep), dtype=bool)
    worst = -1.0
    for k in range(len(prep)):
        c = _exact(float(g[k]), prep, k, family, dtype)
        passed[k] = c.passed
        if c.ratio > worst:
            worst, out.worst, out.worst_path = c.ratio, c, prep.path_at(k)
        if not c.passed and out.failure is None:
            out.failure, out.failure_path, out.failure_got, out.failure_ref = c, prep.path_at(k), float(g[k]), prep.ref_at(k)
            if stop_at_failure:
                break
    out.passed = passed
    return out


# ------------------------------------------------------------------------------------------------
# The largest ratio of many comparisons, evaluated once at the end (the property checks)
# ------------------------------------------------------------------------------------------------
# A property check compares several outputs of several adapter calls and reports one number, the
# largest error ratio over all of them.  compare_prepared evaluates each output's largest ratio
# exactly; ``compare_deferred`` keeps instead each element's ratio interval from the float64 pass
# (spec/tolerance.md: the exact ratio lies in [lb, ub]), and ``largest_ratio`` evaluates exactly,
# once for the whole check, only the elements whose interval can hold the overall largest.
LEAN = 32       # compare_deferred judges outputs of at most this many elements in Python floats
                # (about 1 us an element; numpy's pass costs about 50 us whatever the size)


def _float64_pass_list(gs, his, los, ss, exacts, ku, floor):
    """``_float64_pass`` on Python lists of floats: the same IEEE double operations in the same
    order, so the same four results bit for bit (tests/test_compare.py checks it); for outputs of a
    few elements, where numpy's cost per call exceeds the arithmetic.  The results are finite and
    the references real (a plain Prepared): no operation here raises (b > slack_b, since the floor
    is positive)."""
    passed, decided, lbs, ubs = [], [], [], []
    for g, hi, lo, s, r_exact in zip(gs, his, los, ss, exacts):
        b = ku * s + floor
        d1 = g - hi
        bb = d1 - g
        t = (g - (d1 - bb)) + (-hi - bb)
        e = abs(d1 + (t - lo))
        slack_e = U * e + 4 * U * U * (abs(d1) + abs(hi)) + TINY
        slack_b = 4 * U * b + TINY
        slack = 2 * (slack_e + slack_b)
        if r_exact and d1 == 0:
            lb = ub = 0.0
        else:
            lb = max(e - slack_e, 0.0) / (b + slack_b) * (1 - 2.0 ** -48)
            ub = (e + slack_e) / (b - slack_b) * (1 + 2.0 ** -48)
        passed.append(e <= b)
        decided.append(abs(e - b) > slack)
        lbs.append(lb)
        ubs.append(ub)
    return passed, decided, lbs, ubs


class Deferred:
    """One output compared, its largest ratio not yet evaluated: ``lb``/``ub`` each element's ratio
    interval (the exact ratio where ``known`` holds the element's exact comparison; Python lists
    for an output of at most LEAN elements, numpy arrays otherwise), ``lb_max`` and ``ub_max``
    their largest values."""

    __slots__ = ("g", "prep", "family", "dtype", "lb", "ub", "known", "lb_max", "ub_max")

    def __init__(self, g, prep, family, dtype, lb, ub, known):
        self.g, self.prep, self.family, self.dtype = g, prep, family, dtype
        self.lb, self.ub, self.known = lb, ub, known
        if type(lb) is list:
            self.lb_max, self.ub_max = max(lb), max(ub)
        else:
            self.lb_max, self.ub_max = float(lb.max()), float(ub.max())

    def candidates(self, best: float) -> list:
        """The elements whose ratio interval can hold ``best`` or more (those above 0 when ``best``
        is 0)."""
        ub = self.ub
        if type(ub) is list:
            if best == 0.0:
                return [k for k, u in enumerate(ub) if u > 0]
            return [k for k, u in enumerate(ub) if u >= best]
        return (np.flatnonzero(ub > 0) if best == 0.0 else np.flatnonzero(ub >= best)).tolist()


def compare_deferred(g, prep: Prepared, family: str, dtype: str):
    """``compare_prepared(g, prep, family, dtype, stop_at_failure=True)`` without evaluating the
    output's largest ratio: (Outcome, Deferred).  The Outcome's ``failure`` (the first failing
    element, evaluated exactly) is the one compare_prepared gives, its ``worst`` is None, and the
    Deferred (None when an element fails) goes to ``largest_ratio``.  In exact mode, and for an
    output that is not plain (a reference that is not real, a result that is not finite), this is
    compare_prepared itself, its ``worst`` evaluated, and no Deferred."""
    n = len(prep)
    if _MODE == "exact" or n == 0 or not prep.plain:
        return compare_prepared(g, prep, family, dtype, stop_at_failure=True), None
    ku, floor = _ku_floor(family, dtype)
    if n <= LEAN:
        gl = g.tolist()
        if not all(map(math.isfinite, gl)):
            return compare_prepared(g, prep, family, dtype, stop_at_failure=True), None
        passed, decided, lb, ub = _float64_pass_list(gl, *prep.lists(), ku, floor)
        undecided = [k for k, d in enumerate(decided) if not d]
    else:
        if not np.isfinite(g).all():
            return compare_prepared(g, prep, family, dtype, stop_at_failure=True), None
        passed, decided, lb, ub = _float64_pass(g, prep.r_hi, prep.r_lo, prep.s, prep.r_exact, ku, floor)
        undecided = np.flatnonzero(~decided).tolist()
    STATS.elements += n
    STATS.fallbacks += len(undecided)
    STATS.fast += n - len(undecided)
    known: dict = {}
    _resolve(g, prep, passed, lb, ub, undecided, known, family, dtype)
    out = Outcome(compared=n, passed=np.asarray(passed))
    k = next((k for k, ok in enumerate(passed) if not ok), -1) if type(passed) is list else \
        (int(np.argmin(passed)) if not passed.all() else -1)
    if k >= 0:
        c = known.get(k)
        if c is None:
            c = _exact(float(g[k]), prep, k, family, dtype)
            STATS.ratio_evals += 1
        out.failure, out.failure_path, out.failure_got, out.failure_ref = c, prep.path_at(k), float(g[k]), prep.ref_at(k)
        return out, None
    return out, Deferred(g, prep, family, dtype, lb, ub, known)


def largest_ratio(deferred: list, at_least: float = 0.0) -> float:
    """The largest exact error ratio over every element of the outputs ``deferred`` and
    ``at_least`` (a ratio known exactly, 0 for none): what the largest of compare_prepared's
    ``worst.ratio`` over those outputs gives.  Every element's ratio lies in its interval, so the
    largest is at least ``best``, the largest lower bound; an element whose upper bound is below
    ``best`` cannot attain it, and only the others are evaluated (those with a ratio above 0 when
    ``best`` is 0)."""
    best = max([at_least] + [d.lb_max for d in deferred])
    top = at_least
    for d in deferred:
        seen: dict = {}     # equal (result, reference, scale): one evaluation
        cand = d.candidates(best)
        tie = len(cand) > 1
        for k in cand:
            c = d.known.get(k)
            if c is None:
                same = (float(d.g[k]), _hashable(d.prep.ref_at(k)), _hashable(d.prep.scale_at(k))) if tie else None
                c = seen.get(same)
                if c is None:
                    c = seen[same] = _exact(float(d.g[k]), d.prep, k, d.family, d.dtype)
                    STATS.ratio_evals += 1
            if c.ratio > top:
                top = c.ratio
    return top


def _elements_loop(got, prep, family, dtype, stop_at_failure, lookup):
    """The element-by-element loop (a result not laid out like the reference): ``lookup(path)``
    gives the value or raises as the caller wants."""
    out = Outcome(compared=len(prep))
    STATS.elements += len(prep)
    worst = -1.0
    passed = np.zeros(len(prep), dtype=bool)
    for k, path in enumerate(prep.paths):
        value = lookup(path)
        c = _exact(value, prep, k, family, dtype)
        STATS.special += 1
        passed[k] = c.passed
        if c.ratio > worst:
            worst, out.worst, out.worst_path = c.ratio, c, path
        if not c.passed and out.failure is None:
            out.failure, out.failure_path, out.failure_got, out.failure_ref = c, path, value, prep.ref_at(k)
            if stop_at_failure:
                break
    out.passed = passed
    return out


def compare_output(case: dict, key: str, ref, got, family: str, dtype: str) -> Outcome:
    """One output (or ``grad.<input>``) of a golden case against the adapter's tensor ``got``,
    with the runner's rules: per-token outputs of a scale case are stored at ``positions``; null
    reference elements are not compared."""
    prep = prepare_output(case, key, ref, got)
    g = _gather(got, prep)
    if g is not None:
        return compare_prepared(g, prep, family, dtype)
    t = got.detach().to("cpu").double() if hasattr(got, "detach") else got
    return _elements_loop(t, prep, family, dtype, False,
                          lambda path: t[path].item() if path else t.item())


# ------------------------------------------------------------------------------------------------
# A whole case at once, with its preparation kept on disk
# ------------------------------------------------------------------------------------------------
# Preparing a golden reference (decimal strings to double-doubles) costs more than comparing it, and
# a family file's bytes never change under its sha256: the prepared arrays of every output of every
# case of a family file are kept on disk, one .npz per file, named by the file's sha256, in the
# folder of the code that prepares them (this module, tolerance.py, numpy's version; see
# cache.version_dir).  The raw reference values stay in the case; a Prepared read back finds them
# there when the comparison needs them.  Under $PGSPEC_CACHE/prepared/<version> (default
# ~/.cache/pgspec); PGSPEC_CACHE=off disables it.
_ARRAYS = ("kind", "r_hi", "r_lo", "r_exact", "s", "rbool")


def _prepared_dir():
    from ..base.cache import version_dir

    return version_dir("prepared", _code_digest())


_CODE_DIGEST: list = []


def _code_digest() -> str:
    if not _CODE_DIGEST:
        import hashlib
        from pathlib import Path

        h = hashlib.sha256(f"{np.__version__}|{libmp.BACKEND}".encode())
        for name in ("compare.py", "tolerance.py"):
            h.update(b"\0" + (Path(__file__).resolve().parent / name).read_bytes())
        _CODE_DIGEST.append(h.hexdigest()[:16])
    return _CODE_DIGEST[0]


def _stored_at_positions(case: dict, key: str, ref) -> bool:
    """Whether output ``key`` of ``case`` is prepared as a per-token output stored at positions
    (when the adapter's result has at least two dimensions, see ``compare_output``)."""
    positions = case.get("positions")
    return positions is not None and isinstance(ref, list) and len(ref) == len(positions)


def _family_entries(family: str, sha: str, cases: dict) -> dict:
    """{(case id, key, token): Prepared} for every output of every case of a loaded family file,
    read from the on-disk cache or prepared now (and stored)."""
    d = _prepared_dir()
    path = d / f"{sha}.npz" if d is not None else None
    if path is not None and path.exists():
        try:
            return _read_family(path, cases)
        except Exception:  # noqa: BLE001 - a damaged or unreadable entry only costs its preparation
            pass
    entries = {}
    for cid, case in cases.items():
        if case.get("expect_error"):
            continue
        for key, ref in list(case["outputs"].items()) + [(f"grad.{k}", v) for k, v in case["grad"].items()]:
            token = _stored_at_positions(case, key, ref)
            entries[(cid, key, token)] = prepare(ref, case["scale"].get(key), case["positions"] if token else None)
    if path is not None:
        _write_family(path, entries)
    return entries


def _write_family(path, entries: dict) -> None:
    """One .npz: the element arrays of every output concatenated, the index arrays concatenated,
    and a JSON table of the outputs (case, key, token, element start and count, index arrays' start
    and count, scalar, shape)."""
    import json

    rows, arrays, index = [], {n: [] for n in _ARRAYS}, []
    start = istart = 0
    for (cid, key, token), p in entries.items():
        if p.index is None and not p.scalar:
            continue            # a ragged reference: prepared again when needed
        n = len(p)
        for name in _ARRAYS:
            arrays[name].append(getattr(p, name))
        idx = [] if p.index is None else list(p.index)
        index.extend(idx)
        rows.append([cid, key, token, start, n, istart, len(idx), p.scalar,
                     None if p.shape is None else list(p.shape)])
        start += n
        istart += len(idx)
    if not rows:
        return
    data = {"table": np.array(json.dumps(rows)),
            "index": np.concatenate(index).astype(np.int64) if index else np.zeros(0, dtype=np.int64),
            "lengths": np.array([len(i) for i in index], dtype=np.int64),
            **{n: np.concatenate(a).astype(_ARRAY_DTYPES[n], copy=False) for n, a in arrays.items()}}
    data["digest"] = np.array(_arrays_digest(data))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **data)
        tmp.replace(path)
    except OSError:
        pass        # a read-only cache only costs time


def _arrays_digest(data: dict) -> str:
    """sha256 of a family entry's table and arrays (their dtypes, shapes and bytes): a damaged file
    is prepared again, never read."""
    import hashlib

    h = hashlib.sha256()
    for name in ("table", "index", "lengths", *_ARRAYS):
        a = data[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(str(a).encode() if name == "table" else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _read_family(path, cases: dict) -> dict:
    with gc_paused():       # many small objects, no reference cycles
        return _read_family_arrays(path, cases)


def _read_family_arrays(path, cases: dict) -> dict:
    import json

    with np.load(path, allow_pickle=False) as z:
        data = {n: z[n] for n in ("table", "index", "lengths", *_ARRAYS)}
        if str(z["digest"]) != _arrays_digest(data):
            raise ValueError(f"{path}: damaged (its digest does not match its arrays)")
    rows = json.loads(str(data["table"]))
    arr = {n: data[n] for n in _ARRAYS}
    index, lengths = data["index"], data["lengths"]
    if any(arr[n].dtype != _ARRAY_DTYPES[n] for n in _ARRAYS) or index.dtype != np.int64:
        raise ValueError(f"{path}: arrays of the wrong type")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    entries = {}
    for cid, key, token, start, n, istart, nidx, scalar, shape in rows:
        case = cases[cid]
        ref = case["outputs"][key] if not key.startswith("grad.") else case["grad"][key[5:]]
        sl = slice(start, start + n)
        idx = tuple(index[offsets[i]:offsets[i + 1]] for i in range(istart, istart + nidx)) if nidx else None
        entries[(cid, key, token)] = Prepared(
            ([()] if n else []) if scalar else None, None, None, *(arr[name][sl] for name in _ARRAYS), idx, scalar,
            None if shape is None else tuple(shape), token,
            source=(ref, case["scale"].get(key), _NonNull(ref) if token else None))
    return entries


_ARRAY_DTYPES = {"kind": np.int8, "r_hi": np.float64, "r_lo": np.float64, "r_exact": np.bool_, "s": np.float64,
                 "rbool": np.bool_}


def pack_prepared(prep: Prepared):
    """A Prepared as bytes and numbers (for a cache entry; the raw values stay with the reference),
    or None for one without index arrays (a ragged reference)."""
    if prep.index is None and not prep.scalar:
        return None
    return (len(prep), [getattr(prep, name).astype(_ARRAY_DTYPES[name], copy=False).tobytes() for name in _ARRAYS],
            [i.astype(np.int64, copy=False).tobytes() for i in prep.index or ()], prep.scalar,
            None if prep.shape is None else list(prep.shape))


def remember_prepared(ref, scale, packed) -> Prepared:
    """Install what ``pack_prepared`` gave for ``prepare(ref, scale)`` (``ref`` and ``scale`` the
    values it was packed from, read back exactly) so that ``prepare`` finds it."""
    n, arrays, index, scalar, shape = packed
    arrs = [np.frombuffer(b, dtype=_ARRAY_DTYPES[name]) for name, b in zip(_ARRAYS, arrays)]
    if any(len(a) != n for a in arrs):
        raise ValueError("a packed Prepared of the wrong length")
    idx = tuple(np.frombuffer(b, dtype=np.int64) for b in index) or None
    prep = Prepared(([()] if n else []) if scalar else None, None, None, *arrs, idx, scalar,
                    None if shape is None else tuple(shape), False, source=(ref, scale, None))
    if len(_PREPARED) > _PREPARED_MAX:
        _PREPARED.clear()
    _PREPARED[(id(ref), id(scale), id(None))] = (ref, scale, None, prep)
    return prep


class _NonNull:
    """The positions k of a per-token output (stored at positions) whose value is not null: the
    element numbers of its Prepared, listed when first asked."""

    __slots__ = ("ref", "ks")

    def __init__(self, ref):
        self.ref, self.ks = ref, None

    def __getitem__(self, k):
        if self.ks is None:
            self.ks = [j for j, r in enumerate(self.ref) if r is not None]
        return self.ks[k]


_FAMILIES: dict = {}


def _loaded_entry(case: dict, key: str, token: bool):
    """The Prepared of output ``key`` of ``case`` from its family file's cache, when ``case`` is a
    case loaded from that file (its outputs, gradients and scales the very objects parsed from it)."""
    from ..corpus import golden

    family = case.get("family")
    loaded = golden.LOADED.get(family)
    if loaded is None:
        return None
    sha, cases = loaded
    parsed = cases.get(case.get("id"))
    if parsed is None or parsed["outputs"] is not case["outputs"] or parsed["grad"] is not case["grad"] or \
            parsed["scale"] is not case["scale"] or parsed.get("positions") is not case.get("positions"):
        return None
    hit = _FAMILIES.get(family)
    if hit is None or hit[0] != sha:
        hit = _FAMILIES[family] = (sha, _family_entries(family, sha, cases))
    return hit[1].get((case["id"], key, token))


def prepare_output(case: dict, key: str, ref, got) -> Prepared:
    """The Prepared of one output of a case (per-token outputs of a scale case are stored at
    ``positions`` when the result has at least two dimensions, see ``compare_output``)."""
    token = _stored_at_positions(case, key, ref) and hasattr(got, "dim") and got.dim() >= 2
    hit = _loaded_entry(case, key, token)
    if hit is not None:
        return hit
    return prepare(ref, case["scale"].get(key), case.get("positions") if token else None)


class _Joined:
    """Several Prepared outputs of one case end to end: the arrays ``compare_prepared`` reads,
    concatenated, and the raw values of element k found in the output it belongs to (its path is
    (output number, path in that output))."""

    def __init__(self, preps: list):
        self.preps = preps
        self.starts = list(itertools.accumulate([len(p) for p in preps], initial=0))
        for name in _ARRAYS:
            setattr(self, name, np.concatenate([getattr(p, name) for p in preps]))
        self.plain = all(p.plain for p in preps)
        self.mp = None

    def __len__(self):
        return int(self.starts[-1])

    def _locate(self, k):
        j = bisect.bisect_right(self.starts, k) - 1
        return self.preps[j], k - self.starts[j], j

    def ref_at(self, k):
        p, i, _ = self._locate(k)
        return p.ref_at(i)

    def scale_at(self, k):
        p, i, _ = self._locate(k)
        return p.scale_at(i)

    def path_at(self, k):
        p, i, j = self._locate(k)
        return j, p.path_at(i)

    @property
    def refs(self):
        return [r for p in self.preps for r in p.refs]

    @property
    def scales(self):
        return [r for p in self.preps for r in p.scales]


_JOINED: dict = {}


def gather_case(case: dict, checks: list):
    """(the case's outputs prepared and joined, the results gathered at their paths as float64,
    end to end), or None when a result is not laid out like its reference.  What
    ``compare_cases`` takes: the results' own tensors need not be kept."""
    # the case's outputs as last joined (for the previous dtype), when they are the same outputs and
    # refs and laid out alike (per-token outputs of a scale case: by the result's dimensions)
    layout = tuple((key, id(ref), _stored_at_positions(case, key, ref) and hasattr(got, "dim") and got.dim() >= 2)
                   for key, ref, got in checks)
    hit = _JOINED.get(id(case))
    if hit is not None and hit[0] is case and hit[1] == layout:
        joined = hit[2]
        preps = joined.preps
    else:
        preps = [prepare_output(case, key, ref, got) for key, ref, got in checks]
        joined = None
    gs = []
    for (key, ref, got), prep in zip(checks, preps):
        g = _gather(got, prep)
        if g is None:
            return None
        gs.append(g)
    if joined is None:
        if len(_JOINED) > _PREPARED_MAX:
            _JOINED.clear()
        joined = _Joined(preps)
        _JOINED[id(case)] = (case, layout, joined)
    return joined, (np.concatenate(gs) if len(gs) != 1 else gs[0])


def _keyed(out: Outcome, checks: list) -> Outcome:
    """The Outcome of a joined comparison with its paths as (output key, path in that output)."""
    if out.worst_path is not None:
        out.worst_path = (checks[out.worst_path[0]][0], out.worst_path[1])
    if out.failure_path is not None:
        out.failure_path = (checks[out.failure_path[0]][0], out.failure_path[1])
    return out


def compare_cases(items: list, dtype: str) -> list:
    """Every output of many cases in one vectorized pass: ``items`` is [(gathered, checks,
    family)], with ``checks`` a case's [(key, ref, got)] in the runner's order and ``gathered``
    what ``gather_case`` gave for it.  A case's Outcome is the runner's aggregate of
    ``compare_output`` over its outputs in that order (the first element attaining the largest
    ratio, the first failing element), with paths as (key, path); None where ``gathered`` is None
    (a result not laid out like its reference: the caller compares output by output, where such a
    result is reported).

    The float64 pass runs once over the elements of every case that takes its plain path (real
    references, finite results, at least BATCH_MIN elements) instead of once per case: the pass is
    elementwise, so each element's float64 numbers are the ones the per-case pass computes.  Then
    each case's undecided elements are evaluated exactly (``_resolve``), every case's first failing
    element and worst-ratio candidates are found at once (what ``_select`` finds for one case), and
    ``_finish`` evaluates them exactly on the case's slice.  The other cases, and every case in
    exact mode, go through ``compare_prepared`` one by one."""
    outs: list = [None] * len(items)
    batch = []   # (item number, gathered results, joined preparation, family)
    for i, (gathered, checks, family) in enumerate(items):
        if gathered is None:
            continue
        joined, g = gathered
        if _MODE == "fast" and joined.plain and len(joined) >= BATCH_MIN:
            batch.append((i, g, joined, family))
        else:
            outs[i] = _keyed(compare_prepared(g, joined, family, dtype), checks)
    if not batch:
        return outs
    floor = float(tolerance.FLOOR[dtype])
    sizes = [len(j) for _, _, j, _ in batch]
    starts = np.cumsum([0] + sizes)
    g_all = np.concatenate([g for _, g, _, _ in batch])
    ku = np.repeat(np.array([_ku_floor(fam, dtype)[0] for _, _, _, fam in batch]), sizes)
    passed, decided, lb, ub = _float64_pass(g_all, *(np.concatenate([getattr(j, name) for _, _, j, _ in batch])
                                                     for name in ("r_hi", "r_lo", "s", "r_exact")), ku, floor)
    # a case with a non-finite result leaves the batch (compare_prepared decides those elements
    # exactly); the undecided elements of the others are found once, cut by case and decided exactly
    nonfinite = set((np.searchsorted(starts, np.flatnonzero(~np.isfinite(g_all)), side="right") - 1).tolist())
    undecided = np.flatnonzero(~decided)
    cut = np.searchsorted(undecided, starts)
    known: list = [{} for _ in batch]
    for n in sorted(set((np.searchsorted(starts, undecided, side="right") - 1).tolist()) - nonfinite):
        _, g, joined, family = batch[n]
        a, b = int(starts[n]), int(starts[n + 1])
        _resolve(g, joined, passed[a:b], lb[a:b], ub[a:b], undecided[cut[n]:cut[n + 1]] - a, known[n], family, dtype)
    # then, for every case at once, what _select finds in one: the first failing element, and the
    # elements whose ratio interval can hold the case's largest ratio (_candidates)
    heads = starts[:-1]
    fails = np.flatnonzero(~passed)
    after = np.append(fails, len(passed))[np.searchsorted(fails, heads)]    # at or after each case's start
    first = np.where(after < starts[1:], after - heads, -1)
    best = np.repeat(np.maximum.reduceat(lb, heads), sizes)
    cand = np.flatnonzero(np.where(best == 0.0, ub > 0, ub >= best))
    ccut = np.searchsorted(cand, starts)
    for n, (i, g, joined, family) in enumerate(batch):
        checks = items[i][1]
        if n in nonfinite:
            outs[i] = _keyed(compare_prepared(g, joined, family, dtype), checks)
            continue
        a, b = int(starts[n]), int(starts[n + 1])
        mine = int(cut[n + 1] - cut[n])
        STATS.elements += b - a
        STATS.fallbacks += mine
        STATS.fast += b - a - mine
        out = Outcome(compared=b - a)
        outs[i] = _keyed(_finish(out, g, joined, passed[a:b], known[n], family, dtype, False, int(first[n]),
                                 cand[ccut[n]:ccut[n + 1]] - a), checks)
    return outs


__all__ = ["to_tensors", "objective", "call", "compare_output", "gather_case", "compare_cases",
           "compare_prepared", "compare_deferred", "largest_ratio", "Deferred", "prepare", "prepare_output", "Outcome",
           "STATS", "set_mode", "mode"]
