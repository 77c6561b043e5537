"""Run the golden corpus against an adapter and classify every (case, dtype).

Outcomes and the order in which a case is classified are normative (spec/verdicts.md): unsupported
(formula or dtype absent), not-applicable (outside a declared capability; never called), pass, fail,
error (the implementation raised), bug / convention (a failure, or an expected error, that a
declared rule explains), stale-deviation (a rule whose every matched case now passes).  A rule that
expects a mismatch never absorbs a crash.  A crash in one case never stops the run.
"""

from __future__ import annotations

import fnmatch
import json
import math
import sys
import traceback
import copy
from dataclasses import dataclass, field, fields

from mpmath import mpf

from pgspec.reference import REGISTRY

from ..judge import compare
from ..corpus import golden
from ..corpus.inputs import case_inputs  # noqa: F401 - re-exported (tests, benches)
from ..verdicts.classification import (BAD_OUTCOMES, OUTCOMES, VALIDATION_OUTCOMES, _failed_keys, classify,  # noqa: F401
                                       is_validation)
from .loading import (ADAPTER_ATTRIBUTES, BUILTIN_ADAPTERS, LOADED_AS, TORCH_MISSING, RunError,  # noqa: F401
                      _check_protocol, _current_folder_importable, _one_line, _torch_missing, load_adapter)
from .origin import ORIGIN_TEXT, exception_record
from .untrusted import CaseTimeout, missing_module_hint, require_differentiable, time_limit
from .outputs import (ACCEPTED_DTYPES, MalformedOutput, _short, check_grads, check_outputs,  # noqa: F401
                      float16_inexact)
from ..judge.compare import TORCH_DTYPES, to_tensors  # noqa: F401 - the call convention, re-exported

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
    failed_outputs: list | None = None  # the outputs ("loss", "grad.logprobs") with a failing element
    within: dict = field(default_factory=dict)  # a failing result: {dtype: its outputs outside that dtype's tolerance}
    also: list | None = None          # the other rules that explain a result with several root causes
    exception: dict | None = None     # a raised case: {"type", "message", "origin", "where"}

    def to_json(self):
        # as dataclasses.asdict gives it (a deep copy), without its generic walk: the fields are
        # flat except two small dicts of JSON values
        d = {name: getattr(self, name) for name in _CASE_RESULT_FIELDS}
        for k in ("first_failure", "declaration"):
            if d[k] is not None:
                d[k] = copy.deepcopy(d[k])
        for k in ("error", "bound", "error_ratio"):
            if d[k] is not None and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


_CASE_RESULT_FIELDS = tuple(f.name for f in fields(CaseResult))

def check_declarations(adapter) -> None:
    """The adapter's declarations against the whole corpus (spec/verdicts.md): a rule that matches no
    (case, dtype) and no property row is an error of the declarations file (RunError, exit 2)."""
    from ..verdicts.declarations import DeclarationError
    from .properties import PROPERTIES

    property_ids = [f"{pid}/{fid}" for pid, prop in PROPERTIES.items() for fid in prop.formulas]
    problems: list = []
    try:
        corpus = golden.load_all(problems=problems)
    except golden.GoldenError as e:
        raise RunError(f"golden corpus: {e}") from None
    if problems:  # a partial corpus cannot tell a dead rule; the run reports the corrupted files (exit 2)
        return
    try:
        try:
            implemented = set(adapter.capabilities())
        except Exception:  # noqa: BLE001 - the adapter's own fault, reported where capabilities are read
            implemented = None
        declarations_of(adapter).check_against_corpus(corpus, adapter.dtypes, property_ids, implemented=implemented)
    except DeclarationError as e:
        raise RunError(f"adapter {adapter.name!r}: declarations file error:\n{e}") from None


