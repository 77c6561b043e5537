"""Exact reverse-mode differentiation over mpmath numbers.

The reference writes every formula once, as its equation, and obtains the gradient the spec
defines by applying the chain rule to that equation, symbol by symbol.  This module is the chain
rule: a ``Var`` holds an ``mpf`` value and the exact local derivative of the operation that made
it with respect to each operand.  Nothing here is numerical differentiation; every derivative is
the closed-form derivative of an elementary function, evaluated at the working precision.

Conventions (normative, see ``spec/conventions.md``):

* ``sg(x)`` is the stop-gradient sg[x] of the spec: same value, zero derivative.
* ``minimum``/``maximum`` at a tie pass half of the cotangent to each operand, as
  ``torch.minimum``/``torch.maximum`` do; ``clip`` passes the cotangent through when the operand
  lies inside the closed interval ``[lo, hi]`` (bounds included), as ``torch.clamp`` does.
* Operands that are plain numbers (``mpf``) are constants: an operation on constants only returns
  a constant, so parts of a formula that carry no gradient cost nothing extra.
"""

from __future__ import annotations

import itertools
import math
import operator

from mpmath import mp, mpf
from mpmath.libmp import fnone, from_float, fzero, mpf_abs, mpf_add, mpf_exp, mpf_pos, to_float

__all__ = [
    "Var", "value_of", "is_var", "sg", "exp", "log", "log1p", "expm1", "expm1_minus_x",
    "sigmoid", "tanh", "sqrt", "minimum", "maximum", "clip", "absolute", "total", "backward", "error_scales",
]

_ids = itertools.count()
_HALF = mpf(1) / 2


class Var:
    """A differentiable mpf value: ``value`` and ``parents`` = ((operand, d self / d operand), ...)."""

    # _i, _e, _v, _dv: scratch of graph_order() and error_scales_of() (see there), not part of the node
    __slots__ = ("value", "parents", "order", "rounding", "source", "dscale", "op", "_i", "_e", "_v", "_dv")

    def __init__(self, value, parents=(), rounding=None, source=None, dscale=None, op=None):
        self.value = value
        self.parents = parents
        self.order = next(_ids)
        # Which operation made the node, where the error of its local derivatives is not that of the
        # node's own value (see _edge_error): "mul", "mulc", "div", "divc", "rdiv", "log", "log1p",
        # "expm1", "sqrt", "tie", "em1x"; None: the derivative is computed from the node's value.
        self.op = op
        # For a fused node: per operand, the error (in units of u) with which the formula as usually
        # written computes that local derivative; None: derived from the node's own rounding.  It may
        # also be a function of e_of (a node's forward error E, as a float, or an mpf in the mpf
        # fallback) returning that tuple, where the error depends on the operands' own forward
        # errors (the entropy's gradient: see logprob.entropy_of); the scale passes call it once.
        self.dscale = dscale
        # For sg[x]: the node x whose value this is.  It carries x's rounding error (error_scales
        # follows it) but no derivative (backward does not).
        self.source = source
        # How to bound the rounding error this operation itself commits in floating point: None
        # for one correctly rounded operation, "sum" or "expm1_minus_x".  See error_scales().
        self.rounding = rounding

    # arithmetic -------------------------------------------------------------------------
    def __add__(self, other):
        if isinstance(other, Var):
            return Var(self.value + other.value, ((self, 1), (other, 1)))
        return Var(self.value + other, ((self, 1),))

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, Var):
            return Var(self.value - other.value, ((self, 1), (other, -1)))
        return Var(self.value - other, ((self, 1),))

    def __rsub__(self, other):
        return Var(other - self.value, ((self, -1),))

    def __mul__(self, other):
        if isinstance(other, Var):
            return Var(self.value * other.value, ((self, other.value), (other, self.value)), op="mul")
        return Var(self.value * other, ((self, other),), op="mulc")

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, Var):
            q = self.value / other.value
            return Var(q, ((self, 1 / other.value), (other, -q / other.value)), op="div")
        return Var(self.value / other, ((self, 1 / mpf(other)),), op="divc")

    def __rtruediv__(self, other):
        q = other / self.value
        return Var(q, ((self, -q / self.value),), op="rdiv")

    def __neg__(self):
        return Var(-self.value, ((self, -1),))

    def __pos__(self):
        return self

    # comparisons compare values (used for branch decisions, which carry no gradient) ---------
    def __lt__(self, other):
        return self.value < value_of(other)

    def __le__(self, other):
        return self.value <= value_of(other)

    def __gt__(self, other):
        return self.value > value_of(other)

    def __ge__(self, other):
        return self.value >= value_of(other)

    def __float__(self):
        return float(self.value)

    def __repr__(self):
        # Kept cheap on purpose: mpmath builds this string when an mpf meets a Var (mpf * Var)
        # before it hands the operation to Var.__rmul__.  Use describe() to see the value.
        return "Var"

    def describe(self):
        return f"Var({mp.nstr(self.value, 12)})"

    def __abs__(self):
        return absolute(self)


