"""Run the golden corpus against an adapter and classify every (case, dtype).

Outcomes: pass, fail, error (the adapter raised), unsupported (formula not in its capabilities,
or dtype not supported), deviation (fails, and a deviation is declared), stale-deviation (a
deviation is declared but the case now passes).  A crash in one case never stops the run.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import math
import traceback
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from pgspec.reference import REGISTRY

from . import compare, golden
from .compare import TORCH_DTYPES, to_tensors  # noqa: F401 - the call convention, re-exported
from .compare import objective as _objective

OUTCOMES = ("pass", "fail", "error", "unsupported", "deviation", "stale-deviation")
BAD_OUTCOMES = ("fail", "error", "stale-deviation")

BUILTIN_ADAPTERS = {
    "torch": "pgspec.adapters.torch:make_adapter",
    "trl": "pgspec.adapters.trl:make_adapter",
    "liger": "pgspec.adapters.liger:make_adapter",
    "verl": "pgspec.adapters.verl:make_adapter",
    "openrlhf": "pgspec.adapters.openrlhf:make_adapter",
    "skyrl": "pgspec.adapters.skyrl:make_adapter",
    "areal": "pgspec.adapters.areal:make_adapter",
}


class RunError(Exception):
    """A usage error of the runner (unknown adapter, bad glob, unavailable device): exit code 2."""


@dataclass
class CaseResult:
    adapter: str
    version: str
    device: str
    dtype: str
    case_id: str
    formula: str
    family: str
    category: str
    outcome: str
    error: float | None = None        # the worst element's |got - ref|
    bound: float | None = None        # that element's bound
    error_ratio: float | None = None  # the worst error / bound over all compared elements
    compared: int = 0
    first_failure: dict | None = None
    message: str = ""
    deviation: dict | None = None
    repro: str = ""

    def to_json(self):
        d = asdict(self)
        for k in ("error", "bound", "error_ratio"):
            if d[k] is not None and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


def load_adapter(spec: str):
    """An adapter by built-in name, or ``module:object`` (an Adapter, or a factory returning one)."""
    target = BUILTIN_ADAPTERS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_ADAPTERS))
        raise RunError(f"unknown adapter {spec!r}; built-in adapters: {known}; or give module:object")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RunError(f"adapter {spec!r}: cannot import {module_name!r}: {e}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise RunError(f"adapter {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    adapter = obj() if callable(obj) and not hasattr(obj, "implementations") else obj
    if not hasattr(adapter, "implementations"):
        raise RunError(f"adapter {spec!r}: {target} is not an adapter")
    return adapter


def select_cases(formulas: str = "*") -> list[dict]:
    globs = [g.strip() for g in formulas.split(",") if g.strip()]
    cases = golden.load_all()
    chosen = [c for c in cases if any(fnmatch.fnmatchcase(c["formula"], g) or fnmatch.fnmatchcase(c["id"], g) for g in globs)]
    if not chosen:
        known = ", ".join(sorted(REGISTRY))
        raise RunError(f"no formula or case matches {formulas!r}; formula IDs: {known}")
    return chosen


@lru_cache(maxsize=64)
def _inputs_cached(key: str):
    return golden.case_inputs(json.loads(key))


def case_inputs(case: dict) -> dict:
    return _inputs_cached(json.dumps({"formula": case["formula"], "inputs": case["inputs"]}, sort_keys=True))


def adapter_params(formula_id: str, params: dict) -> dict:
    """Parameters as an adapter receives them: real values as Python floats (a decimal string such
    as "0.28" becomes the nearest binary64, which is what a framework's config holds)."""
    f = REGISTRY[formula_id]
    kinds = {p.name: p.kind for p in f.params}
    return {k: float(v) if kinds.get(k) == "real" and isinstance(v, str) else v for k, v in params.items()}


def _flat_with_paths(x, path=()):
    if isinstance(x, list):
        for k, item in enumerate(x):
            yield from _flat_with_paths(item, path + (k,))
    else:
        yield path, x


def _elements(case, key, ref, got_tensor):
    """(path, got, ref, scale) for every compared element of one output or gradient."""
    got = got_tensor.detach().to("cpu").double() if hasattr(got_tensor, "detach") else got_tensor
    scale = case["scale"].get(key)
    positions = case.get("positions")
    is_token = positions is not None and isinstance(ref, list) and len(ref) == len(positions) and got.dim() >= 2
    if is_token:
        for k, (b, t) in enumerate(positions):
            if ref[k] is not None:
                yield (b, t), got[b, t].item(), ref[k], scale[k] if scale is not None else None
        return
    flat_scale = dict(_flat_with_paths(scale)) if scale is not None else {}
    for path, r in _flat_with_paths(ref):
        if r is None:
            continue
        value = got[path].item() if path else got.item()
        yield path, value, r, flat_scale.get(path)


def run_case(adapter, case: dict, dtype: str, device: str) -> CaseResult:
    import torch

    f = REGISTRY[case["formula"]]
    result = CaseResult(adapter.name, adapter.version, device, dtype, case["id"], case["formula"], f.family,
                        case["category"], "pass")
    result.repro = repro_snippet(adapter.name, case["id"], dtype, device)
    deviation = adapter.deviation_for(case["id"], case["formula"], dtype)
    if case["formula"] not in adapter.capabilities():
        result.outcome = "unsupported"
        result.message = f"{adapter.name} does not implement {case['formula']}"
        return result
    if dtype not in adapter.dtypes:
        result.outcome = "unsupported"
        result.message = f"{adapter.name} does not support {dtype}"
        return result
    try:
        tensors = to_tensors(case["formula"], case_inputs(case), dtype, device)
        with torch.enable_grad():
            out = adapter.call(case["formula"], tensors, adapter_params(case["formula"], case["params"]))
            grads = out.get("grad")
            diff = [n for n in f.differentiable if n in tensors]
            if grads is None and diff and f.grad_of in out:
                objective = _objective(out[f.grad_of], tensors.get("mask"))
                got = torch.autograd.grad(objective, [tensors[n] for n in diff], allow_unused=True)
                grads = {n: (g if g is not None else torch.zeros_like(tensors[n])) for n, g in zip(diff, got)}
    except Exception:  # noqa: BLE001 - any crash of the implementation becomes an outcome
        result.outcome = "error"
        result.message = traceback.format_exc(limit=8)
        return _apply_deviation(result, deviation)
    worst = -1.0
    compared = 0
    # The primary output (the one the spec differentiates, else the first) and the gradients are
    # required; other outputs are compared when the adapter produces them (a framework that only
    # returns the scalar loss is still checked on the loss and its gradient), and the result says
    # which were not produced.
    primary = f.grad_of or f.outputs[0].name
    checks = [(name, case["outputs"][name], out.get(name)) for name in case["outputs"]]
    checks += [(f"grad.{name}", case["grad"][name], (grads or {}).get(name)) for name in case["grad"]]
    missing = [key for key, _, got in checks if got is None and key != primary and not key.startswith("grad.")]
    for key, ref, got in checks:
        if got is None and key in missing:
            continue
        if got is None:
            result.outcome = "error"
            result.message = f"the adapter returned no {key!r}"
            return _apply_deviation(result, deviation)
        # every element against the tolerance model (conformance/compare.py: vectorized, with the
        # exact comparison where float64 rounding could flip an outcome); the same result as
        # ``tolerance.compare`` over ``_elements`` one by one, worst ratio and first failure included
        res = compare.compare_output(case, key, ref, got, f.family, dtype)
        compared += res.compared
        if res.worst is not None and res.worst.ratio > worst:
            cmp = res.worst
            worst = cmp.ratio
            result.error, result.bound, result.error_ratio = cmp.error, cmp.bound, cmp.ratio
        if res.failure is not None and result.first_failure is None:
            cmp = res.failure
            result.first_failure = {"output": key, "index": list(res.failure_path), "got": repr(res.failure_got),
                                    "ref": res.failure_ref, "error": cmp.error, "bound": cmp.bound, "note": cmp.note}
    result.compared = compared
    if missing:
        result.message = f"outputs not produced by the adapter (not compared): {', '.join(missing)}"
    if result.first_failure is not None:
        result.outcome = "fail"
        ff = result.first_failure
        result.message = (f"{ff['output']}{ff['index']}: got {ff['got']}, reference {ff['ref']}, "
                          f"error {ff['error']:.3g} > bound {ff['bound']:.3g}")
    return _apply_deviation(result, deviation)


def _apply_deviation(result: CaseResult, deviation) -> CaseResult:
    if deviation is None:
        return result
    result.deviation = {"id": deviation.id, "kind": deviation.kind, "reason": deviation.reason, "link": deviation.link}
    if result.outcome in ("fail", "error"):
        result.outcome = "deviation"
    elif result.outcome == "pass":
        result.outcome = "stale-deviation"
        result.message = f"declared deviation {deviation.id!r} ({deviation.kind}) no longer reproduces: the case passes"
    return result


def repro_snippet(adapter: str, case_id: str, dtype: str, device: str) -> str:
    return (
        "from pgspec.conformance.runner import load_adapter, load_case, run_case\n"
        f"adapter = load_adapter({adapter!r})\n"
        f"case = load_case({case_id!r})\n"
        f"print(run_case(adapter, case, {dtype!r}, {device!r}))\n"
    )


def load_case(case_id: str) -> dict:
    for c in golden.load_all():
        if c["id"] == case_id:
            return c
    raise RunError(f"no golden case {case_id!r}")


def property_results(adapter, dtype: str, device: str, formulas: str, adapter_spec: str | None = None) -> list:
    """The property checks (spec/properties.md) for one dtype, as CaseResult rows whose family is
    the property ID (they appear as their own rows in the matrix).  A deviation may be declared
    for "<property>/<formula>" or for the property ID."""
    from . import properties

    if hasattr(adapter, "run_properties"):  # an isolated adapter runs them in its worker
        raw = adapter.run_properties(dtype, device, formulas)
    else:
        raw = [p.to_json() for p in properties.run_properties(adapter, dtype, device, formulas, adapter_spec=adapter_spec)]
    out = []
    for p in raw:
        ratio = p.get("error_ratio")
        ratio = float(ratio) if isinstance(ratio, str) else ratio
        r = CaseResult(adapter.name, adapter.version, device, dtype, f"{p['property']}/{p['formula']}", p["formula"],
                       p["property"], "property", p["outcome"], error_ratio=ratio, compared=p.get("examples", 0),
                       message=p.get("message", ""), repro=p.get("repro", ""))
        if p["outcome"] == "fail" and p.get("example") is not None:
            r.first_failure = {"example": p["example"]}
        out.append(_apply_deviation(r, adapter.deviation_for(r.case_id, p["property"], dtype)))
    return out


@dataclass
class RunSummary:
    results: list = field(default_factory=list)

    def exit_code(self) -> int:
        return 1 if any(r.outcome in BAD_OUTCOMES for r in self.results) else 0