def select_cases(formulas: str = "*", problems: list | None = None) -> list[dict]:
    """The golden cases whose formula or case ID matches one of the comma-separated globs.

    With ``problems`` (a list), a corrupted golden file does not stop the selection: each is
    reported there once (file, case, field) and the intact families are selected."""
    if not isinstance(formulas, str):
        raise RunError(f"--formulas must be a string of comma-separated globs, got {formulas!r}")
    globs = [g.strip() for g in formulas.split(",") if g.strip()]
    if not globs:
        raise RunError(f"--formulas: no glob given (got {formulas!r}); e.g. --formulas 'kl.*'")
    try:
        cases = golden.load_all(problems=problems) if problems is not None else golden.load_all()
    except golden.GoldenError as e:
        raise RunError(f"golden corpus: {e}") from None
    chosen = [c for c in cases if any(fnmatch.fnmatchcase(c["formula"], g) or fnmatch.fnmatchcase(c["id"], g) for g in globs)]
    if not chosen and not (problems and any(fnmatch.fnmatchcase(fid, g.split("/")[0]) for fid in REGISTRY for g in globs)):
        from ..base.suggest import formula_globs_hint

        known = ", ".join(sorted(REGISTRY))
        raise RunError(f"no formula or case matches {formulas!r}; formula IDs: {known}{formula_globs_hint(globs, REGISTRY)}")
    # every glob must match: one that matches nothing beside one that does is a typo, not a smaller run
    # (a glob of a corrupted family's formulas matches no case only because its file is reported)
    dead = [g for g in globs
            if not any(fnmatch.fnmatchcase(c["formula"], g) or fnmatch.fnmatchcase(c["id"], g) for c in chosen)
            and not (problems and any(fnmatch.fnmatchcase(fid, g.split("/")[0]) for fid in REGISTRY))]
    if dead:
        from ..base.suggest import formula_globs_hint

        raise RunError(f"--formulas: {', '.join(repr(g) for g in dead)} matches no formula or case ID (the others "
                       f"do){formula_globs_hint(dead, REGISTRY)}")
    return chosen


# A run calls every case once per dtype: its inputs are built once, as numpy arrays (float64 reals,
# bool masks, int64 ids), and each dtype's tensors are made from copies of them.  Cached by the
# identity of the case dict (kept alive by the cache, so an id is never reused while cached).
_ARRAYS: dict = {}
_KIND_DTYPES = {"bool": "bool", "int": "int64"}   # an input's numpy dtype by its kind (reals: float64)
_ARRAYS_BUDGET = 64 * 2 ** 20     # elements held (about 0.5 GB at float64); beyond it, start afresh
_ARRAYS_HELD = [0]


def case_arrays(case: dict) -> dict:
    """The case's inputs as numpy arrays: the same values as ``case_inputs`` (an input no array can
    hold, a ragged row, stays as ``case_inputs`` gives it, so ``to_tensors`` fails as it would)."""
    import numpy as np

    hit = _ARRAYS.get(id(case))
    if hit is not None and hit[0] is case:
        return hit[1]
    raw = case["inputs"]
    f = REGISTRY[case["formula"]]
    out = {}
    if "$generate" in raw:
        out = _generated(raw["$generate"])
    else:
        # straight from the stored values (a real is stored as its decimal string, which numpy reads
        # as float() does: the same doubles as golden.case_inputs, bit for bit, tests/test_fast_paths.py)
        for name, value in raw.items():
            kind = f.input(name).kind
            try:
                out[name] = np.array(value, dtype=_KIND_DTYPES.get(kind, "float64"))
            except (TypeError, ValueError, OverflowError):
                out[name] = golden.case_inputs(case)[name]
    size = sum(getattr(a, "size", 0) for a in out.values())
    if _ARRAYS_HELD[0] + size > _ARRAYS_BUDGET:
        _ARRAYS.clear()
        _BASES.clear()
        _GENERATED.clear()
        _ARRAYS_HELD[0] = 0
    _ARRAYS[id(case)] = (case, out)
    _ARRAYS_HELD[0] += size
    return out


_COTANGENTS: dict = {}


def case_cotangent(case: dict):
    """The case's cotangent (spec/golden-format.md, "Cotangent") as a float64 CPU tensor shaped like its
    ``grad_of`` output, or None for a case without one; made once per case."""
    import numpy as np
    import torch

    hit = _COTANGENTS.get(id(case))
    if hit is not None and hit[0] is case:
        return hit[1]
    c = golden.case_cotangent(case)
    t = None if c is None else torch.from_numpy(np.array(c, dtype=np.float64))
    if len(_COTANGENTS) > 4096:
        _COTANGENTS.clear()
    _COTANGENTS[id(case)] = (case, t)
    return t