def is_var(x) -> bool:
    return isinstance(x, Var)


def value_of(x):
    """The mpf value of a Var, or x itself for a constant."""
    return x.value if isinstance(x, Var) else x


def sg(x):
    """Stop-gradient sg[x]: the value of x, carrying no derivative.

    For a Var the result is a new Var with no operands (so no derivative flows through it) that
    remembers x as its source, so that the tolerance model still sees the rounding error x
    carries (a truncated IS weight computed in float32 is not exact just because it is detached).
    """
    if isinstance(x, Var):
        return Var(x.value, (), source=x)
    return x


# elementary functions ----------------------------------------------------------------------

def exp(x):
    if isinstance(x, Var):
        y = mp.exp(x.value)
        return Var(y, ((x, y),))
    return mp.exp(x)


def log(x):
    if isinstance(x, Var):
        return Var(mp.log(x.value), ((x, 1 / x.value),), op="log")
    return mp.log(x)


def log1p(x):
    if isinstance(x, Var):
        return Var(mp.log1p(x.value), ((x, 1 / (1 + x.value)),), op="log1p")
    return mp.log1p(x)


def expm1(x):
    if isinstance(x, Var):
        return Var(_mp_expm1(x.value), ((x, mp.exp(x.value)),), op="expm1")
    return _mp_expm1(x)


def _mp_expm1(x):
    """mp.expm1(x), bit for bit, for an mpf x.

    mpmath's expm1 (mpmath/functions/functions.py, with ctx_base.sum_accurately) evaluates
    exp(x) + (-1) at the precision + 10 + extraprec + 5 bits, extraprec = 10 first, and again with
    extraprec increased by the cancellation (capped at that precision) until the cancellation is
    below extraprec; then it rounds once to the working precision.  The same steps on the raw libmp
    numbers, without setting the context's precision four times a call (most of its cost here:
    k3 = expm1(x) - x takes three expm1 per token).  Zero, non-finite and tiny x (|x| < 2^-(prec+10),
    where mpmath returns x + x^2/2) go to mp.expm1 itself.  tests/test_ad_scales.py checks the two
    agree bit for bit."""
    m = x._mpf_ if type(x) is mpf else None
    prec, rnd = mp._prec_rounding
    wp = prec + 10  # the guard bits of mpmath's function wrapper
    if m is None or not m[1] or m[2] + m[3] < -wp:
        return mp.expm1(x)
    extraprec = 10
    while True:
        p = wp + extraprec + 5
        e = mpf_exp(m, p, rnd)
        s = mpf_add(mpf_add(fzero, e, p, rnd), fnone, p, rnd)  # (0 + exp(x)) + (-1)
        max_mag = max(e[2] + e[3], 1)  # the magnitudes of the terms: exp(x), and 1 for -1
        if not s[1]:  # an exact zero sum: cancellation infinite
            extraprec += p
            continue
        cancellation = max_mag - (s[2] + s[3])
        if cancellation < extraprec:
            break
        extraprec += min(p, cancellation)
    return mp.make_mpf(mpf_pos(s, prec, rnd))


