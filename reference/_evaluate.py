"""``evaluate``: validate inputs and parameters, run one formula in mpmath, return values and gradients."""

from __future__ import annotations

from mpmath import mp, mpf
from mpmath.libmp import from_float as _from_float

from . import _ad, _progress
from ._errors import SpecError
from ._registry import Formula, get

DEFAULT_DPS = 60
# the documented limits of one evaluation (docs/bad-input.md, "Limits of the reference"): the
# precision, and the elements of one input (the corpus's largest input has 65,536; mpmath takes
# about a millisecond an element and more
# memory than the input itself, so 10^7 elements would run for hours instead of refusing)
MAX_DPS = 1000
MAX_ELEMENTS = 1_000_000


def evaluate(formula_id: str, inputs: dict, params: dict | None = None, *, dps: int = DEFAULT_DPS,
             with_scale: bool = False, cotangent=None, progress=None):  # noqa: C901
    """Evaluate formula ``formula_id`` on ``inputs`` with ``params`` at ``dps`` decimal digits.

    Returns a dict from each output name to an ``mpf`` (or a bool, an int, ``None`` at a masked
    position) or nested lists of them, plus ``"grad"``: a dict from each differentiable input
    name to the vector-Jacobian product d(sum over the unmasked elements i of output ``grad_of`` of
    c_i * out_i)/d(input), nested like that input, with exact zeros at masked positions.
    ``cotangent``: the c_i, one real number per element of the ``grad_of`` output, nested like it
    (a single number for a scalar output), or a function of that output's shape (a list of sizes,
    [] for a scalar; some outputs' sizes depend on the data) returning them; masked elements take no
    part whatever their c_i.  None:
    c_i = 1 for every element (the gradient of the sum).  The golden corpus draws c per case
    (spec/golden-format.md, "Cotangent").  Raises ``SpecError`` on any bad input.

    With ``with_scale=True`` the result also has ``"scale"``: the tolerance model's scale S
    (spec/tolerance.md) of every output element, keyed by output name, and of every gradient
    element, keyed ``"grad.<input>"`` (the backward pass's running error bound, seeded with |c_i|).

    ``progress``: None (the default) shows the evaluation's steps and the time elapsed on stderr when
    it is a terminal and an input has at least 100,000 elements (minutes of work); True shows them on
    a terminal whatever the size; False never; a callable is called ``progress(step, done, total)``
    as each step starts ("the inputs", "the formula", "the gradient", "the error scales": ``done`` of
    ``total`` steps are done) and ``("done", total, total)`` at the end.
    """
    if not isinstance(formula_id, str):
        raise SpecError(f"formula_id must be a formula ID string such as 'kl.k3', got {type(formula_id).__name__} "
                        f"{formula_id!r}")
    f = get(formula_id)
    if params is not None and not isinstance(params, dict):
        raise SpecError(f"{formula_id}: params must be a dict of parameter name -> value (or None), "
                        f"got {type(params).__name__} {params!r}")
    if not isinstance(dps, int) or isinstance(dps, bool) or not 15 <= dps <= MAX_DPS:
        raise SpecError(f"dps must be an integer from 15 to {MAX_DPS}, got {dps!r}")
    if not isinstance(inputs, dict):
        raise SpecError(f"{formula_id}: inputs must be a dict of input name -> nested list, got {type(inputs).__name__}")
    _progress.check_progress(progress)
    with mp.workdps(dps), _progress.steps(progress, f, inputs, with_scale) as step:
        step("the inputs")
        checked_params = check_params(f, params)
        converted, leaves = convert_inputs(f, inputs, track_all=with_scale)
        step("the formula")
        raw = f.func(**converted, **checked_params)
        missing = [o.name for o in f.outputs if o.name not in raw]
        extra = [k for k in raw if k not in {o.name for o in f.outputs}]
        if missing or extra:
            raise AssertionError(f"{formula_id}: outputs {sorted(raw)} do not match the declaration")
        result = {name: _values(v) for name, v in raw.items()}
        grads = {}
        cot = 1 if cotangent is None or not f.differentiable else _cotangent(f, raw[f.grad_of], cotangent)
        order = None
        if f.differentiable:
            step("the gradient")
            # one walk and sort of the graph of every output serves the gradient and the scales
            order = _ad.graph_order([raw[o.name] for o in f.outputs]) if with_scale else None
            d = _ad.backward(raw[f.grad_of], cotangent=cot, order=order)
            for name, nested_leaves in leaves.items():
                grads[name] = _collect(nested_leaves, d)
        result["grad"] = grads
        if with_scale:
            step("the error scales")
            result["scale"] = _scales(f, raw, leaves, order, cot)    # (without a gradient, the same walk, made there)
    return result


