"""Judge fast, confirm exactly (`pgspec fuzz`).

``fast(adapter, fid, example, dtype)`` compares the adapter with the built-in torch backend in float64
(the oracle of `pgspec check`): every compared element must lie within ``K u(dtype) S + floor(dtype)``
of the oracle, widened by the oracle's own float64 error ``K u(float64) S``, as ``check._judge``
bounds it.  S is the oracle's tolerance scale (``check.oracle_scales``) where `pgspec check` has one
for the formula and its parameters, else the reference's S (``pgspec.reference.evaluate(...,
with_scale=True)`` at 15 digits: S is a magnitude, a few digits of it are plenty).  An example the
oracle rejects is invalid (the backend rejects what the spec rejects) and is not judged.

``confirm(adapter, fid, example, dtype)`` makes the example a golden record with the generator's own
code (``golden.generate_case``: the mpmath reference at 60 digits and its scales) and runs it as
`pgspec run` runs a golden case (``runner.run_case``: the tolerance model, then the adapter's
declarations and the runner's classification).  Only a ``fail`` or ``error`` there is a new
counterexample; ``bug`` and ``convention`` are a declared rule's; ``pass`` means the oracle was wrong
(an element decided by float64 rounding), never reported.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from pgspec.reference import REGISTRY

from ..corpus.generator import cotangent_array, cotangent_seed
from ..judge import compare, tolerance

U64 = 2.0 ** -53


class Invalid(Exception):
    """The example is outside the spec (the oracle or the reference rejects it): not judged."""


_ORACLE: list = []


def oracle_adapter():
    """The built-in torch backend (loaded once); ``set_oracle`` replaces it (the power bench keeps an
    unmutated backend as the oracle of a mutated one)."""
    if not _ORACLE:
        from ..run.loading import load_adapter

        _ORACLE.append(load_adapter("torch"))
    return _ORACLE[0]


def set_oracle(adapter) -> None:
    _ORACLE[:] = [adapter]


def case_id(fid: str, example: dict) -> str:
    digest = hashlib.sha256(json.dumps(example, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{fid}/fuzz-{digest}"


def _scales(fid: str, tensors: dict, params: dict, example: dict, cotangent=None) -> dict:
    """S of every output and gradient element; the gradients' for the VJP with ``cotangent`` (a numpy
    array shaped like the grad_of output, None: ones)."""
    from .. import check

    if fid in check.ORACLE_FORMULAS and (cotangent is None or np.ndim(cotangent) == 0):
        c = 1.0 if cotangent is None else abs(float(cotangent))     # a scalar output: S(grad) scales by |c|
        try:
            return {k: (v * c if k.startswith("grad.") else v)
                    for k, v in check.oracle_scales(fid, tensors, params).items()}
        except Exception:  # noqa: BLE001 - no oracle scale for these parameters: the reference's S
            pass
    from pgspec.reference import SpecError, evaluate

    try:
        r = evaluate(fid, example["inputs"], example["params"], dps=15, with_scale=True,
                     cotangent=None if cotangent is None else cotangent.tolist())
    except SpecError as e:
        raise Invalid(str(e)) from None
    return {k: np.asarray(_floats(v), dtype=np.float64) for k, v in r["scale"].items()}


def _floats(x):
    if isinstance(x, list):
        return [_floats(v) for v in x]
    return math.nan if x is None else float(x)


def _np(t):
    if hasattr(t, "detach"):
        return t.detach().to("cpu").double().numpy()
    return np.asarray(t, dtype=np.float64)


def fast(adapter, fid: str, example: dict, dtype: str, device: str = "cpu") -> str | None:
    """None when the adapter agrees with the float64 oracle within the bound, else what disagrees
    (one line); Invalid when the example is outside the spec."""
    import torch

    f = REGISTRY[fid]
    inputs, params = example["inputs"], example["params"]
    from ..run.runner import adapter_params

    p = adapter_params(fid, params)
    t64 = compare.to_tensors(fid, inputs, "float64", "cpu")
    try:
        ref_out, ref_grads = compare.call(oracle_adapter(), fid, t64, p)
        # the VJP with the cotangent `pgspec golden` would give the example's record (confirm(), below):
        # pgspec-cotangent/1 seeded by its case ID, shaped like the oracle's grad_of output
        cotangent = None
        if f.differentiable and isinstance(ref_out.get(f.grad_of), torch.Tensor):
            cotangent = cotangent_array(cotangent_seed(case_id(fid, example)), tuple(ref_out[f.grad_of].shape))
            t64 = compare.to_tensors(fid, inputs, "float64", "cpu")
            ref_out, ref_grads = compare.call(oracle_adapter(), fid, t64, p, cotangent=cotangent)
    except Exception as e:  # noqa: BLE001 - the backend rejects what the spec rejects
        raise Invalid(f"{type(e).__name__}: {e}") from None
    scales = _scales(fid, t64, p, example, cotangent)
    from ..run.untrusted import CaseTimeout, time_limit

    try:
        tensors = compare.to_tensors(fid, inputs, dtype, device)
        with time_limit(adapter.name):      # the runner's limit (--case-timeout): a hang is the example's error
            out, grads = compare.call(adapter, fid, tensors, p, cotangent=cotangent)
    except CaseTimeout as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - the implementation's crash: confirmed by the runner
        return f"raised {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    mask = _np(inputs["mask"]).astype(bool) if "mask" in inputs else None
    K = tolerance.K[f.family]
    u, floor = float(tolerance.UNIT_ROUNDOFF[dtype]), float(tolerance.FLOOR[dtype])
    primary = f.grad_of or f.outputs[0].name
    checks = [(o.name, out.get(o.name) if isinstance(out, dict) else None, ref_out.get(o.name),
               scales.get(o.name) if getattr(o, "kind", "real") == "real" else None) for o in f.outputs]
    checks += [(f"grad.{n}", (grads or {}).get(n), g, scales.get(f"grad.{n}")) for n, g in ref_grads.items()]
    for key, got, ref, scale in checks:
        if ref is None:
            continue
        if got is None:
            if key == primary or key.startswith("grad."):
                return f"no {key!r} returned"
            continue
        r = _np(ref)
        try:
            g = _np(got)
        except Exception:  # noqa: BLE001 - not a tensor of numbers: the runner says what
            return f"{key}: not a tensor of numbers"
        if g.shape != r.shape:
            return f"{key}: shape {g.shape}, expected {r.shape}"
        if scale is None:       # a boolean or integer output (a keep mask, a count): equal, or wrong
            sel = np.ones(r.shape, dtype=bool)
            if mask is not None and r.ndim >= 2 and r.shape[:2] == mask.shape:
                sel &= mask.reshape(mask.shape + (1,) * (r.ndim - 2))
            bad = np.flatnonzero((sel & ~((g == r) | (np.isnan(g) & np.isnan(r)))).reshape(-1))
            if bad.size:
                k = int(bad[0])
                idx = [int(i) for i in np.unravel_index(k, r.shape)] if r.shape else []
                return f"{key}{idx}: got {g.reshape(-1)[k]!r}, oracle {r.reshape(-1)[k]!r}"
            continue
        s = _np(scale)
        if s.shape != r.shape:
            s = np.broadcast_to(s, r.shape) if s.size == 1 else s.reshape(r.shape) if s.size == r.size else None
            if s is None:
                continue
        sel = np.isfinite(s) & ~np.isnan(r)
        if mask is not None and r.ndim >= 2 and r.shape[:2] == mask.shape and not key.startswith("grad."):
            sel &= mask.reshape(mask.shape + (1,) * (r.ndim - 2))
        bound = K * u * s + floor + K * U64 * s
        with np.errstate(invalid="ignore", over="ignore"):
            same_inf = np.isinf(r) & (g == r)
            err = np.where(same_inf, 0.0, np.abs(g - r))
            err = np.where(np.isnan(err), np.inf, err)
        bad = np.flatnonzero((sel & ~(err <= bound)).reshape(-1))
        if bad.size:
            k = int(bad[0])
            idx = [int(i) for i in np.unravel_index(k, r.shape)] if r.shape else []
            return (f"{key}{idx}: got {g.reshape(-1)[k]!r}, oracle {r.reshape(-1)[k]!r}, bound "
                    f"{bound.reshape(-1)[k]:.3g}")
    return None


def record(fid: str, example: dict, description: str = "") -> dict:
    """The example as a golden record (the generator's code: the reference at 60 digits); an example
    with ``expect_error`` (``examples.broken``) as an expected-error record, Invalid when the reference
    does not reject it naming the argument."""
    from pgspec.reference import SpecError

    from ..corpus.cases.case import Case
    from ..corpus.golden import generate_case

    err = example.get("expect_error")
    case = Case(case_id(fid, example), fid, "error" if err else "edge", description or "found by pgspec fuzz",
                example["inputs"], example["params"], expect_error=err)
    try:
        rec = generate_case(case)
    except SpecError as e:
        raise Invalid(str(e)) from None
    except ValueError as e:     # an example broken on purpose that the reference accepts (or not naming its argument)
        if err is None:
            raise
        raise Invalid(str(e)) from None
    return {**rec, "family": REGISTRY[fid].family}


def confirm(adapter, fid: str, example: dict, dtype: str, device: str = "cpu"):
    """The runner's verdict (a CaseResult) on the example made a golden record."""
    from ..run.runner import run_case

    return run_case(adapter, record(fid, example), dtype, device)