# Each dtype's tensors of a case are copies of CPU tensors over the case's arrays (``torch.from_numpy``:
# no copy), made once per case: one conversion per input and dtype instead of a numpy copy, a tensor
# and a conversion.  Held as long as the case's arrays are (``_ARRAYS``).
_BASES: dict = {}


def case_tensors(case: dict, dtype: str, device: str) -> dict:
    """``to_tensors(case["formula"], case_arrays(case), dtype, device)``: the same tensors (values,
    dtypes, shapes, which require grad), each a fresh copy that shares memory with nothing cached."""
    import torch

    hit = _BASES.get(id(case))
    if hit is None or hit[0] is not case:
        arrays = case_arrays(case)
        plan = _base_plan(case["formula"], arrays)
        if plan is None:        # an input no array holds: to_tensors fails on it as it always does
            return to_tensors(case["formula"], arrays, dtype, device)
        hit = _BASES[id(case)] = (case, plan)
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    dev = torch.device(device)      # parsed once: a device string is parsed again by every .to (about 3 us)
    tensors = {}
    for name, base, real, diff in hit[1]:
        if real:
            t = base.to(device=dev, dtype=tdtype, copy=True)
            if diff:
                t.requires_grad_(True)
        else:
            t = base.to(device=dev, copy=True)
        tensors[name] = t
    return tensors


def _base_plan(formula_id: str, arrays: dict):
    """[(name, CPU tensor over the array, real, differentiable)] for ``case_tensors``, or None when
    an input is not an array of its kind's numpy dtype (then ``to_tensors`` decides)."""
    import numpy as np
    import torch

    f = REGISTRY[formula_id]
    plan = []
    try:
        for name, value in arrays.items():
            kind = f.input(name).kind
            want = _KIND_DTYPES.get(kind, "float64")
            if not isinstance(value, np.ndarray) or value.dtype != np.dtype(want) or not value.flags.writeable:
                return None
            plan.append((name, torch.from_numpy(value), want == "float64", name in f.differentiable))
    except KeyError:        # an input the formula does not declare: to_tensors reports it
        return None
    return plan


# Scale cases share generator recipes (59 cases of the corpus, 35 recipes): each recipe's arrays are
# made once and shared by its cases (nothing writes to them: every tensor made from them is a copy).
_GENERATED: dict = {}


def _generated(spec: dict) -> dict:
    from ..corpus.generator import generate_arrays

    key = json.dumps(spec, sort_keys=True)
    hit = _GENERATED.get(key)
    if hit is None:
        hit = _GENERATED[key] = generate_arrays(spec)
    return dict(hit)


def adapter_params(formula_id: str, params: dict) -> dict:
    """Parameters as an adapter receives them: real values as Python floats (a decimal string such
    as "0.28" becomes the nearest binary64, which is what a framework's config holds)."""
    f = REGISTRY[formula_id]
    kinds = {p.name: p.kind for p in f.params}
    return {k: _real(v) if kinds.get(k) == "real" and isinstance(v, str) else v for k, v in params.items()}


def _real(v: str):
    """A decimal string as its binary64; any other string (an expected-error case's "abc") as it is,
    for the implementation to reject: pgspec never raises on the way to the call."""
    try:
        return float(v)
    except ValueError:
        return v


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
    """One case on one dtype: the adapter's outputs and gradients against the golden record, with
    the adapter's declarations applied (spec/verdicts.md)."""
    step = start_case(adapter, case, dtype, device)
    if isinstance(step, CaseResult):
        return step
    return step.finish(_compare_pending(step))