def _cotangent(f: Formula, out, cotangent):
    """The cotangent as mpf numbers nested like the ``grad_of`` output ``out``; a SpecError naming
    'cotangent' when its shape differs or an element is not a finite real number."""
    want = _ad._nest(out)
    if callable(cotangent):
        cotangent = cotangent(list(want))
    got = _ad._nest(cotangent)
    if want != got or len(_ad._flatten(cotangent)) != len(_ad._flatten(out)):
        raise SpecError(f"{f.id}: cotangent must have the shape of output {f.grad_of!r}, {want}, got shape {got}")

    def conv(x, path=()):
        if isinstance(x, (list, tuple)):
            return [conv(item, path + (k,)) for k, item in enumerate(x)]
        where = "".join(f"[{i}]" for i in path)
        if isinstance(x, bool) or not isinstance(x, (int, float, str, mpf)):
            raise SpecError(f"{f.id}: cotangent{where} must be a real number, got {x!r}")
        try:
            v = mpf(x)
        except (TypeError, ValueError):
            raise SpecError(f"{f.id}: cotangent{where} must be a real number, got {x!r}") from None
        if not mp.isfinite(v):
            raise SpecError(f"{f.id}: cotangent{where} must be finite, got {x!r}")
        return v

    return conv(cotangent)


def _scales(f: Formula, raw: dict, leaves: dict, order=None, cot=1) -> dict:
    scales = {}
    all_leaves = [leaf for nested in leaves.values() for leaf in _ad._flatten(nested) if leaf is not None]
    # all outputs at once: they share one walk of the graph and one forward error pass
    results = _ad.error_scales_of([(raw[o.name], all_leaves, cot) if o.name == f.grad_of else (raw[o.name], [])
                                   for o in f.outputs], order)
    for o, (out_scale, grad_scale) in zip(f.outputs, results):
        scales[o.name] = out_scale
        if o.name == f.grad_of:
            for name, nested in leaves.items():
                scales[f"grad.{name}"] = _collect(nested, grad_scale)
    return scales


def check_params(f: Formula, params: dict | None) -> dict:
    if params is not None and not isinstance(params, dict):
        raise SpecError(f"{f.id}: params must be a dict of parameter name -> value (or None), "
                        f"got {type(params).__name__} {params!r}")
    params = dict(params or {})
    known = {p.name: p for p in f.params}
    unknown = sorted((k for k in params if k not in known), key=repr)
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        raise SpecError(f"{f.id}: unknown parameter(s) {unknown}; parameters are: {listed}")
    out = {}
    for name, p in known.items():
        value = p.check(f.id, params.get(name, p.default))
        # A float parameter means its binary64 value (what strtod gives a JSON reader); a decimal
        # string means that exact decimal.  Either is converted exactly at the working precision.
        if p.kind == "real" and value is not None:
            value = mpf(value)
        out[name] = value
    return out


