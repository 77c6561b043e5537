"""The reference side of the comparison, prepared once per (reference, scale) object: each
non-null element as a double-double ``r_hi + r_lo`` with its scale in float64 and whether it is exact
(``Prepared``, ``prepare``); the comparison core's constants (``U``, ``SMALL``, ``TINY``, ``BATCH_MIN``)."""

from __future__ import annotations

import math
from decimal import Context, Decimal

import numpy as np
from mpmath import libmp, mpf


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
