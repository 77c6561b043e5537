"""The search: hypothesis drives ``examples.draw`` per (formula, dtype), judges each example
(``judge.fast``), confirms a disagreement (``judge.confirm``) and shrinks a confirmed one.

Each (formula, dtype) is searched in rounds of ``ROUND`` examples (hypothesis ``max_examples``),
seeded ``seed + round``, until its time budget or its ``examples`` cap is spent or a round finds a
counterexample.  The test hypothesis runs raises only for a *new* counterexample (the runner's
``fail`` or ``error`` on the example made a golden record), one exception class per kind of failure
(its outcome and failing outputs), so hypothesis shrinks each kind on its own and replays the
smallest example of each last: that example is what is reported.  A disagreement a declaration
explains (``bug``, ``convention``) is counted under its rule and not shrunk; one the runner passes
was the float64 oracle's (counted as ``unconfirmed``).  Hypothesis' example database
(``<pgspec cache>/fuzz/<adapter>``) keeps every failing example, so a rerun replays earlier
counterexamples first.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field

from pgspec.reference import REGISTRY

from . import examples as ex
from . import judge

ROUND = 25              # examples per hypothesis run
BAD_INPUT = 6           # one example in BAD_INPUT is made invalid on purpose (examples.broken)
NOT_REJECTED_KEPT = 3
SHRINK_SECONDS = 60.0   # at most this long (and at least 15 s) shrinking one formula's counterexamples, beyond its budget
VERSION = "pgspec-fuzz/2"   # part of the database key: a new drawing scheme starts a new database


@dataclass
class Finding:
    """One new counterexample, shrunk."""

    formula: str
    dtype: str
    outcome: str                      # fail | error
    params: dict
    inputs: dict
    expected: dict                    # the first failing element: output, index, reference
    got: str
    message: str
    case_id: str
    replay: str = ""                  # the command that replays it
    declaration: dict | None = None   # a rule that matched but did not explain it (its message says why)
    # a rule of the formula declared for corpus case IDs only that would explain it, were it declared
    # for the formula (the runner's classification, applied as if its IDs matched): maybe its root cause
    fits: dict | None = None
    expect_error: dict | None = None  # an invalid example (examples.broken): the rule the spec rejects it by

    def to_json(self):
        return asdict(self)


@dataclass
class FormulaReport:
    formula: str
    dtype: str
    examples: int = 0                 # examples judged
    invalid: int = 0                  # examples outside the spec (the oracle rejected them)
    not_applicable: int = 0           # outside the adapter's capabilities (never called)
    unconfirmed: int = 0              # the oracle disagreed, the exact reference did not
    # invalid examples drawn on purpose (examples.broken, one in BAD_INPUT), judged as `pgspec run` judges an
    # expected-error case (spec/verdicts.md, "Validation"): validation is its own axis, never a finding
    rejected: int = 0
    not_rejected: int = 0
    not_rejected_examples: list = field(default_factory=list)   # the first NOT_REJECTED_KEPT of them
    explained: dict = field(default_factory=dict)   # "rule N of FILE (kind)" -> count
    findings: list = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""                   # pgspec's own problem with this formula (it was not searched)

    def to_json(self):
        d = asdict(self)
        d["findings"] = [x.to_json() if hasattr(x, "to_json") else x for x in self.findings]
        return d


class _Found(Exception):
    """Raised inside the hypothesis test for a confirmed new counterexample."""


_KINDS: dict = {}


def _kind(key: str):
    """One exception class per kind of failure, so that hypothesis shrinks each on its own."""
    cls = _KINDS.get(key)
    if cls is None:
        name = "Found_" + hashlib.sha1(key.encode()).hexdigest()[:10]
        cls = _KINDS[key] = type(name, (_Found,), {"__module__": __name__, "__qualname__": name})
    return cls


def _database(adapter_name: str):
    from hypothesis.database import DirectoryBasedExampleDatabase

    from ..base.cache import cache_dir

    root = cache_dir("fuzz")
    if root is None:
        return None
    return DirectoryBasedExampleDatabase(str(root / adapter_name))


def replay_command(adapter_spec: str, fid: str, dtype: str, seed: int) -> str:
    import shlex

    return " ".join(shlex.quote(p) for p in ["pgspec", "fuzz", "--adapter", adapter_spec, "--formulas", fid,
                                             "--dtype", dtype, "--seed", str(seed), "--budget", "30s"])


def fuzz_formula(adapter, fid: str, dtype: str, *, budget: float, seed: int = 0, max_examples: int | None = None,
                 device: str = "cpu", adapter_spec: str | None = None, database: bool = True,
                 stop=None, bad_input: bool = True) -> FormulaReport:
    """Search one formula in one dtype for ``budget`` seconds (or ``max_examples`` examples); with
    ``bad_input``, one example in BAD_INPUT is made invalid (``examples.broken``) and must be rejected."""
    from hypothesis import HealthCheck, Phase, Verbosity, assume, given, settings
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable
    from hypothesis.internal.conjecture import engine as hengine

    from ..corpus import strategies as pst
    from ..run.runner import declarations_of

    report = FormulaReport(fid, dtype)
    start = time.monotonic()
    decl = declarations_of(adapter)
    plan = ex.Plan(fid, decl)
    spec = adapter_spec or adapter.name
    found: dict = {}

    def check(example):
        report.examples += 1
        case = {"id": judge.case_id(fid, example), "formula": fid, "params": example["params"],
                "inputs": example["inputs"]}
        if decl.not_applicable(case) is not None or decl.unsupported_case(case) is not None:
            report.not_applicable += 1
            assume(False)
        if example.get("expect_error"):
            result = _judge_rejection(example)
            if result is None:
                return
        else:
            example = _fast_judged(example)
            if example is None:
                return
            try:
                result = judge.confirm(adapter, fid, example, dtype, device)
            except judge.Invalid:
                report.invalid += 1
                assume(False)
        if result.outcome in ("bug", "convention"):
            d = result.declaration or {}
            label = f"{d.get('declaration')} of {d.get('source')} ({result.outcome}): {d.get('reason')}"
            report.explained[label] = report.explained.get(label, 0) + 1
            return
        if result.outcome not in ("fail", "error"):
            report.unconfirmed += 1
            return
        fits = case_scoped_fit(decl, result, dtype, case)
        key = f"{result.outcome}:{','.join(result.failed_outputs or [])}:{(fits or {}).get('declaration')}"
        ff = result.first_failure or {}
        found[key] = Finding(fid, dtype, result.outcome, example["params"], example["inputs"],
                             {k: ff.get(k) for k in ("output", "index", "ref", "bound")} if ff else {},
                             ff.get("got", ""), result.message.strip()[:2000], result.case_id,
                             replay_command(spec, fid, dtype, seed), result.declaration, fits,
                             example.get("expect_error"))
        raise _kind(key)(result.message[:200])

    def _fast_judged(example):
        """None when the adapter agrees with the float64 oracle, else the example (repaired when the
        oracle said a parameter conflicts with another) for the exact confirmation."""
        for _ in range(3):
            try:
                why = judge.fast(adapter, fid, example, dtype, device)
                return None if why is None else example
            except judge.Invalid as e:
                fixed = ex.repaired(fid, example, str(e))
                if fixed is None:
                    break
                example = fixed
        report.invalid += 1
        assume(False)

    def _judge_rejection(example):
        """An invalid example: None when the adapter rejects it or returns (counted: validation), else the
        runner's result (an error: a crash of another kind, or a hang), which is a counterexample."""
        try:
            result = judge.confirm(adapter, fid, example, dtype, device)
        except judge.Invalid:       # the reference accepts it: not an invalid example after all
            report.invalid += 1
            assume(False)
        if result.outcome in ("not-applicable", "unsupported"):
            report.not_applicable += 1
            assume(False)
        if result.outcome == "rejected":
            report.rejected += 1
            return None
        if result.outcome == "not-rejected":
            report.not_rejected += 1
            if len(report.not_rejected_examples) < NOT_REJECTED_KEPT:
                report.not_rejected_examples.append(
                    {"argument": example["expect_error"]["argument"], "rule": example["expect_error"]["rule"],
                     "params": example["params"], "inputs": example["inputs"], "message": result.message,
                     "case_id": result.case_id})
            return None
        return result

    @st.composite
    def examples(draw):
        src = pst.DrawSource(draw)
        example = ex.draw(src, plan, dtype)
        if bad_input and ex.coin(src, BAD_INPUT):
            example = ex.broken(src, fid, example) or example
        return example

    db = _database(adapter.name) if database else None
    old_shrink = hengine.MAX_SHRINKING_SECONDS
    hengine.MAX_SHRINKING_SECONDS = min(SHRINK_SECONDS, max(15.0, budget))
    try:
        rnd = 0
        while True:
            n = ROUND if max_examples is None else min(ROUND, max_examples - report.examples)
            # every (formula, dtype) gets one round, however little of the budget is left
            out_of_time = rnd > 0 and (time.monotonic() - start >= budget or (stop is not None and stop()))
            if n <= 0 or (max_examples is None and out_of_time) or (max_examples is not None and rnd > 0 and stop
                                                                  is not None and stop()):
                break

            @settings(max_examples=n, deadline=None, database=db, derandomize=False, print_blob=False,
                      verbosity=Verbosity.quiet,
                      suppress_health_check=list(HealthCheck), report_multiple_bugs=True,
                      phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))
            @given(examples())
            def test(example):
                check(example)

            # the seed as hypothesis' @seed sets it, without @seed's database=None: a seeded search still
            # replays and keeps its failing examples
            test._hypothesis_internal_use_seed = seed + rnd
            test._hypothesis_internal_database_key = hashlib.sha256(
                f"{VERSION}|{spec}|{fid}|{dtype}".encode()).digest()
            before = report.examples
            try:
                test()
            except Unsatisfiable:
                pass
            except BaseException as e:  # noqa: BLE001 - the found counterexamples (a group when several)
                if isinstance(e, KeyboardInterrupt):
                    raise
                if not _is_found(e):
                    raise
            rnd += 1
            if found or report.examples == before:
                break
    finally:
        hengine.MAX_SHRINKING_SECONDS = old_shrink
    report.findings = [_trimmed(adapter, f, dtype, device) for f in found.values()]
    report.seconds = time.monotonic() - start
    return report


