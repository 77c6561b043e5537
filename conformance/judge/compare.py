"""The comparison core, below both the runner and the property checks.

It re-exports the **call convention** (call.py: how an adapter's formula is called on inputs,
``to_tensors``, the adapter's ``call`` and ``objective``, so that the runner and every property call
adapters the same way) and the prepared reference (prepared.py, kept on disk by prepared_cache.py),
and holds

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

import numpy as np
from mpmath import libmp, mp, mpf

from . import tolerance
from .call import (TORCH_DTYPES, OwnGradientError, adapter_call, autograd, call, objective,  # noqa: F401 - the call
                   own_gradients, to_tensors)                                                 # convention, re-exported
from .prepared import (BATCH_MIN, SMALL, TINY, U, Prepared, _ARRAYS, _KIND_BOOL, _KIND_REAL,  # noqa: F401
                       _PREPARED_MAX, pack_prepared, prepare, remember_prepared)
from .prepared_cache import _stored_at_positions, prepare_output


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
