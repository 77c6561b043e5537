"""Judging an adapter's result against the oracle: each element within K u S + floor of the
oracle's value (widened by the oracle's own float64 bound), the worst ratio and the first failure,
and the adapter's declarations (a rule turns a fail into a known bug or a convention)."""

from __future__ import annotations

import json
import math
import time

import numpy as np

from pgspec.reference import REGISTRY

from ..judge import compare, tolerance
from .common import OutputCheck, U64, unravel
from .draws import to_tensors


# ------------------------------------------------------------------------------------------------
# The check
# ------------------------------------------------------------------------------------------------
def _judge(name, got, ref, scale, mask, family, dtype) -> OutputCheck:
    """Every element (unmasked ones for per-token results) of ``got`` against the oracle's value
    with bound K u(dtype) S + floor(dtype) + K u(float64) S (the oracle's own error)."""
    g = got.detach().to("cpu").double().numpy().reshape(-1) if hasattr(got, "detach") else np.asarray(got, float).reshape(-1)
    r = ref.detach().to("cpu").double().numpy().reshape(-1)
    s = scale.detach().to("cpu").double().numpy().reshape(-1)
    sel = np.ones(r.shape, dtype=bool) if mask is None or r.size != mask.size else mask.reshape(-1)
    if g.shape != r.shape:
        return OutputCheck(name, int(sel.sum()), int(sel.sum()), math.inf, None,
                           {"message": f"shape {tuple(got.shape)}, oracle {tuple(ref.shape)}"})
    K = tolerance.K[family]
    bound = K * float(tolerance.UNIT_ROUNDOFF[dtype]) * s + float(tolerance.FLOOR[dtype]) + K * U64 * s
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - r)
        err = np.where(np.isnan(g) | np.isinf(g), np.inf, err)
        ratio = np.where(sel, err / bound, 0.0)
    bad = np.flatnonzero(sel & ~(err <= bound))
    worst = int(np.argmax(ratio)) if ratio.size else 0
    out = OutputCheck(name, int(sel.sum()), int(bad.size), float(ratio[worst]) if ratio.size else 0.0,
                      unravel(worst, got))
    if bad.size:
        k = int(bad[0])
        out.first_failure = {"index": unravel(k, got), "got": float(g[k]), "oracle": float(r[k]),
                             "error": float(err[k]), "bound": float(bound[k])}
    return out


def classify_result(adapter, res, formula, params, arrays, seed) -> None:
    """The adapter's declarations applied to a check as ``pgspec run`` applies them to a case
    (runner.classify, spec/verdicts.md): the first rule whose IDs match the formula, whose dtypes
    hold the check's and whose conditions hold for its parameters and inputs turns a ``fail`` (or an
    ``error``, for a rule that expects one) into the rule's kind, a known bug or a convention, with
    the rule's reason and link; a check that passes records the rule it did not show."""
    from ..run.runner import classify, declarations_of

    decl = declarations_of(adapter)
    case_id = f"{formula}/check-{res.shape[0]}x{res.shape[1]}-seed{seed}-" + json.dumps(params, sort_keys=True)
    rules = [d for d in decl.rules if d.matches_id(case_id, formula) and (not d.dtypes or res.dtype in d.dtypes)]
    if not rules or res.outcome not in ("pass", "fail", "error"):
        return
    case = {"id": case_id, "formula": formula, "params": params, "category": "check"}
    if any(d.inputs for d in rules):
        # the predicates read the formula's inputs as a golden case's (nested lists), decoded already (a
        # check through a head has the head's arrays instead: hidden states and weights are no input)
        names = {i.name for i in REGISTRY[formula].inputs}
        case["$input_values"] = {k: np.asarray(v).tolist() for k, v in arrays.items() if k in names}
    found = decl.rules_for(case_id, formula, res.dtype, case)
    if found:
        classify(res, found)        # a CheckResult has what it sets: outcome, message, declaration


def check_one(adapter, res, formula, arrays, params, ref_out, ref_grads, scales, cotangent=None) -> None:
    """The adapter's call in ``res.dtype`` judged against the oracle's outputs, into ``res``; its gradient
    is the VJP with ``cotangent`` (None: ones), as the oracle's ``ref_grads`` are."""
    dtype, device = res.dtype, res.device
    try:
        tensors = to_tensors(formula, arrays, dtype, device)
    except Exception as e:  # noqa: BLE001 - the adapter's dtype or device cannot hold the inputs
        res.outcome, res.message = "error", f"{type(e).__name__}: {e}"
        return
    from ..run.untrusted import checked_call     # the adapter's result is untrusted data (issue 39)

    expected = {name: tuple(t.shape) for name, t in ref_out.items() if hasattr(t, "shape")}
    unconnected: list = []
    got = timed_adapter_call(res, device,
                             lambda: checked_call(adapter, formula, tensors, params, dtype, expected, unconnected,
                                                  cotangent))
    if got is None:
        return
    out, grads = got
    f = REGISTRY[formula]
    detached = [n for n in unconnected if n in ref_grads and bool(np.any(np.asarray(ref_grads[n]) != 0))]
    if detached:
        res.outcome = "error"
        res.message = (f"not connected: output {f.grad_of!r} has no autograd path to input(s) "
                       f"{', '.join(repr(n) for n in detached)}, whose oracle gradient is non-zero (a .detach(), "
                       f".item(), no_grad or a copy through numpy)")
        return
    mask = arrays.get("mask")
    for name in [o.name for o in f.outputs]:
        if f"{name}" not in scales or name not in out:
            continue
        res.outputs.append(_judge(name, out[name], ref_out[name], scales[name], None, f.family, dtype))
    for name, g in ref_grads.items():
        if name not in grads:
            res.outcome, res.message = "error", f"the adapter returned no gradient for {name!r}"
            return
        res.outputs.append(_judge(f"grad.{name}", grads[name], g, scales[f"grad.{name}"], mask, f.family, dtype))
    conclude(res)