def run_cases(adapter, cases: list, dtype: str, device: str, on_error, advance=None) -> list:
    """``run_case`` over ``cases`` on one dtype, with the comparisons of all of them made at once at
    the end (``compare.compare_cases``); the same results, in the same order, as ``run_case`` case by
    case.  A case whose run raises becomes ``on_error(case, exception)`` and the others go on;
    ``advance()`` is called as each case's adapter work is done."""
    results: list = [None] * len(cases)
    pending = []
    capabilities, decl = adapter.capabilities(), declarations_of(adapter)
    for k, case in enumerate(cases):
        try:
            step = start_case(adapter, case, dtype, device, capabilities=capabilities, decl=decl)
        except BaseException as e:  # noqa: BLE001 - one case's crash never stops the run
            if isinstance(e, KeyboardInterrupt):
                raise
            step = on_error(case, e)
        if isinstance(step, CaseResult):
            results[k] = step
        else:
            pending.append((k, step))
            if len(pending) % _GATHER_EVERY == 0:
                _gather(pending[-_GATHER_EVERY:], on_error, cases, results)
        if advance is not None:
            advance()
    _gather(pending, on_error, cases, results)     # the rest (gather() does nothing a second time)
    pending = [(k, step) for k, step in pending if results[k] is None]
    batch = [(k, step) for k, step in pending if step.gathered is not _NOT_GATHERED]
    try:
        wholes = dict(zip((k for k, _ in batch),
                          compare.compare_cases([(step.gathered, step.present, step.family) for _, step in batch],
                                                dtype)))
    except Exception:  # noqa: BLE001 - then each case on its own, so that a crash lands on its case
        wholes = None
    for k, step in pending:
        try:
            results[k] = step.finish(wholes.get(k) if wholes is not None else _compare_pending(step))
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                raise
            results[k] = on_error(cases[k], e)
    return results


# Results are gathered (tensor to float64 numpy, at the compared positions) a few hundred cases at a
# time, not right after each call: in a row, with the adapter's work out of the caches' way, a
# gather costs about half as much; the tensors held meanwhile stay bounded.
_GATHER_EVERY = 256


def _gather(steps, on_error, cases, results) -> None:
    for k, step in steps:
        if results[k] is not None:
            continue        # its gathering crashed already: an error row
        try:
            step.gather()
        except BaseException as e:  # noqa: BLE001 - one case's crash never stops the run
            if isinstance(e, KeyboardInterrupt):
                raise
            results[k] = on_error(cases[k], e)


def _compare_pending(step):
    """One pending case's comparison on its own: what ``compare.compare_cases`` gives it in a batch
    (None: output by output, in ``finish``)."""
    step.gather()
    if step.gathered is _NOT_GATHERED:
        return None
    return compare.compare_cases([(step.gathered, step.present, step.family)], step.dtype)[0]


def start_case(adapter, case: dict, dtype: str, device: str, *, capabilities=None, decl=None):
    """``run_case`` up to the comparison: a finished CaseResult (not run, not applicable, an
    expected-error case, a crash), or the _Pending comparison of the case's outputs.
    ``capabilities`` and ``decl``: the adapter's, when the caller has them already (run_cases)."""
    f = REGISTRY[case["formula"]]
    result = CaseResult(adapter.name, adapter.version, device, dtype, case["id"], case["formula"], f.family,
                        case["category"], "pass")
    result.repro = repro_snippet(adapter.name, case["id"], dtype, device)
    if decl is None:
        decl = declarations_of(adapter)
    if case["formula"] not in (capabilities if capabilities is not None else adapter.capabilities()):
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
    for outcome, declared in (("unsupported", decl.unsupported_case(case)), ("not-applicable", decl.not_applicable(case))):
        if declared is not None:    # the adapter cannot reach the case, or the framework cannot express it
            result.outcome, result.message, result.declaration = outcome, declared.reason, declared.summary()
            return result
    if dtype == "float16" and not case.get("expect_error"):
        why = float16_inexact(case)
        if why:
            result.outcome = "not-applicable"
            result.message = why
            return result
    rule = decl.rules_for(case["id"], case["formula"], dtype, case)
    if case.get("expect_error"):
        # validation is its own axis: no rule applies to an expected-error case (spec/verdicts.md)
        return _expect_rejection(adapter, case, dtype, device, result)
    step = _call_case(adapter, case, dtype, device, result)
    if isinstance(step, CaseResult):
        return classify(step, rule)
    step.rule = rule
    return step