def _expm1_minus_x_value(x):
    """e^x - 1 - x without cancellation: expm1(x) - x loses about log2(2/|x|) bits when |x| < 1,
    so it is evaluated with that many extra bits (plus 10 guard bits) and rounded once."""
    if x == 0:
        return mpf(0)
    extra = 10 + max(0, -mp.mag(x))  # mag(x) >= log2|x|
    with mp.workprec(mp.prec + extra):
        y = _mp_expm1(x) - x
    return +y


def expm1_minus_x(x):
    """e^x - 1 - x, exact to working precision even for tiny |x| (the k3 core)."""
    if isinstance(x, Var):
        # its error scale is that of the formula as usually written, exp(x) - 1 - x
        return Var(_expm1_minus_x_value(x.value), ((x, _mp_expm1(x.value)),), rounding="expm1_minus_x", op="em1x")
    return _expm1_minus_x_value(x)


def sigmoid(x):
    if isinstance(x, Var):
        y = _sigmoid_value(x.value)
        # sigma'(x) = sigma(x) sigma(-x): no cancellation in 1 - y for large x
        return Var(y, ((x, y * _sigmoid_value(-x.value)),))
    return _sigmoid_value(x)


def _sigmoid_value(x):
    if x >= 0:
        return 1 / (1 + mp.exp(-x))
    e = mp.exp(x)
    return e / (1 + e)


def tanh(x):
    if isinstance(x, Var):
        # tanh'(x) = 1/cosh(x)^2: no cancellation in 1 - tanh(x)^2 for large |x|
        return Var(mp.tanh(x.value), ((x, 1 / mp.cosh(x.value) ** 2),))
    return mp.tanh(x)


def sqrt(x):
    if isinstance(x, Var):
        y = mp.sqrt(x.value)
        return Var(y, ((x, 1 / (2 * y)),), op="sqrt")
    return mp.sqrt(x)


def absolute(x):
    """|x|; derivative sign(x), 0 at x = 0 (as torch.abs)."""
    if isinstance(x, Var):
        v = x.value
        return Var(abs(v), ((x, mp.sign(v)),))
    return abs(x)


def minimum(a, b):
    """min(a, b); at a tie each operand receives half the cotangent (torch.minimum)."""
    va, vb = value_of(a), value_of(b)
    if va < vb:
        return a
    if vb < va:
        return b
    return _tie(a, b)


def maximum(a, b):
    """max(a, b); at a tie each operand receives half the cotangent (torch.maximum)."""
    va, vb = value_of(a), value_of(b)
    if va > vb:
        return a
    if vb > va:
        return b
    return _tie(a, b)


def _tie(a, b):
    parents = tuple((x, _HALF) for x in (a, b) if isinstance(x, Var))
    if not parents:
        return a
    return Var(value_of(a), parents, op="tie")


def clip(x, lo=None, hi=None):
    """clip(x, lo, hi) = min(max(x, lo), hi); derivative 1 on the closed interval [lo, hi].

    When a Var is clipped the result is the bound with no derivative; it stays a (parentless) Var
    whose rounding is |bound|, because an implementation holds the bound rounded to its dtype
    (1 + 0.28, or log(1e-8), are not binary numbers) and later operations amplify that error.
    """
    v = value_of(x)
    for bound, outside in ((lo, lo is not None and v < value_of(lo)), (hi, hi is not None and v > value_of(hi))):
        if outside:
            b = value_of(bound)
            return Var(b, (), rounding=abs(b)) if isinstance(x, Var) else b
    return x


def total(terms):
    """Sum of an iterable of Vars and constants, as one node (no deep chains of additions)."""
    const = mpf(0)
    parents = []
    acc = mpf(0)
    for t in terms:
        if isinstance(t, Var):
            acc += t.value
            parents.append((t, 1))
        else:
            const += t
    if not parents:
        return const
    return Var(acc + const, tuple(parents), rounding="sum")


# backward ------------------------------------------------------------------------------------