def conclude(res) -> None:
    if any(o.failures for o in res.outputs):
        res.outcome = "fail"
        o = next(o for o in res.outputs if o.failures)
        res.message = f"{o.output}: {o.failures} of {o.compared} elements out of bound; {_first(o.first_failure)}"


def _first(f: dict | None) -> str:
    """The first element out of bound, to read: where, the adapter's value, the oracle's, the error
    against its bound (the JSON result has the same fields as numbers)."""
    if not f:
        return "no element compared"
    if "message" in f:
        return f["message"]
    where = "[" + ", ".join(map(str, f["index"])) + "]"
    ratio = f["error"] / f["bound"] if f["bound"] > 0 else math.inf
    return (f"first at {where}: got {f['got']!r}, oracle {f['oracle']!r}, error {f['error']:.3g} > bound "
            f"{f['bound']:.3g} ({ratio:.3g} x)")


# ------------------------------------------------------------------------------------------------
# Log-probs at production vocabulary size (check_logprob.py)
# ------------------------------------------------------------------------------------------------
class ChunkJudge:
    """An OutputCheck accumulated chunk by chunk (tensors on any device)."""

    def __init__(self, name, family, dtype, shape):
        self.out = OutputCheck(name, 0, 0, 0.0)
        self.K = tolerance.K[family]
        self.u = float(tolerance.UNIT_ROUNDOFF[dtype])
        self.floor = float(tolerance.FLOOR[dtype])
        self.shape = shape

    def add(self, offset, got, ref, scale, sel):
        import torch

        g = got.double().reshape(ref.shape)
        bound = self.K * self.u * scale + self.floor + self.K * U64 * scale
        err = (g - ref).abs()
        err = torch.where(torch.isfinite(g), err, torch.full_like(err, math.inf))
        sel = sel.reshape(ref.shape[:1] + (1,) * (ref.dim() - 1)).expand_as(ref)
        ratio = torch.where(sel, err / bound, torch.zeros_like(err))
        bad = sel & ~(err <= bound)
        self.out.compared += int(sel.sum())
        nbad = int(bad.sum())
        flat = ratio.reshape(-1)
        if flat.numel():
            k = int(torch.argmax(flat))
            if float(flat[k]) > self.out.worst_ratio or self.out.worst_index is None:
                self.out.worst_ratio = float(flat[k])
                self.out.worst_index = self._index(offset, k, ref.shape)
        if nbad and self.out.first_failure is None:
            k = int(torch.nonzero(bad.reshape(-1))[0])
            self.out.first_failure = {"index": self._index(offset, k, ref.shape), "got": float(g.reshape(-1)[k]),
                                      "oracle": float(ref.reshape(-1)[k]), "error": float(err.reshape(-1)[k]),
                                      "bound": float(bound.reshape(-1)[k])}
        self.out.failures += nbad

    def _index(self, offset, k, chunk_shape):
        inner = int(np.prod(chunk_shape[1:])) if len(chunk_shape) > 1 else 1
        pos, rest = offset + k // inner, k % inner
        idx = [pos // self.shape[1], pos % self.shape[1]]
        return idx + ([rest] if len(chunk_shape) > 1 else [])


def timed_adapter_call(res, device, work):
    """work()'s result, its wall time (the device synchronized) in res.adapter_seconds; None, with
    res an "unsupported" outcome when the adapter declines (properties.Unsupported), an "error" outcome when
    it raises anything else (its crash is an outcome, not a pgspec error)."""
    import torch

    from pgspec.adapters.base import Unsupported

    try:
        t = time.perf_counter()
        got = work()
        if device == "cuda":
            torch.cuda.synchronize()
        res.adapter_seconds = time.perf_counter() - t
        return got
    except Unsupported as e:      # the adapter declines these parameters (a head with no logit_scale, say)
        res.outcome, res.message = "unsupported", f"{res.adapter} does not support this: {e}"
        return None
    except BaseException as e:  # noqa: BLE001 - the adapter's crash (sys.exit() too) is an outcome
        if isinstance(e, KeyboardInterrupt):
            raise
        from ..run.outputs import MalformedOutput
        from ..run.untrusted import describe_exception

        what = str(e) if isinstance(e, MalformedOutput) else f"{res.adapter} raised {describe_exception(e)}"
        res.outcome, res.message = "error", what
        return None