def case_scoped_rules(decl, formula: str, dtype: str, case_id: str) -> list:
    """The rules of ``formula`` in ``dtype`` that name corpus case IDs only: a fuzz example, whose ID is
    new, never matches them."""
    out = []
    for rule in getattr(decl, "rules", ()):
        if rule.dtypes and dtype not in rule.dtypes:
            continue
        if any(g.startswith(formula + "/") for g in rule.ids) and not rule.matches_id(case_id, formula):
            out.append(rule)
    return out


def case_scoped_fit(decl, result, dtype: str, case: dict) -> dict | None:
    """The first case-scoped rule (``case_scoped_rules``) whose conditions hold and that the runner's
    classification says explains ``result``, were its IDs the formula's; None when none does."""
    import copy

    from ..verdicts.classification import classify

    rules = [r for r in case_scoped_rules(decl, result.formula, dtype, result.case_id)
             if r.conditions_hold(case, dtype)]
    if not rules:
        return None
    trial = classify(copy.copy(result), rules)
    return trial.declaration if trial.outcome in ("bug", "convention") else None


def _verdict(adapter, fid, example, dtype, device):
    try:
        r = judge.confirm(adapter, fid, example, dtype, device)
    except Exception:  # noqa: BLE001 - a candidate outside the spec (or that cannot be a record)
        return None
    return r if r.outcome in ("fail", "error") else None