def backward(output, cotangent=1, order=None):
    """d <cotangent, output> / d leaf for every Var reachable from ``output`` (a Var, or nested lists of them).

    ``cotangent``: one number for every element (the default 1 gives the gradient of the sum of the
    outputs, the vector-Jacobian product with a ones vector, as ``y.backward(ones_like(y))``), or
    nested lists shaped like ``output``, one number per element: the vector-Jacobian product with
    that vector (``y.backward(c)``).  Elements of ``output`` that are not Vars (constants, ``None`` at
    a masked position) take no part, whatever their cotangent.
    Returns a dict from ``id(var)`` to its derivative (an mpf).

    ``order``: graph_order() of ``output`` and possibly more (evaluate() shares one with
    error_scales_of()); nodes that ``output`` does not depend on receive nothing and are skipped.
    """
    seeds = _seeds(output, cotangent)
    if not seeds:
        return {}
    roots = [r for r, _ in seeds]
    # Visit nodes in reverse creation order: a node is created after every operand it depends on,
    # so this is a valid reverse topological order.
    if order is None:
        order = graph_order(roots)
    N = len(order)
    grads = [None] * N  # by position in order (node._i)
    for r, c in seeds:
        i = r._i
        grads[i] = (0 if grads[i] is None else grads[i]) + c
    # A node's cotangent is the sum of its consumers' contributions.  They are collected and summed
    # exactly (mp.fsum, one rounding), so that 1 + 1e-87 - 1 gives 1e-87 whatever the order: two
    # paths through +x and -x must not wipe out a third, tiny one.
    fsum = mp.fsum
    for n in reversed(order):
        parents = n.parents
        if not parents:
            continue
        i = n._i
        g = grads[i]
        if g is None:
            continue
        if type(g) is list:
            g = grads[i] = fsum(g)
        for p, d in parents:
            j = p._i
            contribution = g if type(d) is int and d == 1 else g * d  # the int 1 of total() and +, -
            prev = grads[j]
            if prev is None:
                grads[j] = contribution
            elif type(prev) is list:
                prev.append(contribution)
            else:
                grads[j] = [prev, contribution]
    return {id(n): (fsum(g) if type(g) is list else g) for n, g in zip(order, grads) if g is not None}


def _seeds(output, cotangent):
    """[(root Var, its cotangent)] for the Var elements of ``output``: ``cotangent`` is one number for
    all, or nested lists shaped like ``output`` (a shape mismatch is a ValueError, never a broadcast)."""
    flat = _flatten(output)
    if isinstance(cotangent, (list, tuple)):
        cs = _flatten(cotangent)
        if len(cs) != len(flat) or _nest(output) != _nest(cotangent):
            raise ValueError(f"the cotangent has shape {_nest(cotangent)}, the output {_nest(output)}")
        return [(v, c) for v, c in zip(flat, cs) if isinstance(v, Var)]
    return [(v, cotangent) for v in flat if isinstance(v, Var)]


def _nest(x):
    """The shape of nested lists (the first element's, level by level)."""
    shape = []
    while isinstance(x, (list, tuple)):
        shape.append(len(x))
        if not x:
            break
        x = x[0]
    return shape


def _order(n):
    return n.order


_ORDER = operator.attrgetter("order")  # _order, without a Python call per node


def error_scales(output, leaves, cotangent=1):
    """The tolerance model's scale S (spec/tolerance.md): a first-order error bound, in units of u.

    Forward: E(y) = rounding(y) + sum over operands p of |dy/dp| E(p), with E = 0 at the inputs
    (they are exact) and rounding(y) = |y| for one correctly rounded operation (pairwise-sum and
    fused-op bounds are recorded on the node).  So S = |y| for an elementwise result and the sum
    of absolute terms for a reduction, weighted by how much each term's own error is amplified.

    Backward: the gradient of a leaf is a sum over paths of products of local derivatives; its
    scale is sum over paths of prod |d_e| * (1 + sum over inexact edges of (1 + E(n_e)/|n_e|)),
    which bounds the error of evaluating those derivatives from rounded values (the +-1 edges of
    sums and differences are exact and add nothing).  The backward pass starts from the cotangent
    of ``backward()``: each output element's path weight is |c| of its cotangent c (c is exact: the
    corpus's cotangents are bfloat16 numbers, so seeding with |c| adds no rounding of its own).

    Returns (scale of each output element as nested lists like ``output``, {id(leaf): scale}).
    """
    return error_scales_of([(output, leaves, cotangent)])[0]