def _expect_rejection(adapter, case, dtype, device, result) -> CaseResult:
    """An expected-error case (spec/verdicts.md, "Validation"): ``rejected`` when the call raises from
    the framework's own code (or from an adapter check the declarations name, ``[[check]]``);
    ``not-rejected`` when it returns outputs, or raises anywhere else (the adapter's code, pgspec's).
    Everything pgspec prepares (the tensors, the parameters) is made before the call, outside it."""
    want = case["expect_error"]
    rule = f"{want['argument']}: {want['rule']}"
    try:
        tensors = case_tensors(case, dtype, device)
    except Exception as e:  # noqa: BLE001 - e.g. a ragged row: no tensor can hold it
        result.outcome = "not-applicable"
        result.message = (f"the case's inputs cannot be given as {dtype} tensors ({type(e).__name__}); its rule "
                          f"({rule}) concerns implementations that take nested lists")
        return result
    params = adapter_params(case["formula"], case["params"])
    try:
        with time_limit(adapter.name):      # an invalid input may hang a framework as well as any other
            out = adapter.call(case["formula"], tensors, params)
    except CaseTimeout as e:
        result.outcome = "error"
        result.message = str(e)
        return result
    except Exception as e:  # noqa: BLE001 - attributed below: only the framework's own rejection counts
        result.exception = exception_record(e, adapter)
        origin, where = result.exception["origin"], result.exception["where"]
        first = (result.exception["message"].strip().splitlines() or [""])[0]
        raised = f"{result.exception['type']}: {first}"
        check = declarations_of(adapter).check_for(case["id"], case["formula"], result.exception)
        if origin == "framework" or check is not None:
            result.outcome = "rejected"
            by = f"by the adapter's check ({check.label}: {check.reason})" if origin != "framework" else \
                f"by {adapter.name} at {where}"
            result.message = f"rejected, as the spec requires ({rule}), {by}: {raised}"[:500]
            if check is not None and origin != "framework":
                result.declaration = check.summary()
        else:
            result.outcome = "not-rejected"
            result.message = (f"not a rejection by {adapter.name}: raised in {ORIGIN_TEXT[origin]} at {where} "
                              f"({raised}); the spec rejects this input ({rule})")[:500]
        return result
    except BaseException as e:  # noqa: BLE001 - sys.exit() is a crash, not a rejection: the case's error
        if isinstance(e, KeyboardInterrupt):
            raise
        result.outcome = "error"
        result.exception = exception_record(e, adapter)
        result.message = traceback.format_exc(limit=8)
        return result
    result.outcome = "not-rejected"
    names = ", ".join(sorted(out)) if isinstance(out, dict) else type(out).__name__
    result.message = (f"accepted: the spec rejects this input ({rule}; the reference says: {want['message']}), but "
                      f"the adapter returned {'outputs (' + names + ')' if isinstance(out, dict) else names}")
    return result


def declarations_of(adapter):
    from ..verdicts.declarations import Declarations

    decl = getattr(adapter, "deviations", None)
    return decl if isinstance(decl, Declarations) else Declarations()