def _trimmed(adapter, f: Finding, dtype: str, device: str) -> Finding:
    """Hypothesis' shrinker, finished by hand where it stalls: parameters, whole rows, then columns
    removed while the runner still gives the same kind of failure (its outcome and failing outputs)."""
    key = (f.outcome, None)
    from ..run.untrusted import TIMED_OUT

    if f.expect_error:      # an invalid example: its one defect is what it tests; removing rows may cure it
        return f
    if TIMED_OUT in f.message:      # a hang: every trial would take the whole time limit
        return f
    example = {"params": f.params, "inputs": f.inputs}
    first = _verdict(adapter, f.formula, example, dtype, device)
    if first is None:
        return f
    key = (first.outcome, tuple(first.failed_outputs or ()))
    best = first
    for cut in (_without_param, _without_row, _without_column):
        k = 0
        while True:
            cand = cut(f.formula, example, k)
            if cand is False:
                break
            r = _verdict(adapter, f.formula, cand, dtype, device) if cand is not None else None
            if r is not None and (r.outcome, tuple(r.failed_outputs or ())) == key:
                example, best = cand, r
            else:
                k += 1
    if best is first:
        return f
    ff = best.first_failure or {}
    return Finding(f.formula, dtype, best.outcome, example["params"], example["inputs"],
                   {k: ff.get(k) for k in ("output", "index", "ref", "bound")} if ff else {}, ff.get("got", ""),
                   best.message.strip()[:2000], best.case_id, f.replay, best.declaration, f.fits)


def _without_param(fid: str, example: dict, k: int):
    """The example with its k-th parameter back at its default, False past the last one."""
    names = sorted(example["params"])
    if k >= len(names):
        return False
    return {"params": {n: v for n, v in example["params"].items() if n != names[k]}, "inputs": example["inputs"]}


def _without_row(fid: str, example: dict, k: int):
    """The example without its k-th row (every input's first dimension is B), None when that cannot
    be done (a parameter lists per-row values), False past the last row."""
    inputs = example["inputs"]
    first = inputs.get("mask", inputs.get("rewards"))
    B = len(first) if isinstance(first, list) else None
    if B is None or k >= B:
        return False
    if B <= 1 or any(isinstance(v, list) for v in example["params"].values()):
        return None
    out = {}
    for name, v in inputs.items():
        if not isinstance(v, list) or len(v) != B:
            return None
        out[name] = v[:k] + v[k + 1:]
    return {"params": example["params"], "inputs": out}


def _without_column(fid: str, example: dict, k: int):
    """The example without its k-th token column, None when that cannot be done, False past the last."""
    inputs = example["inputs"]
    if "mask" not in inputs:
        return False
    mask = inputs["mask"]
    T = len(mask[0]) if mask else 0
    if k >= T:
        return False
    if T <= 1 or any(isinstance(v, list) for v in example["params"].values()):
        return False
    f = REGISTRY[fid]
    out = {}
    for name, v in inputs.items():
        shapes = f.input(name).shapes
        per_token = isinstance(v, list) and v and isinstance(v[0], list) and len(v[0]) == T and \
            any(len(s) >= 2 and s[:2] == ("B", "T") for s in shapes)
        if not per_token and name == "document_ids":
            return None
        out[name] = [row[:k] + row[k + 1:] for row in v] if per_token else v
    return {"params": example["params"], "inputs": out}


def _is_found(e: BaseException) -> bool:
    if isinstance(e, _Found):
        return True
    subs = getattr(e, "exceptions", None)
    return bool(subs) and all(_is_found(x) for x in subs)