def _error_scales_generic(output, leaves, cotangent=1):
    """error_scales() of one output by the plain definition (_scale_pass), in floats and, should a
    magnitude leave the float range, again in low-precision mpf.  error_scales_of() gives the same
    numbers faster; it falls back to this for an output whose float pass is not finite."""
    seeds = _seeds(output, cotangent)
    roots = [r for r, _ in seeds]
    nodes = {}
    stack = list(roots)
    while stack:
        n = stack.pop()
        if id(n) in nodes:
            continue
        nodes[id(n)] = n
        stack.extend(p for p, _ in n.parents if id(p) not in nodes)
        if n.source is not None and id(n.source) not in nodes:
            stack.append(n.source)
    order = sorted(nodes.values(), key=lambda n: n.order)
    # Scales need two or three significant digits: Python floats suffice and are fast.  Should a
    # magnitude leave the float range, the same pass runs again in low-precision mpf.
    for number in (float, lambda x: mpf(x)):
        with mp.workprec(64):
            E, grad_scales = _scale_pass(order, nodes, seeds, leaves, number)
        values = list(E.values()) + list(grad_scales.values())
        if number is not float or all(math.isfinite(v) for v in values):
            break
    return _out_scale(output, lambda x: E[id(x)]), grad_scales


def _out_scale(x, err):
    if isinstance(x, (list, tuple)):
        return [_out_scale(i, err) for i in x]
    if isinstance(x, Var):
        if not x.parents and x.source is None:
            return abs(x.value)  # an exact input; an sg[x] (a source, no parents) carries x's error
        e = err(x)
        # mpf(float) is exact (53 bits, less than any working precision): built without mpf()'s dispatch
        return mp.make_mpf(from_float(e)) if type(e) is float and mp.prec >= 53 else mpf(e)
    if x is None or isinstance(x, bool):
        return None
    return abs(x)


def graph_order(outputs):
    """Every Var that the outputs (Vars, or nested lists of them) depend on, through operands and
    through the source of an sg[x], in creation order (a topological order: operands first).

    Each node's ``_i`` is set to its position in the list: the passes below keep their per-node
    numbers in lists indexed by it instead of dicts keyed by id(node).  One order serves backward()
    and error_scales_of() for all the outputs of a formula, so the graph is walked and sorted once.
    """
    nodes = []
    seen = set()
    stack = [v for v in _flatten(outputs) if isinstance(v, Var)]
    while stack:
        n = stack.pop()
        k = id(n)
        if k in seen:
            continue
        seen.add(k)
        nodes.append(n)
        for p, _ in n.parents:
            if id(p) not in seen:
                stack.append(p)
        if n.source is not None and id(n.source) not in seen:
            stack.append(n.source)
    nodes.sort(key=_ORDER)
    for i, n in enumerate(nodes):
        n._i = i
    return nodes


def error_scales_of(requests, order=None):
    """error_scales(output, leaves[, cotangent]) for each (output, leaves[, cotangent]) of ``requests``,
    sharing the work.

    The numbers are those of _error_scales_generic(), bit for bit: the same float operations on the
    same operands in the same order.  What is shared is only what the generic pass recomputes: the
    walk and sort of the graph (``order``, from graph_order() of all the outputs, may be passed in),
    the forward pass E (a node's E depends only on the node and its operands, so one pass over
    the union of the outputs' graphs serves every output), and the conversions of values and local
    derivatives to float (each node's done once, in _float_errors(), and kept on the node).  The
    backward part runs only for an output with leaves (only the differentiated output has any).

    If a float leaves the float range anywhere in the shared pass, each output is recomputed
    alone by _error_scales_generic(), which decides between floats and mpf for that output as
    error_scales always has.
    """
    requests = [(r[0], r[1], r[2] if len(r) > 2 else 1) for r in requests]
    seeds_of = [_seeds(out, cot) for out, _, cot in requests]
    if order is None:
        order = graph_order([r for seeds in seeds_of for r, _ in seeds])
    finite = _float_errors(order)
    results = []
    for (output, leaves, cotangent), seeds in zip(requests, seeds_of):
        if finite:
            grad_scales = _float_grad_scales(order, seeds, leaves) if leaves else {}
            if all(math.isfinite(v) for v in grad_scales.values()):
                results.append((_out_scale(output, _e_of), grad_scales))
                continue
        results.append(_error_scales_generic(output, leaves, cotangent))
    return results