def _call_case(adapter, case, dtype, device, result):
    """The adapter's outputs and gradients for the case: a _Pending comparison, or ``result`` as an
    error when the call crashes or returns malformed outputs."""
    import torch

    f = REGISTRY[case["formula"]]
    try:
        tensors = case_tensors(case, dtype, device)
        cotangent = case_cotangent(case)
        with torch.enable_grad(), time_limit(adapter.name):
            out, read = compare.adapter_call(adapter, case["formula"], tensors,
                                             adapter_params(case["formula"], case["params"]), cotangent)
            check_outputs(f, case, dtype, tensors, out)
            grads = out.get("grad")
            diff = [n for n in f.differentiable if n in tensors]
            if grads is None and diff and out.get(f.grad_of) is not None:
                require_differentiable(f.grad_of, out[f.grad_of], diff)
                got = compare.autograd(out[f.grad_of], tensors, diff, cotangent)
                unconnected = [n for n, g in zip(diff, got) if g is None and _nonzero(case["grad"].get(n))]
                if unconnected:
                    raise MalformedOutput(
                        f"not connected: output {f.grad_of!r} has no autograd path to input(s) "
                        f"{', '.join(repr(n) for n in unconnected)} (torch.autograd.grad reports them unused), "
                        f"but the reference gradient with respect to them is non-zero: the output is detached "
                        f"from those inputs (a .detach(), .item(), no_grad or a copy through numpy)")
                grads = {n: (g if g is not None else torch.zeros_like(tensors[n])) for n, g in zip(diff, got)}
            check_grads(f, dtype, tensors, grads)
            if out.get("grad") is not None:     # the adapter's own gradients: the VJP with the cotangent
                try:
                    grads = compare.own_gradients(case["formula"], grads, cotangent, read, adapter.name)
                except compare.OwnGradientError as e:
                    raise MalformedOutput(str(e)) from None
    except (MalformedOutput, CaseTimeout) as e:
        result.outcome = "error"
        result.message = str(e)
        return result
    except BaseException as e:  # noqa: BLE001 - any crash of the implementation (SystemExit too) is an outcome
        if isinstance(e, KeyboardInterrupt):
            raise
        result.outcome = "error"
        result.exception = exception_record(e, adapter)
        # a module the adapter's framework needs and this interpreter lacks: the module and the install
        hint = missing_module_hint(e, sys.executable)
        result.message = hint or traceback.format_exc(limit=8)
        return result
    # The primary output (the one the spec differentiates, else the first) and the gradients are
    # required; other outputs are compared when the adapter produces them (a framework that only
    # returns the scalar loss is still checked on the loss and its gradient), and the result says
    # which were not produced.
    primary = f.grad_of or f.outputs[0].name
    checks = [(name, case["outputs"][name], out.get(name)) for name in case["outputs"]]
    checks += [(f"grad.{name}", case["grad"][name], (grads or {}).get(name)) for name in case["grad"]]
    missing = [key for key, _, got in checks if got is None and key != primary and not key.startswith("grad.")]
    present = [c for c in checks if c[0] not in missing]
    return _Pending(case, f.family, dtype, result, present, missing)


def _nonzero(ref) -> bool:
    """Whether a reference gradient (nested lists of decimal strings, None at masked positions) has
    a non-zero element: where it has none, an input the output does not depend on is correct."""
    if isinstance(ref, list):
        return any(_nonzero(x) for x in ref)
    if ref is None or isinstance(ref, bool):
        return False
    return mpf(ref) != 0


_NOT_GATHERED = object()


