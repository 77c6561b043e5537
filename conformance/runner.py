"""Run the golden corpus against an adapter and classify every (case, dtype).

Outcomes and the order in which a case is classified are normative (spec/verdicts.md): unsupported
(formula or dtype absent), not-applicable (outside a declared capability; never called), pass, fail,
error (the implementation raised), bug / convention (a failure, or an expected error, that a
declared rule explains), stale-deviation (a rule whose every matched case now passes).  A rule that
expects a mismatch never absorbs a crash.  A crash in one case never stops the run.
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

from . import golden, tolerance

OUTCOMES = ("pass", "fail", "error", "bug", "convention", "not-applicable", "unsupported", "stale-deviation")
BAD_OUTCOMES = ("fail", "error", "stale-deviation")

BUILTIN_ADAPTERS = {
    "torch": "pgspec.adapters.torch:make_adapter",
    "trl": "pgspec.adapters.trl:make_adapter",
    "liger": "pgspec.adapters.liger:make_adapter",
    "verl": "pgspec.adapters.verl:make_adapter",
    "openrlhf": "pgspec.adapters.openrlhf:make_adapter",
    "skyrl": "pgspec.adapters.skyrl:make_adapter",
    "areal": "pgspec.adapters.areal:make_adapter",
    "nemo_rl": "pgspec.adapters.nemo_rl:make_adapter",
    "slime": "pgspec.adapters.slime:make_adapter",
    "megatron": "pgspec.adapters.megatron:make_adapter",
    "fast_llm": "pgspec.adapters.fast_llm:make_adapter",
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
    declaration: dict | None = None   # the declaration that classified (or matched) this result
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


def check_declarations(adapter) -> None:
    """The adapter's declarations against the whole corpus (spec/verdicts.md): a rule that matches no
    (case, dtype) and no property row is an error of the declarations file (RunError, exit 2)."""
    from .declarations import DeclarationError
    from .properties import PROPERTIES

    property_ids = [f"{pid}/{fid}" for pid, prop in PROPERTIES.items() for fid in prop.formulas]
    try:
        declarations_of(adapter).check_against_corpus(golden.load_all(), adapter.dtypes, property_ids)
    except DeclarationError as e:
        raise RunError(f"adapter {adapter.name!r}: declarations file error:\n{e}") from None


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


TORCH_DTYPES = {"float64": "float64", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def to_tensors(formula_id: str, inputs: dict, dtype: str, device: str):
    import torch

    f = REGISTRY[formula_id]
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    tensors = {}
    for name, value in inputs.items():
        kind = f.input(name).kind
        if kind == "bool":
            t = torch.tensor(value, dtype=torch.bool, device=device)
        elif kind == "int":
            t = torch.tensor(value, dtype=torch.long, device=device)
        else:
            # golden inputs are bfloat16-exact: float64 -> dtype is exact
            t = torch.tensor(value, dtype=torch.float64, device=device).to(tdtype)
            if name in f.differentiable:
                t.requires_grad_(True)
        tensors[name] = t
    return tensors


def adapter_params(formula_id: str, params: dict) -> dict:
    """Parameters as an adapter receives them: real values as Python floats (a decimal string such
    as "0.28" becomes the nearest binary64, which is what a framework's config holds)."""
    f = REGISTRY[formula_id]
    kinds = {p.name: p.kind for p in f.params}
    return {k: float(v) if kinds.get(k) == "real" and isinstance(v, str) else v for k, v in params.items()}


def _objective(out, mask):
    """Sum of the unmasked elements of the grad_of output (masked ones selected away, never x 0)."""
    import torch

    if mask is not None and out.dim() >= 2 and tuple(out.shape[:2]) == tuple(mask.shape):
        m = mask.reshape(mask.shape + (1,) * (out.dim() - 2))
        out = torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.sum()


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
    f = REGISTRY[case["formula"]]
    result = CaseResult(adapter.name, adapter.version, device, dtype, case["id"], case["formula"], f.family,
                        case["category"], "pass")
    result.repro = repro_snippet(adapter.name, case["id"], dtype, device)
    decl = declarations_of(adapter)
    if case["formula"] not in adapter.capabilities():
        result.outcome = "unsupported"
        why = decl.unsupported_for(case["formula"])
        result.message = why.reason if why else f"{adapter.name} does not implement {case['formula']}"
        if why:
            result.declaration = why.summary()
        return result
    if dtype not in adapter.dtypes:
        result.outcome = "unsupported"
        result.message = f"{adapter.name} does not support {dtype}"
        return result
    outside = decl.not_applicable(case)
    if outside is not None:
        result.outcome = "not-applicable"
        result.message = outside.reason
        result.declaration = outside.summary()
        return result
    rule = decl.rule_for(case["id"], case["formula"], dtype, case)
    if case.get("expect_error"):
        return classify(_expect_rejection(adapter, case, dtype, device, result), rule)
    return classify(_compare_case(adapter, case, dtype, device, result), rule)


def _expect_rejection(adapter, case, dtype, device, result) -> CaseResult:
    """An expected-error case (spec/golden-format.md): the adapter passes by raising (any exception);
    returning outputs is a ``fail`` that quotes the rule the input breaks."""
    want = case["expect_error"]
    rule = f"{want['argument']}: {want['rule']}"
    try:
        tensors = to_tensors(case["formula"], case_inputs(case), dtype, device)
    except Exception as e:  # noqa: BLE001 - e.g. a ragged row: no tensor can hold it
        result.outcome = "not-applicable"
        result.message = (f"the case's inputs cannot be given as {dtype} tensors ({type(e).__name__}); its rule "
                          f"({rule}) concerns implementations that take nested lists")
        return result
    try:
        out = adapter.call(case["formula"], tensors, adapter_params(case["formula"], case["params"]))
    except Exception as e:  # noqa: BLE001 - any rejection counts
        first = (str(e).strip().splitlines() or [""])[0]
        result.outcome = "pass"
        result.message = f"rejected, as the spec requires ({rule}): {type(e).__name__}: {first}"[:500]
        return result
    result.outcome = "fail"
    names = ", ".join(sorted(out)) if isinstance(out, dict) else type(out).__name__
    result.message = (f"the spec rejects this input ({rule}; the reference says: {want['message']}), but the "
                      f"adapter returned outputs ({names})")
    return result


def declarations_of(adapter):
    from .declarations import Declarations

    decl = getattr(adapter, "deviations", None)
    return decl if isinstance(decl, Declarations) else Declarations()


def _compare_case(adapter, case, dtype, device, result) -> CaseResult:
    import torch

    f = REGISTRY[case["formula"]]
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
        return result
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
            return result
        for path, value, r, s in _elements(case, key, ref, got):
            cmp = tolerance.compare(value, r, s, f.family, dtype)
            compared += 1
            if cmp.ratio > worst:
                worst = cmp.ratio
                result.error, result.bound, result.error_ratio = cmp.error, cmp.bound, cmp.ratio
            if not cmp.passed and result.first_failure is None:
                result.first_failure = {"output": key, "index": list(path), "got": repr(value), "ref": r,
                                        "error": cmp.error, "bound": cmp.bound, "note": cmp.note}
    result.compared = compared
    if missing:
        result.message = f"outputs not produced by the adapter (not compared): {', '.join(missing)}"
    if result.first_failure is not None:
        result.outcome = "fail"
        ff = result.first_failure
        result.message = (f"{ff['output']}{ff['index']}: got {ff['got']}, reference {ff['ref']}, "
                          f"error {ff['error']:.3g} > bound {ff['bound']:.3g}")
    return result


def classify(result: CaseResult, rule) -> CaseResult:
    """Apply the matching rule (spec/verdicts.md, step 5): a ``fail`` that a ``mismatch`` rule
    declares, or an ``error`` that an ``error`` rule declares, takes the rule's kind; anything else
    keeps its outcome (a passing case records the rule, for the stale check at the end of a run)."""
    if rule is None or result.outcome in ("unsupported", "not-applicable"):
        return result   # nothing ran: the rule neither explains it nor goes stale by it
    result.declaration = rule.summary()
    expected = {"mismatch": "fail", "error": "error"}[rule.expect]
    if result.outcome == expected:
        result.outcome = rule.kind
    elif result.outcome in ("fail", "error"):
        result.message = (f"{rule.label} of {rule.source} matches this case but expects "
                          f"{'a mismatch' if rule.expect == 'mismatch' else 'an error'}, and the case "
                          f"{'raised' if result.outcome == 'error' else 'returned numbers that fail'}; "
                          f"it stays {result.outcome}:\n{result.message}")
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
        out.append(classify(r, declarations_of(adapter).rule_for(r.case_id, p["property"], dtype, None)))
    return out


@dataclass
class RunSummary:
    results: list = field(default_factory=list)

    def finalize(self) -> "RunSummary":
        """Mark stale rules: a rule that matched results in this run, all of which pass, is stale;
        its passing cases become ``stale-deviation`` (spec/verdicts.md)."""
        by_rule: dict = {}
        for r in self.results:
            d = r.declaration
            if d and d["declaration"].startswith("rule "):
                by_rule.setdefault((d["source"], d["declaration"]), []).append(r)
        for (source, label), rs in by_rule.items():
            if all(r.outcome == "pass" for r in rs):
                for r in rs:
                    r.outcome = "stale-deviation"
                    r.message = (f"{label} of {source} ({rs[0].declaration['kind']}) matched {len(rs)} result(s) "
                                 "in this run and all of them pass: the declared deviation no longer reproduces")
        return self

    def exit_code(self) -> int:
        return 1 if any(r.outcome in BAD_OUTCOMES for r in self.results) else 0

    def applicable(self) -> list:
        return [r for r in self.results if r.outcome not in ("not-applicable", "unsupported")]

    def summary_line(self, name: str) -> str:
        """NAME: P of A applicable cases pass; B known bugs (R root causes); C conventions; N not applicable"""
        count = {k: sum(1 for r in self.results if r.outcome == k) for k in OUTCOMES}
        bug_causes = {(r.declaration["source"], r.declaration["declaration"]) for r in self.results
                      if r.outcome == "bug" and r.declaration}
        line = (f"{name}: {count['pass']} of {len(self.applicable())} applicable cases pass; "
                f"{count['bug']} known bugs ({len(bug_causes)} root causes); {count['convention']} conventions; "
                f"{count['not-applicable']} not applicable")
        extra = [f"{count[k]} {k}" for k in ("fail", "error", "stale-deviation", "unsupported") if count[k]]
        return line + ("; " + "; ".join(extra) if extra else "")