def _e_of(n):
    return n._e


_RND = mp._prec_rounding[1]  # the rounding of float(mpf): to nearest


def _float(x):
    """float(x) as _scale_pass's number(x) computes it (to nearest), without mpf.__float__'s dispatch."""
    m = getattr(x, "_mpf_", None)
    return float(x) if m is None else to_float(m, False, _RND)


def _abs_float(x):
    """abs(float(x)), bit for bit.  For a finite nonzero mpf (sign, man, exp, bc) it is
    ldexp(float(man), exp): float(man) rounds the integer man to 53 bits, to nearest with ties to
    even, exactly as to_float() does, and ldexp then scales it as to_float()'s own ldexp does."""
    m = getattr(x, "_mpf_", None)
    if m is None:
        return abs(float(x))
    if m[1]:
        try:
            return math.ldexp(float(m[1]), m[2])
        except OverflowError:
            pass
    return abs(to_float(m, False, _RND))


def _abs_float_64(m):
    """float(abs(x)) at 64 bits of precision (what _scale_pass's _rounding(n) = abs(n.value) gives under
    workprec(64)), for the raw mpf m of x: the mantissa is rounded to 64 bits, to nearest with ties to
    even as mpf_abs() rounds it, then to a float like _abs_float().  Same bits as
    to_float(mpf_abs(m, 64, "n"), False, "n"), without the two normalisations."""
    sign, man, exp, bc = m
    if man and bc > 64:
        shift = bc - 64
        q = man >> shift
        rem = man - (q << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and q & 1):
            q += 1
        try:
            return math.ldexp(float(q), exp + shift)
        except OverflowError:
            pass
    return to_float(mpf_abs(m, 64, _RND), False, _RND)


def _float_errors(order):
    """The forward pass of _scale_pass(number=float) over ``order``: sets each node's ``_e`` (E),
    ``_v`` (abs(float(value)), for the backward part) and ``_dv`` (abs(float(d)) of each operand's
    local derivative d).  Returns whether every E is finite."""
    finite = True
    isfinite = math.isfinite
    with mp.workprec(64):  # _rounding() runs at the precision _scale_pass gives it
        for n in order:
            value = n.value
            n._v = v = _abs_float(value)
            parents = n.parents
            n._dv = dv = tuple([abs(float(d)) if type(d) is int else _abs_float(d) for _, d in parents])
            src = n.source
            if src is not None:
                n._e = e = src._e  # sg[x] carries x's error
            else:
                r = n.rounding
                if not parents:
                    # an input is exact; a constant-valued node with a stated rounding keeps it
                    e = _float(r) if isinstance(r, mpf) else 0.0
                elif r is None and type(value) is mpf:
                    # one correctly rounded operation: |value| rounded to the pass's 64 bits, then to
                    # a float (a value of at most 64 bits is exact at 64 bits: that is |float(value)|)
                    m = value._mpf_
                    e = v if m[3] <= 64 else _abs_float_64(m)
                else:
                    e = _float(_rounding(n))
                for (p, _), ad in zip(parents, dv):
                    e += ad * p._e
                n._e = e
            if finite and not isfinite(e):
                finite = False
    return finite


