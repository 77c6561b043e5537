"""An adapter's declarations: unsupported formulas, capabilities and deviation rules.

The file format, the order in which a case is classified and the policy that decides between
``bug`` and ``convention`` are normative: spec/verdicts.md.  This module reads and checks the file
(every error names the file, the declaration and the bad key) and answers the runner's three
questions: is this formula unsupported (and why), is this case outside a capability (and why),
which rule declares this result.
"""

from __future__ import annotations

import fnmatch
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..corpus.inputs import resolved_params  # noqa: F401 - re-exported

TABLES = ("unsupported", "capability", "rule", "check")
KINDS = ("bug", "convention")
EXPECTS = ("mismatch", "error")
DTYPES = ("float64", "float32", "bfloat16", "float16")
MAX_DECLARATIONS = 60
# spec/verdicts.md, "Cause classes": every rule's class, and the kind the class decides (a test holds
# this table equal to the spec's)
CAUSES = {
    "masked-nonfinite": "bug", "exp-overflow": "bug", "cancellation": "bug", "missing-gradient": "bug",
    "wrong-formula": "bug", "empty-rows-in-sequence-count": "bug", "crash": "bug",
    "empty-rows-in-row-count": "convention", "empty-batch": "convention", "zero-variance-eps0": "convention",
    "singleton-group": "convention", "always-on-clamp": "convention", "float32-compute": "convention",
    "float32-constants": "convention", "dtype-limit": "convention", "epsilon-placement": "convention",
    "formula-variant": "convention",
}
TOP_KEYS = {"tested", "about", "extends", "relink", "drop"}
PLACEMENT_KEYS = {"replaces", "after", "before"}
_KEYS = {
    "unsupported": {"formulas", "when", "reason", "link"},
    "capability": {"formulas", "params", "inputs", "reason", "link"},
    "rule": {"ids", "dtypes", "when", "kind", "expect", "reason", "link", "outputs", "max_ratio", "within", "raises",
             "match", "cause"},
    "check": {"ids", "raises", "match", "reason", "link"},
}
_REQUIRED = {
    "unsupported": ("formulas", "reason", "link"),
    "capability": ("formulas", "reason", "link"),
    "rule": ("ids", "kind", "reason", "link"),
    "check": ("ids", "raises", "match", "reason", "link"),
}


class DeclarationError(ValueError):
    """A declarations file is malformed, or a rule matches no case of the corpus."""


def _null(v):
    return None if v == "null" else v