class _Pending:
    """A case whose adapter work is done and whose comparison is not: its outputs ``present`` as
    [(key, reference, result)], and (fast mode, every present output returned) after ``gather()``
    those results gathered for ``compare.compare_cases``, when the result tensors are let go."""

    def __init__(self, case, family, dtype, result, present, missing):
        self.case, self.family, self.dtype, self.result = case, family, dtype, result
        self.present, self.missing, self.rule = present, missing, None
        self.gathered = _NOT_GATHERED
        # every output at once (the same worst element and first failure as the loop in finish(),
        # in one vectorized pass); the loop when an output is absent or laid out unlike its reference
        self._gatherable = compare.mode() == "fast" and all(got is not None for _, _, got in present)

    def gather(self) -> None:
        if self._gatherable and self.gathered is _NOT_GATHERED:
            self.gathered = compare.gather_case(self.case, self.present)
            if self.gathered is not None:
                # the comparison needs only the output names now: the result tensors are let go
                self.present = [(key, ref, None) for key, ref, _ in self.present]

    def finish(self, whole) -> CaseResult:
        """The CaseResult, from ``whole`` (the comparison of every output at once, or None: then
        output by output), with the declarations applied."""
        result = self._compare(whole)
        if result.outcome == "fail" and self.rule:
            for dtype in {r.within for r in self.rule if getattr(r, "within", None)}:
                result.within[dtype] = self._passes_within(dtype)
        return classify(result, self.rule)

    def _passes_within(self, dtype: str) -> list:
        """The compared outputs that are outside the tolerance bound of ``dtype`` (a rule's ``within``:
        a float64 run of a framework that computes in float32 judged as float32)."""
        keys = [key for key, _, _ in self.present]
        if self.gathered is not _NOT_GATHERED and self.gathered is not None:
            joined, g = self.gathered
            out = compare.compare_prepared(g, joined, self.family, dtype)
            st = joined.starts
            return [keys[j] for j in range(len(keys)) if not out.passed[st[j]:st[j + 1]].all()]
        return [key for key, ref, got in self.present
                if got is None or compare.compare_output(self.case, key, ref, got, self.family, dtype).failure is not None]

    def _compare(self, whole) -> CaseResult:
        case, result, dtype, family = self.case, self.result, self.dtype, self.family
        present = self.present
        worst = -1.0
        compared = 0
        failed: list = []
        if whole is not None:
            failed = _failed_keys(whole, self.gathered, present)
            compared = whole.compared
            if whole.worst is not None:
                cmp = whole.worst
                result.error, result.bound, result.error_ratio = cmp.error, cmp.bound, cmp.ratio
            if whole.failure is not None:
                cmp = whole.failure
                key, path = whole.failure_path
                result.first_failure = {"output": key, "index": list(path), "got": repr(whole.failure_got),
                                        "ref": whole.failure_ref, "error": cmp.error, "bound": cmp.bound,
                                        "note": cmp.note}
            present = []
        for key, ref, got in present:
            if got is None:
                result.outcome = "error"
                result.message = f"the adapter returned no {key!r}"
                return result
            # every element against the tolerance model (conformance/judge/compare.py: vectorized, with
            # the exact comparison where float64 rounding could flip an outcome); the same result
            # as ``tolerance.compare`` over ``_elements`` one by one, worst ratio and first failure
            res = compare.compare_output(case, key, ref, got, family, dtype)
            compared += res.compared
            if res.worst is not None and res.worst.ratio > worst:
                cmp = res.worst
                worst = cmp.ratio
                result.error, result.bound, result.error_ratio = cmp.error, cmp.bound, cmp.ratio
            if res.failure is not None:
                failed.append(key)
            if res.failure is not None and result.first_failure is None:
                cmp = res.failure
                result.first_failure = {"output": key, "index": list(res.failure_path), "got": repr(res.failure_got),
                                        "ref": res.failure_ref, "error": cmp.error, "bound": cmp.bound,
                                        "note": cmp.note}
        result.compared = compared
        if self.missing:
            result.message = f"outputs not produced by the adapter (not compared): {', '.join(self.missing)}"
        if result.first_failure is not None:
            result.outcome = "fail"
            result.failed_outputs = failed
            ff = result.first_failure
            result.message = (f"{ff['output']}{ff['index']}: got {ff['got']}, reference {ff['ref']}, "
                              f"error {ff['error']:.3g} > bound {ff['bound']:.3g}")
        return result


def repro_snippet(adapter: str, case_id: str, dtype: str, device: str) -> str:
    """Python that reruns one case as the user ran it: the adapter is loaded by the same built-in
    name or ``module:object`` spec (run it from the folder you ran pgspec in); the case's inputs and
    parameters are built as the runner gives them, for a call of the implementation under a debugger."""
    spec = LOADED_AS.get(adapter, adapter)
    return (
        "from pgspec.conformance.run.runner import adapter_params, case_tensors, load_adapter, load_case, run_case\n"
        f"adapter = load_adapter({spec!r})\n"
        f"case = load_case({case_id!r})\n"
        f"inputs = case_tensors(case, {dtype!r}, {device!r})  # the tensors the adapter receives\n"
        "params = adapter_params(case['formula'], case['params'])  # the parameters, as floats and choices\n"
        "out = adapter.call(case['formula'], inputs, params)  # the implementation itself (set a breakpoint)\n"
        "# its gradient is judged as the VJP with case['cotangent'] (runner.case_cotangent(case))\n"
        f"print(run_case(adapter, case, {dtype!r}, {device!r}))  # the verdict, with the first bad element\n"
    )