def convert_inputs(f: Formula, inputs: dict, track_all: bool = False):
    """Validate shapes, kinds and finiteness; return (converted inputs, differentiable leaves).

    Real inputs become mpf; positions where the mask is false become ``None`` so that no value
    there, finite or not, can reach a result.  Differentiable inputs become ``_ad.Var`` leaves;
    with ``track_all`` every real input does (so the tolerance scale sees every rounding), while
    gradients are still reported for the differentiable inputs only.
    """
    names = {i.name for i in f.inputs}
    unknown = sorted((k for k in inputs if k not in names), key=repr)
    if unknown:
        raise SpecError(f"{f.id}: unknown input(s) {unknown}; inputs are: {', '.join(i.name for i in f.inputs)}")
    dims: dict[str, tuple[int, str]] = {}
    shapes = {}
    for spec in f.inputs:
        if spec.name not in inputs or inputs[spec.name] is None:
            if not spec.optional:
                expected = " or ".join("[" + ",".join(map(str, s)) + "]" for s in spec.shapes)
                raise SpecError(f"{f.id}: missing input {spec.name!r} (expected shape {expected})")
            continue
        # one level beyond the rank is left to the shape check (data a case can hold); two are refused here
        shape = _shape(inputs[spec.name], spec.name, f.id, limit=max(len(s) for s in spec.shapes) + 1)
        size = 1
        for n in shape:
            size *= n
        if size > MAX_ELEMENTS:
            raise SpecError(f"{f.id}: input {spec.name!r} has {size:,} elements (shape {list(shape)}); the reference "
                            f"evaluates at most {MAX_ELEMENTS:,} per input (about a millisecond each): split the batch, "
                            "or judge a production-size kernel with pgspec check")
        shapes[spec.name] = _match_shape(f, spec, shape, dims)
    mask = None
    mask_name = f.mask_input
    if mask_name is not None and mask_name in inputs and inputs[mask_name] is not None:
        mask = inputs[mask_name]
    converted = {}
    leaves = {}
    for spec in f.inputs:
        if spec.name not in inputs or inputs[spec.name] is None:
            converted[spec.name] = None
            continue
        value = inputs[spec.name]
        shape_syms = shapes[spec.name]
        if spec.kind == "bool":
            converted[spec.name] = _check_leaves(value, spec.name, f.id, _is_bool, "a bool (true/false)")
            continue
        if spec.kind == "int":
            converted[spec.name] = _check_leaves(value, spec.name, f.id, _is_int, "an integer")
            continue
        masked = mask is not None and spec.name != mask_name and shape_syms[:2] == ("B", "T")
        converted[spec.name] = _to_mpf(value, spec.name, f.id, mask if masked else None, ())
        if spec.name in f.differentiable or track_all:
            converted[spec.name] = _make_leaves(converted[spec.name])
            if spec.name in f.differentiable:
                leaves[spec.name] = converted[spec.name]
    return converted, leaves


def _is_bool(x):
    return isinstance(x, bool)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _shape(x, name, fid, path=(), limit=None):
    """The shape of a nested list (ragged: SpecError).  ``limit``: the most levels the input may have
    (its declared rank); deeper nesting, a list that contains itself included, is a SpecError naming
    the input, never a RecursionError."""
    if isinstance(x, (list, tuple)):
        if limit is not None and len(path) >= limit:
            where = "".join(f"[{i}]" for i in path)
            raise SpecError(f"{fid}: input {name!r} is nested deeper than its shape allows (its rank is "
                            f"{limit - 1}): {name}{where} is a list, where a number belongs")
        if not x:
            return (0,)
        for item in x:
            if isinstance(item, (list, tuple)):
                break
        else:  # a row of numbers (each of shape ()): the common, long case, without a call per element
            return (len(x),)
        subs = [_shape(item, name, fid, path + (k,), limit) for k, item in enumerate(x)]
        first = subs[0]
        for k, s in enumerate(subs):
            if s != first:
                where = "".join(f"[{i}]" for i in path)
                raise SpecError(
                    f"{fid}: input {name!r} is ragged: {name}{where}[0] has shape {list(first)} "
                    f"but {name}{where}[{k}] has shape {list(s)}; pad to a rectangular array"
                )
        return (len(x),) + first
    return ()


def _match_shape(f, spec, shape, dims):
    """Match ``shape`` against the input's declared shapes, binding dimension symbols in ``dims``.

    An empty list (shape ``[0]``) is an empty batch: it binds the first dimension to 0 and leaves
    the others unbound; like any other size it must agree with the other inputs."""
    expected = " or ".join("[" + ",".join(map(str, s)) + "]" for s in spec.shapes)
    for candidate in spec.shapes:
        if len(candidate) != len(shape) and not (shape == (0,) and len(candidate) >= 1):
            continue
        trial = dict(dims)
        ok = True
        for sym, n in zip(candidate, shape):
            if isinstance(sym, int):
                ok = ok and sym == n
            elif sym in trial and trial[sym][0] != n:
                ok = False
            else:
                trial.setdefault(sym, (n, spec.name))
        if ok:
            dims.update(trial)
            return tuple(candidate)
    bound = ", ".join(f"{s}={n} (from {src!r})" for s, (n, src) in dims.items())
    raise SpecError(
        f"{f.id}: input {spec.name!r} must have shape {expected}"
        + (f" with {bound}" if bound else "")
        + f", got shape {list(shape)}"
    )