def _float_grad_scales(order, seeds, leaves):
    """The backward part of _scale_pass(number=float), after _float_errors(order); ``seeds``: the
    (root, cotangent) pairs of _seeds()."""
    N = len(order)
    A = [None] * N  # None: not reached from the roots
    C = [0.0] * N
    for r, c in seeds:
        i = r._i
        A[i] = (0.0 if A[i] is None else A[i]) + abs(float(c))
    for n in reversed(order):
        i = n._i
        a = A[i]
        if a is None:
            continue
        c = C[i]
        e, v = n._e, n._v
        step = c + a * (1 + (e / v if v != 0 else e))
        ds = n.dscale
        if callable(ds):
            ds = ds(_e_of)
        op = n.op
        for k, ((p, d), ad) in enumerate(zip(n.parents, n._dv)):
            j = p._i
            prev = A[j]
            A[j] = (0.0 if prev is None else prev) + a * ad
            if ds is not None:  # a fused node states its derivatives' error
                C[j] = C[j] + c * ad + a * _float(ds[k])
            elif op is not None:  # the derivative's own error (_edge_error)
                C[j] = C[j] + (c + a * _edge_error(n, k, _e_of, _v_of, _float)) * ad
            else:
                # the +-1 of a sum or difference is exact (see _scale_pass)
                C[j] = C[j] + (c if type(d) is int else step) * ad
    grad_scales = {}
    for leaf in leaves:
        i = getattr(leaf, "_i", None)  # a leaf outside this graph may carry another graph's _i
        if i is not None and i < N and order[i] is leaf:
            grad_scales[id(leaf)] = (0.0 if A[i] is None else A[i]) + C[i]
        else:
            grad_scales[id(leaf)] = 0.0 + 0.0
    return grad_scales


def _scale_pass(order, nodes, seeds, leaves, number):
    E = {}
    for n in order:
        if n.source is not None:
            E[id(n)] = E[id(n.source)]  # sg[x] carries x's error
            continue
        # an input is exact; a constant-valued node with a stated rounding keeps it
        e = number(0) if not n.parents and not isinstance(n.rounding, mpf) else number(_rounding(n))
        for p, d in n.parents:
            e += abs(number(d)) * E[id(p)]
        E[id(n)] = e
    rel = {}
    for k, n in nodes.items():
        v = abs(number(n.value))
        rel[k] = 1 + (E[k] / v if v != 0 else E[k])
    A, C = {}, {}
    for r, c in seeds:
        A[id(r)] = A.get(id(r), number(0)) + abs(number(c))  # the cotangent's |c|: exact
        C.setdefault(id(r), number(0))
    for n in reversed(order):
        a = A.get(id(n))
        if a is None:
            continue
        c = C[id(n)]
        step = c + a * rel[id(n)]
        ds = n.dscale
        if callable(ds):
            ds = ds(lambda q: E[id(q)])
        op = n.op
        for k, (p, d) in enumerate(n.parents):
            ad = abs(number(d))
            A[id(p)] = A.get(id(p), number(0)) + a * ad
            if ds is not None:  # a fused node states its derivatives' error
                C[id(p)] = C.get(id(p), number(0)) + c * ad + a * number(ds[k])
            elif op is not None:  # the derivative's own error (_edge_error)
                err = _edge_error(n, k, lambda q: E[id(q)], lambda q: abs(number(q.value)), number)
                C[id(p)] = C.get(id(p), number(0)) + (c + a * err) * ad
            else:
                # the +-1 of a sum or difference is exact: only a derivative computed from a rounded
                # value (exp's y, a product's other factor, ...) carries that value's relative error
                C[id(p)] = C.get(id(p), number(0)) + (c if type(d) is int else step) * ad
    grad_scales = {id(leaf): A.get(id(leaf), number(0)) + C.get(id(leaf), number(0)) for leaf in leaves}
    return E, grad_scales


def _v_of(n):
    return n._v


def _rel_of(q, e_of, v_of):
    """E(q) / |q|, the relative error of a rounded value in units of u (E(q) where q = 0)."""
    v = v_of(q)
    return e_of(q) / v if v != 0 else e_of(q)