def rerun_command(adapter: str, case_id: str, dtype: str, device: str) -> str:
    """The command line that reruns one case (a property row: its formula's property checks)."""
    import shlex

    spec = LOADED_AS.get(adapter, adapter)
    target = case_id.split("/", 1)[1] if case_id.startswith("prop.") else case_id
    parts = ["pgspec", "run", "--adapter", spec, "--formulas", target, "--dtype", dtype]
    if device != "cpu":
        parts += ["--device", device]
    if not case_id.startswith("prop."):
        parts.append("--no-properties")
    return " ".join(shlex.quote(p) for p in parts)


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
                       message=p.get("message", ""), repro=p.get("repro", ""), exception=p.get("exception"))
        if p["outcome"] == "fail" and p.get("example") is not None:
            r.first_failure = {"example": p["example"]}
        if p["outcome"] == "not-applicable":     # every example outside the adapter's capabilities
            r.declaration = p.get("declaration")
            out.append(r)
            continue
        out.append(classify(r, declarations_of(adapter).rules_for(r.case_id, p["property"], dtype, None)))
    return out


@dataclass
class RunSummary:
    results: list = field(default_factory=list)

    def finalize(self) -> "RunSummary":
        """Mark stale rules: a rule that matched results in this run, all of which pass, is stale;
        its passing cases become ``stale-deviation`` (spec/verdicts.md)."""
        by_rule: dict = {}
        for r in self.results:
            for d in [r.declaration, *(r.also or [])]:
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

    def validation(self) -> tuple[int, int]:
        """(rejected, run): the expected-error cases the implementation was called on, and how many
        of them its framework rejected (spec/verdicts.md, "Validation")."""
        rejected = sum(1 for r in self.results if r.outcome == "rejected")
        return rejected, rejected + sum(1 for r in self.results if r.outcome == "not-rejected")

    def numeric_counts(self) -> dict:
        """{outcome: n} over the numeric results (golden cases and property rows; an expected-error
        case counts here only when it crashed), the counts the run's table adds up to."""
        count = dict.fromkeys(OUTCOMES, 0)
        for r in self.results:
            if not is_validation(r):
                count[r.outcome] += 1
        return count

    def summary_line(self, name: str) -> str:
        """NAME: the unexpected outcomes first, then the numeric results (cases and property rows), then
        validation, then every result of the run, which the counts before it add up to (and `pgspec run`'s
        progress bar counts): 'trl: 2 fail; numeric: 1190 of 1398 applicable results pass, 12 known bugs
        (3 root causes), 90 conventions, 81 not applicable; validation: rejects 20 of 642 invalid inputs;
        2121 results in all'."""
        count = self.numeric_counts()
        bug_causes = {(r.declaration["source"], r.declaration["declaration"]) for r in self.results
                      if r.outcome == "bug" and r.declaration}
        bad = [f"{count[k]} {k}" for k in BAD_OUTCOMES if count[k]]
        applicable = sum(v for k, v in count.items() if k not in ("not-applicable", "unsupported"))
        parts = [
            f"{count['pass']} of {applicable} applicable results pass",
            f"{_n(count['bug'], 'known bug')} ({_n(len(bug_causes), 'root cause')})",
            _n(count["convention"], "convention"),
            f"{count['not-applicable']} not applicable",
        ]
        if count["unsupported"]:
            parts.append(f"{count['unsupported']} unsupported")
        rejected, run = self.validation()
        # the expected-error cases that did not run: outside a capability or a dtype, or of a formula the
        # adapter lacks (every result is counted once somewhere in the line: they add up to its total)
        idle = [f"{k} {word}" for word in ("not applicable", "unsupported")
                if (k := sum(1 for r in self.results if is_validation(r) and r.outcome == word.replace(" ", "-")))]
        head = "; ".join(bad) if bad else "no unexpected result"
        return (f"{name}: {head}; numeric: {', '.join(parts)}; validation: rejects {rejected} of {run} invalid inputs"
                + (f" ({', '.join(idle)})" if idle else "") + f"; {len(self.results)} results in all")


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"