def _check_leaves(x, name, fid, pred, expected, path=()):
    if isinstance(x, (list, tuple)):
        return [_check_leaves(item, name, fid, pred, expected, path + (k,)) for k, item in enumerate(x)]
    if not pred(x):
        where = "".join(f"[{i}]" for i in path)
        raise SpecError(f"{fid}: input {name}{where} must be {expected}, got {x!r}")
    return x


def _to_mpf(x, name, fid, mask, path):
    """Convert a nested list of numbers to mpf; positions where ``mask`` is false become None.

    ``mask`` is None (no mask), a nested list aligned with ``x`` (the [B, T] levels), or one bool
    for the whole subtree (the vocabulary level of [B, T, V] logits).
    """
    if not isinstance(x, (list, tuple)):
        return _leaf(x, name, fid, mask, path[:-1], path[-1] if path else None)
    aligned = isinstance(mask, list)
    if x and not isinstance(x[0], (list, tuple)):
        return [_leaf(item, name, fid, mask[k] if aligned else mask, path, k) for k, item in enumerate(x)]
    return [_to_mpf(item, name, fid, mask[k] if aligned else mask, path + (k,)) for k, item in enumerate(x)]


def _leaf(x, name, fid, mask, path, k):
    """One real input value (the element k of the list at ``path``); None where masked out."""
    if mask is False:
        return None  # excluded: never read by any formula
    if type(x) is float:
        v = _FLOATS.get(x)  # a float converts exactly at any precision: share one mpf per value
        if v is not None:
            return v
        if x == x and x not in (_INF, -_INF):
            if len(_FLOATS) > 1_000_000:
                _FLOATS.clear()
            v = _FLOATS[x] = mpf(x)
            return v
    where = "".join(f"[{i}]" for i in path + ((k,) if k is not None else ()))
    if isinstance(x, bool) or not isinstance(x, (int, float, str, mpf)):
        raise SpecError(f"{fid}: input {name}{where} must be a real number (int, float or decimal string), got {x!r}")
    try:
        v = mpf(x)
    except (TypeError, ValueError):
        raise SpecError(f"{fid}: input {name}{where} must be a real number, got {x!r}") from None
    if not mp.isfinite(v):
        allowed = " (NaN and +-inf are allowed only where the mask is false)" if mask is not None else ""
        raise SpecError(f"{fid}: input {name}{where} must be finite{allowed}, got {x!r}")
    return v


_make_mpf = mp.make_mpf
_INF = float("inf")
_FLOATS: dict = {}


def _make_leaves(x):
    if isinstance(x, list):
        if x and not isinstance(x[0], list):  # a row (inputs are rectangular): no call per element
            Var = _ad.Var
            return [None if item is None else Var(item) for item in x]
        return [_make_leaves(item) for item in x]
    if x is None:
        return None
    return _ad.Var(x)


def _values(x):
    if isinstance(x, list):
        return [_values(item) for item in x]
    if isinstance(x, _ad.Var):
        return x.value
    if isinstance(x, (bool, int)) or x is None:
        return x
    return mpf(x)


def _collect(leaves, d):
    if isinstance(leaves, list):
        if leaves and not isinstance(leaves[0], list):  # a row of leaves: the common, long case
            prec = mp.prec
            zero = mpf(0)  # one shared zero for the masked positions (an mpf is immutable)
            return [zero if x is None else _as_mpf(d.get(id(x), 0), prec) for x in leaves]
        return [_collect(item, d) for item in leaves]
    if leaves is None:
        return mpf(0)
    return _as_mpf(d.get(id(leaves), 0), mp.prec)


def _as_mpf(x, prec):
    """mpf(x), skipping mpf()'s generic conversion where it is known to change nothing: a gradient
    is already an mpf of at most ``prec`` bits (mpf() would return an equal copy), and a scale is a
    float, which converts exactly (from_float at 53 bits; the working precision is more)."""
    t = type(x)
    if t is mpf and x._mpf_[3] <= prec:
        return x
    if t is float and prec >= 53:
        return _make_mpf(_from_float(x))
    return mpf(x)