def _edge_error(n, k, e_of, v_of, num):
    """The relative error, in units of u, with which the usual evaluation of the chain rule forms
    a * d_k, the cotangent a of node n times the local derivative d_k of its operand k: one rounding
    for the product, plus the error of d_k as it is computed, from the rounded values it is computed
    from (and no others).  ``e_of``/``v_of`` give a node's E and |value|, ``num`` a number's value.

    Only nodes made by an operation with an ``op`` tag come here; for the others (exp, whose
    derivative is its own value y, and nodes built by a formula module) the derivative is the
    node's value's, 1 + E(n)/|n|.  The distinction matters where a value cancels: the mean of
    values near +-1e18 that sum to 1 has a huge relative error, but its derivative 1/n has none.
    """
    op = n.op
    ps = n.parents
    if type(op) is tuple:  # ("k3w", |x|, |l - l_old|): w k3(x), its derivative -w x as the closed form
        # w = e^(l - l_old) errs by 1 + |l - l_old| (relative) plus E(l), x = l_ref - l by 1 plus E(l)/|x|,
        # their product by 1, and the product with the cotangent by 1
        ax, adl = num(op[1]), num(op[2])
        el = e_of(ps[0][0])
        return 4 + adl + el + (el / ax if ax != 0 else el)
    if op == "tie":  # 1/2: exact
        return 0
    if op == "mul":  # d = the other factor
        return 1 + _rel_of(ps[1 - k][0], e_of, v_of)
    if op in ("mulc", "divc"):  # d = a constant c or 1/c, rounded to the dtype
        return 2
    if op == "div":  # y = p/q:  d_p = 1/q;  d_q = -y/q
        q = ps[1][0]
        return 2 + _rel_of(q, e_of, v_of) if k == 0 else 2 + _rel_of(n, e_of, v_of) + _rel_of(q, e_of, v_of)
    if op == "rdiv":  # y = c/q:  d_q = -y/q
        return 2 + _rel_of(n, e_of, v_of) + _rel_of(ps[0][0], e_of, v_of)
    if op == "log":  # d = 1/x
        return 2 + _rel_of(ps[0][0], e_of, v_of)
    if op == "log1p":  # d = 1/(1 + x): the rounded x errs by E(x), relative to 1 + x
        x = ps[0][0]
        return 2 + e_of(x) / abs(1 + num(x.value))
    if op == "expm1":  # d = e^x: relative error E(x)
        return 2 + e_of(ps[0][0])
    if op == "sqrt":  # d = 1/(2y)
        return 2 + _rel_of(n, e_of, v_of)
    if op == "em1x":
        # d = e^x - 1 as the usual backward of exp(x) - 1 - x forms it: the cotangent times the
        # rounded e^x (two roundings of size e^x), less the cotangent (one of size |e^x - 1|), with
        # x's error amplified by e^x; relative to |e^x - 1|, plus the product's rounding
        em = abs(num(ps[0][1]))
        if em == 0:
            return 0
        ex = abs(num(ps[0][1]) + 1)
        return 1 + (2 * ex + em) / em + ex * e_of(ps[0][0]) / em
    raise AssertionError(f"unknown op {op!r}")


def _rounding(n):
    """The rounding error committed by node n itself, in units of u."""
    if isinstance(n.rounding, mpf):
        return n.rounding  # a fused node states the error of its formula as usually written
    if n.rounding == "sum":
        # a sum of k terms evaluated pairwise errs by at most ceil(log2 k) * u * sum |terms|
        const = n.value - mp.fsum(p.value for p, _ in n.parents)
        k = len(n.parents) + (1 if const else 0)
        return max(1, (k - 1).bit_length()) * (mp.fsum(abs(p.value) for p, _ in n.parents) + abs(const))
    if n.rounding == "expm1_minus_x":
        # exp(x) - 1 - x as usually written: three roundings of magnitude e^x, e^x - 1 and the result
        x = n.parents[0][0].value
        return abs(mp.exp(x)) + abs(_mp_expm1(x)) + abs(n.value)
    return abs(n.value)


def _flatten(x):
    """The elements of nested lists (or tuples) in depth-first order, as a list (a recursive
    generator costs a frame switch per element and level: the outputs have up to 64k elements)."""
    if not isinstance(x, (list, tuple)):
        return [x]
    out = []
    _flatten_into(x, out)
    return out


def _flatten_into(x, out):
    for item in x:
        if isinstance(item, (list, tuple)):
            _flatten_into(item, out)
        else:
            out.append(item)