def _number(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class Domain:
    """The values one parameter may take: a list (``"null"`` is null), or a closed interval."""

    values: tuple = ()
    lo: float | None = None
    hi: float | None = None
    interval: bool = False

    @classmethod
    def parse(cls, raw, where: str) -> "Domain":
        if isinstance(raw, dict):
            unknown = set(raw) - {"min", "max"}
            if unknown or not raw:
                raise DeclarationError(f"{where}: a parameter range is {{ min = a, max = b }}, got {raw!r}")
            lo, hi = raw.get("min"), raw.get("max")
            for v in (lo, hi):
                if v is not None and _number(v) is None:
                    raise DeclarationError(f"{where}: range bounds must be numbers, got {v!r}")
            lo, hi = (_number(lo) if lo is not None else None), (_number(hi) if hi is not None else None)
            if lo is not None and hi is not None and lo > hi:
                raise DeclarationError(f"{where}: an empty range (min = {lo!r} > max = {hi!r}) admits no value")
            if any(v is not None and math.isnan(v) for v in (lo, hi)):
                raise DeclarationError(f"{where}: a range bound is NaN, which admits no value")
            return cls(lo=lo, hi=hi, interval=True)
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise DeclarationError(f"{where}: an empty list of values admits no value")
        return cls(values=tuple(_null(v) for v in items))

    def admits(self, value) -> bool:
        if self.interval:
            x = _number(value)
            if x is None or math.isnan(x):
                return False
            return (self.lo is None or x >= self.lo) and (self.hi is None or x <= self.hi)
        for allowed in self.values:
            if allowed is None or value is None:
                if allowed is None and value is None:
                    return True
                continue
            if isinstance(allowed, bool) or isinstance(value, bool):
                if allowed is value:
                    return True
                continue
            a, b = _number(allowed), _number(value)
            if a is not None and b is not None and not isinstance(allowed, str):
                if a == b:
                    return True
                continue
            if allowed == value:
                return True
        return False

    def to_json(self):
        if self.interval:
            return {"min": self.lo, "max": self.hi}
        return ["null" if v is None else v for v in self.values]


_ID_PATTERNS: dict = {}


def _globs_pattern(globs):
    """One compiled regular expression that matches a string exactly when ``fnmatch.fnmatchcase``
    matches it with one of ``globs`` (each glob's own translation, anchored at both ends)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))


@dataclass(frozen=True)
class Declaration:
    table: str                      # unsupported | capability | rule
    position: int                   # 1-based, within its table
    source: str                     # the file it came from
    ids: tuple                      # formula globs (unsupported, capability) or formula/case ID globs (rule)
    reason: str
    link: str
    kind: str | None = None         # rules: bug | convention
    expect: str = "mismatch"        # rules: mismatch | error
    dtypes: tuple = ()              # rules: only these dtypes (empty: all)
    params: tuple = ()              # ((name, Domain), ...)
    inputs: tuple = ()              # predicate names, "not NAME" negates
    origin: str = field(default="", compare=False)   # "file, line N" where it was written (extends)
    inputs_float64: tuple = ()      # rules: the predicates that replace ``inputs`` in a float64 run (empty: the same)
    outputs: tuple = ()             # rules: the output globs ("loss", "grad.*") a mismatch may be in (empty: any)
    max_ratio: float | None = None  # rules: the largest error ratio the rule accepts (None: any)
    raises: str | None = None       # expect = "error" rules and checks: the exception's type name
    match: str | None = None        # ... and a regular expression its message must contain a match of
    cause: str | None = None        # rules: the cause class (spec/verdicts.md), which decides the kind
    within: str | None = None       # mismatch rules: the dtype whose tolerance the result must still meet

    def does_not_explain(self, outcome: str, *, failed_outputs=None, error_ratio=None, exception=None,
                         within=None) -> str | None:
        """None when this rule explains a result with ``outcome`` (``fail`` or ``error``), else what
        does not hold, in words (spec/verdicts.md, step 5): a mismatch rule explains a ``fail`` whose
        failing outputs all match its ``outputs`` and whose error ratio is within its ``max_ratio``;
        an error rule explains an ``error`` whose exception has its type and matches its ``match``."""
        if outcome == "fail":
            if self.expect != "mismatch":
                return "expects an error, and the case returned numbers that fail"
            # a property row has no outputs of its own (None): only max_ratio restricts it
            for key in (failed_outputs if failed_outputs is not None else [None]):
                why = self.why_not_covering(key, error_ratio, within)
                if why is not None:
                    return why
            return None
        if self.expect != "error":
            return "expects a mismatch, and the case raised"
        return self.exception_mismatch(exception)

    def why_not_covering(self, key: str | None, error_ratio, within) -> str | None:
        """None when this mismatch rule covers the failing output ``key`` of a result with
        ``error_ratio`` (``within``: {dtype: the outputs outside that dtype's tolerance}), else what
        does not hold; ``key`` None (a property row) is checked against ``max_ratio`` only."""
        if key is not None and self.outputs and not any(fnmatch.fnmatchcase(key, g) for g in self.outputs):
            return f"declares mismatches in {', '.join(self.outputs)} only, and {key} fails too"
        if self.max_ratio is not None and (error_ratio is None or not error_ratio <= self.max_ratio):
            return f"accepts an error ratio up to {self.max_ratio:g}, and the case's is {error_ratio}"
        if key is not None and self.within is not None:
            outside = (within or {}).get(self.within)
            if outside is None or key in outside:
                return f"accepts results within the {self.within} tolerance only, and {key} is not"
        return None

    def exception_mismatch(self, exception: dict | None) -> str | None:
        """None when ``exception`` ({"type", "message"}) is the one this rule or check names."""
        if not exception:
            return f"expects {self.raises}, and the case's exception is not known (its worker ended)"
        if exception.get("type") != self.raises:
            return f"expects {self.raises}, and the case raised {exception.get('type')}"
        if self.match and re.search(self.match, exception.get("message") or "") is None:
            return f"expects {self.raises} matching {self.match!r}, and its message is {exception.get('message')!r}"
        return None

    def written_at(self, path: str) -> str:
        """" (written at FILE, line N)" when the declaration was inherited from another file."""
        return f" (written at {self.origin})" if self.origin and not self.origin.startswith(path) else ""

    @property
    def label(self) -> str:
        return f"{self.table} {self.position}"

    def matches_id(self, case_id: str, formula_id: str) -> bool:
        """Some glob of ``ids`` matches the case ID or the formula ID (``fnmatch.fnmatchcase``)."""
        pattern = _ID_PATTERNS.get(self.ids)
        if pattern is None:
            pattern = _ID_PATTERNS[self.ids] = _globs_pattern(self.ids)
        return pattern.match(case_id) is not None or pattern.match(formula_id) is not None

    def conditions_hold(self, case: dict | None, dtype: str | None = None) -> bool:
        """The parameter domains and input predicates (all of them) hold for this case.  A property
        row (``case`` None) has no golden case for them to read: a rule reaches it only by naming it
        in ``ids`` (``prop.x/formula``), and then holds for it, so that the property rows of one root
        cause are declared in that cause's one rule (spec/verdicts.md, "Rules").  In a float64 run
        (``dtype``) a rule's ``inputs_float64`` replace its ``inputs``; with no dtype given, either set
        holding is enough (the corpus-wide checks ask whether a rule can match at all)."""
        if not self.params and not self.inputs and not self.inputs_float64:
            return True
        if case is None:
            return True
        params = resolved_params(case)
        for name, domain in self.params:
            if name not in params or not domain.admits(params[name]):
                return False
        if self.inputs_float64 and dtype == "float64":
            return all(_predicate(case, p) for p in self.inputs_float64)
        held = all(_predicate(case, p) for p in self.inputs)
        if self.inputs_float64 and dtype is None:
            return held or all(_predicate(case, p) for p in self.inputs_float64)
        return held

    def to_json(self) -> dict:
        d = {"table": self.table, "position": self.position, "source": self.source, "ids": list(self.ids),
             "reason": self.reason, "link": self.link}
        if self.table == "rule":
            d.update(kind=self.kind, expect=self.expect, dtypes=list(self.dtypes))
        for key in ("outputs", "max_ratio", "within", "raises", "match", "cause"):
            if getattr(self, key):
                d[key] = list(self.outputs) if key == "outputs" else getattr(self, key)
        if self.params:
            d["params"] = {n: dom.to_json() for n, dom in self.params}
        if self.inputs:
            d["inputs"] = list(self.inputs)
        if self.inputs_float64:
            d["inputs_float64"] = list(self.inputs_float64)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Declaration":
        params = tuple((n, Domain.parse(v, d["source"])) for n, v in (d.get("params") or {}).items())
        return cls(d["table"], d["position"], d["source"], tuple(d["ids"]), d["reason"], d["link"], d.get("kind"),
                   d.get("expect", "mismatch"), tuple(d.get("dtypes", ())), params, tuple(d.get("inputs", ())),
                   outputs=tuple(d.get("outputs", ())), max_ratio=d.get("max_ratio"), raises=d.get("raises"),
                   match=d.get("match"), cause=d.get("cause"), within=d.get("within"),
                   inputs_float64=tuple(d.get("inputs_float64", ())))

    def summary(self) -> dict:
        """What a result carries about the declaration that classified it."""
        out = {"declaration": self.label, "kind": self.kind or self.table, "reason": self.reason, "link": self.link,
               "source": self.source}
        if self.cause:
            out["cause"] = self.cause
        return out


_PRED_CACHE: dict = {}


def _predicate(case: dict, expr: str) -> bool:
    from .predicates import predicates

    negate = expr.startswith("not ")
    name = expr[4:].strip() if negate else expr
    key = (case["id"], name)
    if key not in _PRED_CACHE:
        _PRED_CACHE[key] = bool(predicates()[name](case))
    return _PRED_CACHE[key] != negate


@dataclass
class Declarations:
    path: str = ""
    unsupported: list = field(default_factory=list)
    capabilities: list = field(default_factory=list)
    rules: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    # the rules whose ID globs match a (case ID, formula ID), in order: a run asks once per dtype
    _by_id: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_id_of: tuple = field(default=(), init=False, repr=False, compare=False)

    def __len__(self):
        return len(self.unsupported) + len(self.capabilities) + len(self.rules) + len(self.checks)

    def all(self):
        return [*self.unsupported, *self.capabilities, *self.rules, *self.checks]

    def check_for(self, case_id: str, formula_id: str, exception: dict):
        """The first ``[[check]]`` that declares ``exception`` (raised in the adapter's own code) a
        rejection the framework makes for this case (spec/verdicts.md, "Validation"), or None."""
        for d in self.checks:
            if d.matches_id(case_id, formula_id) and d.exception_mismatch(exception) is None:
                return d
        return None

    def unsupported_for(self, formula_id: str):
        """The first [[unsupported]] entry without ``when`` whose globs match the formula."""
        for d in self.unsupported:
            if not d.params and not d.inputs and any(fnmatch.fnmatchcase(formula_id, g) for g in d.ids):
                return d
        return None

    def unsupported_case(self, case: dict):
        """The first [[unsupported]] entry with ``when`` that holds for the case: a parameter value or
        input form the framework has but the adapter cannot reach (spec/verdicts.md, step 1)."""
        for d in self.unsupported:
            if (d.params or d.inputs) and any(fnmatch.fnmatchcase(case["formula"], g) for g in d.ids) \
                    and d.conditions_hold(case):
                return d
        return None

    def not_applicable(self, case: dict):
        """The first capability that matches the case's formula and does not admit the case."""
        for d in self.capabilities:
            if any(fnmatch.fnmatchcase(case["formula"], g) for g in d.ids) and not d.conditions_hold(case):
                return d
        return None

    def rule_for(self, case_id: str, formula_id: str, dtype: str, case: dict | None):
        """The first rule that matches the case's IDs, dtype and conditions (None: no rule)."""
        found = self.rules_for(case_id, formula_id, dtype, case)
        return found[0] if found else None

    def rules_for(self, case_id: str, formula_id: str, dtype: str, case: dict | None) -> tuple:
        """Every rule that matches the case's IDs, dtype and conditions, in file order: a result takes
        the kind of the first of them that explains it (spec/verdicts.md, step 5)."""
        return tuple(d for d in self._rules_matching(case_id, formula_id)
                     if not (d.dtypes and dtype not in d.dtypes) and d.conditions_hold(case, dtype))

    def _rules_matching(self, case_id: str, formula_id: str) -> tuple:
        """The rules whose ID globs match, in order; remembered for as long as the rules are the same."""
        now = tuple(map(id, self.rules))
        if self._by_id_of != now:
            self._by_id.clear()
            self._by_id_of = now
        key = (case_id, formula_id)
        hit = self._by_id.get(key)
        if hit is None:
            hit = self._by_id[key] = tuple(d for d in self.rules if d.matches_id(case_id, formula_id))
        return hit

    def to_json(self) -> dict:
        return {"path": self.path, "declarations": [d.to_json() for d in self.all()]}

    @classmethod
    def from_json(cls, data: dict) -> "Declarations":
        out = cls(data.get("path", ""))
        for raw in data.get("declarations", []):
            d = Declaration.from_json(raw)
            out.table(d.table).append(d)
        return out

    def table(self, name: str) -> list:
        return {"unsupported": self.unsupported, "capability": self.capabilities, "rule": self.rules,
                "check": self.checks}[name]

    def check_against_corpus(self, cases: list, dtypes, property_ids=(), implemented=None) -> None:
        """Raise DeclarationError naming every declaration that cannot mean what it says against the
        corpus (spec/verdicts.md, "Checks"): an unsupported entry or capability whose globs match no
        formula ID; a capability that leaves a formula the adapter implements (``implemented``: its
        formula IDs, when known) no numeric case, alone or with the other capabilities; a rule that
        matches no numeric (case, dtype) and no property row (rules never apply to expected-error
        cases: validation is its own axis); a check that matches no expected-error case."""
        from pgspec.reference import REGISTRY

        problems = []

        def at(d):
            return f"{self.path}: [[{d.table}]] #{d.position}{d.written_at(self.path)} ({', '.join(d.ids)})" + \
                (f" at {d.origin}" if d.origin else "")

        for d in [*self.unsupported, *self.capabilities]:
            if not any(fnmatch.fnmatchcase(fid, g) for fid in REGISTRY for g in d.ids):
                problems.append(f"{at(d)} matches no formula ID")
            elif d.table == "unsupported" and (d.params or d.inputs) and not any(
                    any(fnmatch.fnmatchcase(c["formula"], g) for g in d.ids) and d.conditions_hold(c) for c in cases):
                problems.append(f"{at(d)}: its 'when' holds for no case of the corpus")
        numeric = [c for c in cases if not c.get("expect_error")]
        by_formula: dict = {}
        for c in numeric:
            by_formula.setdefault(c["formula"], []).append(c)
        for fid, fcases in sorted(by_formula.items()):
            if implemented is None or fid not in implemented or self.unsupported_for(fid) is not None:
                continue    # (without the adapter's formulas no capability can be said to hide one)
            mine = [d for d in self.capabilities if any(fnmatch.fnmatchcase(fid, g) for g in d.ids)]
            for d in mine:
                if not any(d.conditions_hold(c) for c in fcases):
                    problems.append(f"{at(d)} admits none of the {len(fcases)} numeric cases of {fid}: a capability "
                                    f"that leaves a formula no case hides it; declare {fid} [[unsupported]] or widen "
                                    "the domain")
            if len(mine) > 1 and all(any(d.conditions_hold(c) for c in fcases) for d in mine) and \
                    not any(all(d.conditions_hold(c) for d in mine) for c in fcases):
                problems.append(f"{self.path}: the capabilities {', '.join(d.label for d in mine)} together admit "
                                f"none of the {len(fcases)} numeric cases of {fid}; declare it [[unsupported]] or "
                                "widen a domain")
        for d in self.rules:
            ds = [x for x in dtypes if not d.dtypes or x in d.dtypes]
            hit = bool(ds) and (any(d.matches_id(c["id"], c["formula"]) and d.conditions_hold(c) for c in numeric)
                                or any(d.matches_id(pid, pid.split("/")[0]) and d.conditions_hold(None)
                                       for pid in property_ids))
            if not hit:
                only_errors = any(d.matches_id(c["id"], c["formula"]) for c in cases if c.get("expect_error"))
                problems.append(f"{at(d)} matches no numeric case of the corpus in dtypes "
                                f"{', '.join(ds) or '(none of the adapter’s)'}"
                                + (" (only expected-error cases, to which no rule applies: validation is reported "
                                   "on its own, spec/verdicts.md)" if only_errors else "")
                                + ": a rule that matches nothing is an error; remove it or correct its globs and "
                                "conditions")
        for d in self.checks:
            if not any(d.matches_id(c["id"], c["formula"]) for c in cases if c.get("expect_error")):
                problems.append(f"{at(d)} matches no expected-error case of the corpus: a check that matches nothing "
                                "is an error")
        if problems:
            raise DeclarationError("\n".join(problems))


def _as_list(v, where, key):
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return v
    raise DeclarationError(f"{where}: {key!r} must be a string or a non-empty list of strings, got {v!r}")


def _param_domains(raw, where, formula_globs):
    from pgspec.reference import REGISTRY

    if not isinstance(raw, dict):
        raise DeclarationError(f"{where}: 'params' must be a table {{ name = [values] }}, got {raw!r}")
    known = {p.name for fid, f in REGISTRY.items() for p in f.params
             if any(fnmatch.fnmatchcase(fid, g) for g in formula_globs) or not formula_globs}
    if not formula_globs or not known:
        known = {p.name for f in REGISTRY.values() for p in f.params}
    out = []
    for name, value in raw.items():
        if name not in known:
            raise DeclarationError(f"{where}: unknown parameter {name!r} (parameters of the matched formulas: "
                                   f"{', '.join(sorted(known))})")
        out.append((name, Domain.parse(value, f"{where}: params.{name}")))
    return tuple(out)


def _inputs(raw, where):
    from .predicates import predicates

    names = _as_list(raw, where, "inputs")
    known = predicates()
    for expr in names:
        name = expr[4:].strip() if expr.startswith("not ") else expr
        if name not in known:
            raise DeclarationError(f"{where}: unknown input predicate {name!r}; known: {', '.join(sorted(known))} "
                                   "(pgspec.conformance.verdicts.predicates)")
    return tuple(names)


def _scope(entry: dict, expect: str, where: str) -> dict:
    """What a rule absorbs (spec/verdicts.md, "Rules"): a mismatch rule's ``outputs`` and
    ``max_ratio``; an error rule's ``raises`` and ``match``, which it must give."""
    if expect == "error":
        bad = sorted({"outputs", "max_ratio", "within"} & set(entry))
        if bad:
            raise DeclarationError(f"{where}: {', '.join(bad)} belong to a mismatch rule; an error rule names its "
                                   "exception with raises (and match)")
        return _exception_keys(entry, where)
    bad = sorted({"raises", "match"} & set(entry))
    if bad:
        raise DeclarationError(f"{where}: {', '.join(bad)} belong to an error rule (expect = \"error\")")
    out: dict = {}
    if "outputs" in entry:
        outputs = _as_list(entry["outputs"], where, "outputs")
        for g in outputs:
            if not re.fullmatch(r"(grad\.)?[A-Za-z0-9_*?\[\]!]+", g):
                raise DeclarationError(f"{where}: outputs: {g!r} is not an output name or glob (\"loss\", "
                                       "\"grad.logprobs\", \"grad.*\")")
        out["outputs"] = tuple(outputs)
    if "max_ratio" in entry:
        m = entry["max_ratio"]
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 1:
            raise DeclarationError(f"{where}: max_ratio must be a number above 1 (a ratio of 1 or less passes), "
                                   f"got {m!r}")
        out["max_ratio"] = float(m)
    if "within" in entry:
        w = entry["within"]
        if w not in DTYPES:
            raise DeclarationError(f"{where}: within must be a dtype whose tolerance the result must meet "
                                   f"({', '.join(DTYPES)}), got {w!r}")
        out["within"] = w
    return out


def _exception_keys(entry: dict, where: str) -> dict:
    """``raises`` (an exception type's name, required) and ``match`` (a regular expression)."""
    raises = entry.get("raises")
    if not isinstance(raises, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", raises or ""):
        raise DeclarationError(f"{where}: raises must name the exception type the framework raises "
                               f"(\"ZeroDivisionError\"), got {raises!r}")
    match = entry.get("match")
    if match is not None:
        if not isinstance(match, str) or not match:
            raise DeclarationError(f"{where}: match must be a non-empty regular expression, got {match!r}")
        try:
            re.compile(match)
        except re.error as e:
            raise DeclarationError(f"{where}: match is not a valid regular expression ({e})") from None
    return {"raises": raises, "match": match}


def _formula_globs_of(ids):
    return [g.split("/")[0] for g in ids]


def _header_lines(text: str | None) -> dict:
    """{(table, k): line number of the k-th [[table]] header} (1-based), when the file text is known."""
    import re

    lines: dict = {}
    counts: dict = {}
    for n, line in enumerate((text or "").splitlines(), 1):
        m = re.match(r"\s*\[\[\s*([A-Za-z_]+)\s*\]\]", line)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
            lines[(m.group(1), counts[m.group(1)])] = n
    return lines


@dataclass
class _Raw:
    """One declaration as written: its table, its TOML entry and where it was written."""

    table: str
    entry: dict
    file: str
    line: int | None

    @property
    def at(self) -> str:
        return f"{self.file}{f', line {self.line}' if self.line else ''}"


def _raw_entries(data: dict, path: str, text: str | None, extending: bool) -> dict:
    """{table: [_Raw, ...]} of one file, in file order, with the top-level keys checked."""
    unknown_tables = set(data) - set(TABLES) - TOP_KEYS
    if unknown_tables:
        raise DeclarationError(f"{path}: unknown table(s) {', '.join(sorted(unknown_tables))}; expected "
                               "[[unsupported]], [[capability]] and [[rule]] (spec/verdicts.md)")
    if not extending:
        for key in ("relink", "drop"):
            if key in data:
                raise DeclarationError(f"{path}: {key!r} is only meaningful with extends = \"<base file>\"")
    header = _header_lines(text)
    out: dict = {}
    for table in TABLES:
        entries = data.get(table, [])
        if not isinstance(entries, list):
            raise DeclarationError(f"{path}: {table} must be an array of tables ([[{table}]])")
        out[table] = []
        for k, entry in enumerate(entries, 1):
            raw = _Raw(table, entry, path, header.get((table, k)))
            if not extending:
                placed = sorted(set(entry) & PLACEMENT_KEYS)
                if placed:
                    raise DeclarationError(f"{raw.at}: [[{table}]] #{k}: {', '.join(placed)} only in a file with "
                                           "extends = \"<base file>\"")
            out[table].append(raw)
    names: dict = {}
    for table in TABLES:
        for k, raw in enumerate(out[table], 1):
            name = raw.entry.get("name")
            if name is None:
                continue
            if not isinstance(name, str) or not name:
                raise DeclarationError(f"{raw.at}: [[{table}]] #{k}: 'name' must be a non-empty string")
            if name in names:
                raise DeclarationError(f"{raw.at}: [[{table}]] #{k}: name {name!r} is already used at "
                                       f"{names[name].at}")
            names[name] = raw
    return out


def _relink(link: str, relink: dict, raw: _Raw, path: str) -> str:
    """The inherited link moved to the extending file's revision: the longest matching prefix is
    replaced and the line anchor dropped (line numbers are those of the base revision)."""
    keys = [k for k in relink if link.startswith(k)]
    if not keys:
        raise DeclarationError(f"{path}: relink: the inherited link of [[{raw.table}]] at {raw.at} ({link}) starts "
                               "with none of the relink prefixes; add one, or replace the declaration")
    key = max(keys, key=len)
    return (relink[key] + link[len(key):]).split("#", 1)[0]


def _resolve(path: Path, chain: tuple) -> dict:
    """{table: [_Raw, ...]}: the declarations of the file, with those of the file it extends."""
    shown = _display_path(path)
    if path.resolve() in chain:
        cycle = " -> ".join(_display_path(p) for p in (*chain, path.resolve()))
        raise DeclarationError(f"{shown}: extends forms a cycle: {cycle}")
    from ..base.files import FileProblem, read_text

    try:
        text = read_text(path)      # a regular UTF-8 file of at most 4 MiB (issue 39)
    except FileProblem as e:
        raise DeclarationError(str(e).replace(str(path), shown, 1)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DeclarationError(f"{shown}: not valid TOML: {e}") from None
    extends = data.get("extends")
    own = _raw_entries(data, shown, text, extends is not None)
    if extends is None:
        return own
    if not isinstance(extends, str) or not extends:
        raise DeclarationError(f"{shown}: extends must be the path of one declarations file, got {extends!r}")
    base_path = path.parent / extends
    if not base_path.is_file():
        raise DeclarationError(f"{shown}: extends = {extends!r}: no such file ({_display_path(base_path)})")
    base = _resolve(base_path, (*chain, path.resolve()))
    relink = data.get("relink")
    if relink is not None and (not isinstance(relink, dict) or not relink
                               or not all(isinstance(v, str) for v in relink.values())):
        raise DeclarationError(f"{shown}: relink must be a table {{ \"<base link prefix>\" = \"<new prefix>\" }}")
    drop = data.get("drop", [])
    if not isinstance(drop, list) or not all(isinstance(x, str) for x in drop):
        raise DeclarationError(f"{shown}: drop must be a list of declaration names")
    names = {raw.entry["name"]: raw for t in TABLES for raw in base[t] if "name" in raw.entry}
    for name in drop:
        if name not in names:
            raise DeclarationError(f"{shown}: drop: no inherited declaration is named {name!r} "
                                   f"(names: {', '.join(sorted(names)) or 'none'})")
    merged: dict = {}
    for table in TABLES:
        merged[table] = []
        for raw in base[table]:
            if raw.entry.get("name") in drop:
                continue
            entry = dict(raw.entry)
            if relink:
                entry["link"] = _relink(str(entry.get("link", "")), relink, raw, shown)
            merged[table].append(_Raw(table, entry, raw.file, raw.line))
    replaced: dict = {}
    for table in TABLES:
        for k, raw in enumerate(own[table], 1):
            where = f"{raw.at}: [[{table}]] #{k}"
            entry = dict(raw.entry)
            placement = [key for key in ("replaces", "after", "before") if key in entry]
            if len(placement) > 1:
                raise DeclarationError(f"{where}: give one of replaces, after, before; got {', '.join(placement)}")
            target = entry.pop(placement[0]) if placement else None
            if placement and not isinstance(target, str):
                raise DeclarationError(f"{where}: {placement[0]} must be a declaration name, got {target!r}")
            name = entry.get("name")
            if name in names and target != name and name not in drop:
                raise DeclarationError(f"{where}: name {name!r} overrides the inherited [[{names[name].table}]] at "
                                       f"{names[name].at}; write replaces = {name!r}, drop it, or choose another name")
            current = {r.entry.get("name"): i for i, r in enumerate(merged[table]) if "name" in r.entry}
            if placement:
                if target in drop:
                    raise DeclarationError(f"{where}: {placement[0]} = {target!r}, which this file drops")
                if target not in current:
                    other = names.get(target)
                    hint = f"it is a [[{other.table}]]" if other else "no such name"
                    raise DeclarationError(f"{where}: {placement[0]} = {target!r}: no [[{table}]] of that name "
                                           f"({hint})")
            new = _Raw(table, entry, raw.file, raw.line)
            if not placement:
                merged[table].append(new)
            elif placement[0] == "replaces":
                if target in replaced:
                    raise DeclarationError(f"{where}: {target!r} is already replaced at {replaced[target].at}")
                replaced[target] = raw
                entry.setdefault("name", target)
                merged[table][current[target]] = new
            else:
                i = current[target] + (1 if placement[0] == "after" else 0)
                merged[table].insert(i, new)
    return merged


def parse(data: dict, path: str, text: str | None = None) -> Declarations:
    """The declarations of one file that extends no other (``load`` resolves ``extends``)."""
    if "extends" in data:
        raise DeclarationError(f"{path}: extends is resolved by load(), which knows the file's directory")
    return _build(_raw_entries(data, path, text, False), path)


def _build(raws: dict, path: str) -> Declarations:
    out = Declarations(path)
    for table in TABLES:
        for k, raw in enumerate(raws[table], 1):
            entry = {key: v for key, v in raw.entry.items() if key != "name"}
            where = (f"{raw.at}: [[{table}]] #{k}" if raw.file == path
                     else f"{path}: [[{table}]] #{k} (inherited from {raw.at})")
            unknown = set(entry) - _KEYS[table]
            if unknown:
                raise DeclarationError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: "
                                       f"{', '.join(sorted(_KEYS[table]))}")
            missing = [key for key in _REQUIRED[table] if not entry.get(key)]
            if missing:
                raise DeclarationError(f"{where}: lacks {', '.join(missing)}")
            for key in ("reason", "link"):
                if not isinstance(entry[key], str) or "\n" in entry[key].strip():
                    raise DeclarationError(f"{where}: {key!r} must be one line of text")
            id_key = "ids" if table in ("rule", "check") else "formulas"
            ids = tuple(_as_list(entry[id_key], where, id_key))
            kw = {}
            if table == "rule":
                if entry["kind"] not in KINDS:
                    raise DeclarationError(f"{where}: kind must be one of {', '.join(KINDS)}, got {entry['kind']!r}")
                expect = entry.get("expect", "mismatch")
                if expect not in EXPECTS:
                    raise DeclarationError(f"{where}: expect must be one of {', '.join(EXPECTS)}, got {expect!r}")
                dtypes = tuple(_as_list(entry.get("dtypes", list(DTYPES)), where, "dtypes")) if "dtypes" in entry else ()
                bad = [d for d in dtypes if d not in DTYPES]
                if bad:
                    raise DeclarationError(f"{where}: unknown dtype(s) {bad}; choose from {', '.join(DTYPES)}")
                when = entry.get("when", {})
                if not isinstance(when, dict) or set(when) - {"params", "inputs", "inputs_float64"}:
                    raise DeclarationError(f"{where}: 'when' is a table with 'params', 'inputs' and/or "
                                           f"'inputs_float64', got {when!r}")
                if "inputs_float64" in when and ("float64" not in (dtypes or DTYPES)):
                    raise DeclarationError(f"{where}: 'inputs_float64' is for a rule that holds in float64, and "
                                           f"its dtypes are {list(dtypes)}")
                conditions = dict(params=_param_domains(when.get("params", {}), where, _formula_globs_of(ids)),
                                  inputs=_inputs(when["inputs"], where) if "inputs" in when else (),
                                  inputs_float64=(_inputs(when["inputs_float64"], where)
                                                  if "inputs_float64" in when else ()),
                                  **_scope(entry, expect, where))
                cause = entry.get("cause")
                if cause is None:
                    raise DeclarationError(f"{where}: lacks cause (a class of spec/verdicts.md, \"Cause classes\": "
                                           f"{', '.join(CAUSES)})")
                if cause not in CAUSES:
                    raise DeclarationError(f"{where}: cause must be one of the classes of spec/verdicts.md "
                                           f"({', '.join(CAUSES)}), got {cause!r}")
                if CAUSES[cause] != entry["kind"]:
                    raise DeclarationError(f"{where}: a {cause!r} root cause is a {CAUSES[cause]}, by the policy "
                                           f"(spec/verdicts.md, \"Cause classes\"); the rule says {entry['kind']!r}")
                kw = dict(kind=entry["kind"], expect=expect, dtypes=dtypes, cause=cause, **conditions)
            elif table == "check":
                kw = _exception_keys(entry, where)
            elif table == "unsupported" and "when" in entry:
                when = entry["when"]
                if not isinstance(when, dict) or not when or set(when) - {"params", "inputs"}:
                    raise DeclarationError(f"{where}: 'when' is a table with 'params' and/or 'inputs', got {when!r}")
                kw = dict(params=_param_domains(when.get("params", {}), where, ids),
                          inputs=_inputs(when["inputs"], where) if "inputs" in when else ())
            elif table == "capability":
                if "params" not in entry and "inputs" not in entry:
                    raise DeclarationError(f"{where}: a capability restricts 'params' and/or 'inputs'")
                kw = dict(params=_param_domains(entry.get("params", {}), where, ids),
                          inputs=_inputs(entry["inputs"], where) if "inputs" in entry else ())
            d = Declaration(table, k, path, ids, entry["reason"].strip(), entry["link"].strip(), origin=raw.at, **kw)
            out.table(table).append(d)
    if len(out) > MAX_DECLARATIONS:
        raise DeclarationError(f"{path}: {len(out)} declarations; at most {MAX_DECLARATIONS} (one rule per root "
                               "cause, spec/verdicts.md)")
    return out


def load(path) -> Declarations:
    """Read and check a declarations file, with the file it extends (spec/verdicts.md); a missing
    file declares nothing."""
    path = Path(path)
    shown = _display_path(path)
    if not path.exists():
        return Declarations(shown)
    return _build(_resolve(path, ()), shown)


def _display_path(path: Path) -> str:
    parts = path.resolve().parts
    if "adapters" in parts:
        i = len(parts) - 1 - parts[::-1].index("adapters")
        return "/".join(parts[i:])
    return str(path)
