"""Binding coverage of the golden corpus: does every bound, clamp, threshold and cap take effect
somewhere (and not take effect somewhere else)?

A conformance corpus only catches an implementation that ignores one side of a clamp if some case
has an unmasked element beyond that side *and* the clamp changes a compared output there.  For
every bounding parameter of every formula (the table ``BOUNDS`` below) and every case that sets it,
this module decides from the reference alone whether each side *binds*:

* the parameter is *relaxed* (moved outward: a lower bound down, an upper bound up, a threshold
  so that it excludes less) and the case re-evaluated; the side binds only if some output or
  gradient element changes (so the clamp is observable, not just reached);
* for a symmetric clamp (one parameter c giving the interval [-c, c]) the evaluation is traced
  through the reference's ``clip`` and the side that took effect on an unmasked element is
  recorded; a side binds if it took effect and relaxing c changes a result.

``pgspec golden coverage`` prints the table; ``tests/test_coverage.py`` fails naming every
parameter side that binds in no case of its formula (recipes: in no ``loss.*`` case using it), or
that binds in every case (so no case shows the unclamped behaviour).  Scale cases are left out
(their long inputs would only repeat what the small cases show, at a thousand times the cost).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpmath import mp, mpf

DPS = 30

# parameter -> (sides, relax): sides are "lower" / "upper" / "threshold" / "symmetric"; relax maps the
# parameter's value to one that bounds less.  Recipe parameters carry a prefix (is_, kl_, opsm_).
def _down(x):
    x = mpf(x)
    return x / 2 if x > 0 else x - (abs(x) + 1)


def _up(x):
    x = mpf(x)
    return x * 2 + 1 if x >= 0 else x / 2


BOUNDS = {
    "eps_low": ("lower", lambda v: (1 + mpf(v)) / 2),            # bound 1 - eps_low moves toward 0
    "eps_high": ("upper", lambda v: mpf(v) * 2 + 1),
    "c": ("upper", lambda v: mpf(v) * 2),                          # dual clip: -c A caps the loss
    "delta": ("upper", lambda v: mpf(v) * 2 + 1),                  # trl_delta cap on r; OPSM threshold
    "log_ratio_clamp": ("symmetric", lambda v: mpf(v) * 2),
    "log_ratio_max": ("upper", _up),
    "log_ratio_min": ("lower", _down),
    "output_max": ("upper", _up),
    "output_min": ("lower", _down),
    "c_min": ("lower", _down),
    "c_max": ("upper", _up),
    "lower": ("lower", _down),
    "upper": ("upper", _up),
    "cap": ("upper", _up),
    "top_entropy_quantile": ("threshold", lambda v: mpf(1)),
    "quantile": ("threshold", lambda v: mpf(1)),
    "min_weight": ("lower", _down),
    "max_log_weight": ("upper", _up),
    "lambda_min": ("lower", _down),
}
PREFIXES = ("is_", "kl_", "opsm_", "entropy_")


def base_name(param: str) -> str | None:
    if param in BOUNDS:
        return param
    for p in PREFIXES:
        if param.startswith(p) and param[len(p):] in BOUNDS:
            return param[len(p):]
    return None


def bounding_params(formula_id: str) -> list[tuple[str, str]]:
    """(parameter, side) pairs of a formula; a symmetric clamp gives a lower and an upper side."""
    from pgspec.reference import REGISTRY

    out = []
    for p in REGISTRY[formula_id].params:
        if p.kind != "real":
            continue
        b = base_name(p.name)
        if b is None:
            continue
        sides = BOUNDS[b][0]
        if sides == "symmetric":
            out += [(p.name, "lower"), (p.name, "upper")]
        else:
            out.append((p.name, sides))
    return out


@dataclass
class Row:
    formula: str
    param: str
    side: str
    binds: list = field(default_factory=list)       # case IDs where the side binds
    free: list = field(default_factory=list)        # case IDs that set the parameter where it does not

    @property
    def key(self):
        return f"{self.formula}:{self.param}:{self.side}"


class _ClipTrace:
    """Patches the reference modules' ``clip`` to record which side of which bound took effect."""

    def __init__(self):
        self.events = []

    def __enter__(self):
        import sys

        from pgspec.reference import _ad

        original = _ad.clip
        value_of = _ad.value_of

        def clip(x, lo=None, hi=None):
            v = value_of(x)
            if lo is not None and v < value_of(lo):
                self.events.append(("lower", value_of(lo)))
            elif hi is not None and v > value_of(hi):
                self.events.append(("upper", value_of(hi)))
            return original(x, lo, hi)

        self._patched = []
        for name, module in list(sys.modules.items()):
            if name.startswith("pgspec.reference") and getattr(module, "clip", None) is original:
                self._patched.append(module)
                module.clip = clip
        self._original = original
        return self

    def __exit__(self, *exc):
        for module in self._patched:
            module.clip = self._original
        return False


def _flat(x):
    if isinstance(x, list):
        for v in x:
            yield from _flat(v)
    elif isinstance(x, dict):
        for k in sorted(x):
            yield from _flat(x[k])
    else:
        yield x


def _same(a, b) -> bool:
    fa, fb = list(_flat(a)), list(_flat(b))
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb):
        if x is None or y is None or isinstance(x, (bool, str)) or isinstance(y, (bool, str)):
            if x != y:
                return False
            continue
        if (mp.isnan(x) and mp.isnan(y)) or x == y:
            continue
        return False
    return True


def _evaluate(fid, inputs, params):
    from pgspec.reference import evaluate

    return evaluate(fid, inputs, params, dps=DPS)


def case_rows(case: dict) -> list[tuple[str, str, bool]]:
    """(parameter, side, binds) for every bounding parameter the case sets (non-null)."""
    from pgspec.reference import REGISTRY

    from .inputs import resolved_params
    from .inputs import case_inputs

    fid = case["formula"]
    params = resolved_params(case)
    inputs = case_inputs(case)
    pairs = [(p, s) for p, s in bounding_params(fid) if params.get(p) is not None]
    if not pairs:
        return []
    with _ClipTrace() as trace:
        base = _evaluate(fid, inputs, case["params"])
    kinds = {p.name: p for p in REGISTRY[fid].params}
    out = []
    relaxed_cache = {}
    for pname, side in pairs:
        if pname not in relaxed_cache:
            relax = BOUNDS[base_name(pname)][1]
            new = dict(case["params"])
            value = relax(params[pname])
            p = kinds[pname]
            if p.hi is not None and value > p.hi or (p.hi is not None and p.hi_open and value >= p.hi):
                value = (mpf(params[pname]) + mpf(p.hi)) / 2
            new[pname] = mp.nstr(value, 40) if not isinstance(value, str) else value
            try:
                relaxed_cache[pname] = not _same(base, _evaluate(fid, inputs, new))
            except Exception:  # noqa: BLE001 - a relaxed value the spec rejects: the side is not testable here
                relaxed_cache[pname] = False
        changed = relaxed_cache[pname]
        if BOUNDS[base_name(pname)][0] == "symmetric":
            c = mpf(params[pname])
            hit = any(s == side and abs(b) == c for s, b in trace.events)
            out.append((pname, side, changed and hit))
        else:
            out.append((pname, side, changed))
    return out


def coverage(cases=None) -> dict[str, Row]:
    from . import golden

    cases = golden.load_all() if cases is None else cases
    rows: dict[str, Row] = {}
    for c in cases:
        if c["category"] == "scale" or c.get("expect_error"):
            continue
        for p, s in bounding_params(c["formula"]):
            rows.setdefault(f"{c['formula']}:{p}:{s}", Row(c["formula"], p, s))
        for p, s, binds in case_rows(c):
            row = rows[f"{c['formula']}:{p}:{s}"]
            (row.binds if binds else row.free).append(c["id"])
    return dict(sorted(rows.items()))


def problems(rows: dict[str, Row]) -> list[str]:
    """Every parameter side that never binds (in its formula's cases; a recipe parameter in no loss.*
    case), or that binds in every case that sets it (no case shows the unclamped behaviour)."""
    out = []
    recipe_binds: dict = {}
    for r in rows.values():
        if r.formula.startswith("loss."):
            key = (base_name(r.param) if r.param.startswith(PREFIXES) else r.param, r.param, r.side)
            agg = recipe_binds.setdefault(key, [0, 0, []])
            agg[0] += len(r.binds)
            agg[1] += len(r.free)
            agg[2].append(r.formula)
            continue
        if not r.binds:
            out.append(f"{r.formula}: {r.param} ({r.side}) binds in no case ({len(r.free)} case(s) set it)")
        elif not r.free:
            out.append(f"{r.formula}: {r.param} ({r.side}) binds in every case that sets it ({len(r.binds)}): "
                       "no case shows it not binding")
    for (_, param, side), (nb, nf, formulas) in sorted(recipe_binds.items()):
        if nb == 0:
            out.append(f"loss.*: {param} ({side}) binds in no loss recipe case ({nf} case(s) of "
                       f"{len(set(formulas))} recipe(s) set it)")
    return out


def table(rows: dict[str, Row]) -> str:
    lines = [f"{'formula':28s} {'parameter':24s} {'side':9s} {'binds':>6s} {'free':>6s}"]
    for r in rows.values():
        flag = "" if r.binds and r.free else ("  <- never binds" if not r.binds else "  <- always binds")
        if r.formula.startswith("loss.") and not r.binds:
            flag = "  (recipe)"
        lines.append(f"{r.formula:28s} {r.param:24s} {r.side:9s} {len(r.binds):6d} {len(r.free):6d}{flag}")
    return "\n".join(lines)



# Error coverage: every SpecError the reference raises has an expected-error golden case ------------
#
# A site is a ``raise SpecError(...)`` or a ``require(...)`` call in reference/*.py.  Which case
# reaches which site is not written down: each expected-error case is evaluated by the reference and
# the innermost reference frame of the SpecError it raises names the site.  A site that no case
# reaches must be listed in ``NOT_DATA`` with the reason no golden case can reach it.

# (file, function, a fragment of the site's source) -> why no golden case can reach those SpecError sites
NOT_DATA = {
    ("_evaluate.py", "evaluate", "SpecError"): "API misuse (formula_id, params or inputs not of their types, dps), "
                                               "not data: a golden case always has a formula ID string, a params "
                                               "object and an inputs object",
    ("_evaluate.py", "check_params", "params must be a dict"): "params not a dict: a golden case's params are "
                                                               "always a JSON object",
    ("_evaluate.py", "convert_inputs", "unknown input"): "the golden format stores each input by its registry "
                                                         "declaration (spec/golden-format.md), so a case cannot "
                                                         "hold an unknown input name",
    ("_evaluate.py", "convert_inputs", "elements (shape"): "the size limit of one evaluation (MAX_ELEMENTS, "
                                                          "1,000,000 elements per input): the corpus's largest "
                                                          "input has 65,536, and a case past the limit could not "
                                                          "be evaluated to be stored",
    ("_evaluate.py", "_shape", "nested deeper"): "a recursion guard: an input nested two or more levels beyond "
                                                 "its rank, or a list that contains itself (which no JSON "
                                                 "document holds), is refused before the shape check; one level "
                                                 "too deep is data and reaches the shape check's error (the "
                                                 "error-*-shape cases)",
    ("_evaluate.py", "_leaf", "must be a real number"): "the golden format stores a real input as decimal strings "
                                                         "(spec/golden-format.md), so a case cannot hold a "
                                                         "non-number there",
    ("_evaluate.py", "_cotangent", "SpecError"): "the cotangent argument (its shape, a non-number, a non-finite "
                                                 "value): a golden case's cotangent is made by the generator "
                                                 "for the output's shape, never data a case could hold wrong",
    ("_evaluate.py", "conv", "SpecError"): "the cotangent argument's elements (see _cotangent): made by the "
                                           "generator, bfloat16 numbers",
    ("_evaluate.py", "_check_leaves", "SpecError"): "the element type of a bool or int input (a mask holding "
                                                    "1): the runner gives an adapter tensors of the declared "
                                                    "dtype, so no adapter could be seen to reject it",
    ("_registry.py", "get", "unknown formula ID"): "a golden case names a registered formula",
    ("_progress.py", "check_progress", "SpecError"): "API misuse (evaluate's progress argument), not data: a "
                                                     "golden case has no progress",
    ("agg.py", "_check_eps", "SpecError"): "shadowed: every eps parameter is a registry Param with lo = 0, not "
                                           "nullable, whose range check rejects a negative or null eps first "
                                           "(cases error-eps-below)",
    ("agg.py", "constant", "SpecError"): "shadowed: 'divisor' is a RequiredRealParam (> 0) and 'divide_by' a "
                                         "choice parameter; the registry checks reject null, <= 0 and unknown "
                                         "choices first (cases error-divisor-null, error-divisor-below, "
                                         "error-divide-by-choice)",
    ("agg.py", "prompt_mean", "missing input 'group_ids'"): "shadowed: agg.prompt_mean declares group_ids a "
                                                            "required input (case error-missing-group-ids)",
    ("agg.py", "document_mean", "missing input 'document_ids'"): "shadowed: agg.document_mean declares "
                                                                 "document_ids a required input",
    ("agg.py", "full_denominators", "SpecError"): "shadowed: dist.* formulas check the aggregator's ids "
                                                  "(dist._require_ids) and its choice parameter before computing "
                                                  "the whole-batch denominators",
}
_SITE_TEXT: dict = {}


def not_data(site) -> str | None:
    """Why no golden case can reach this site (NOT_DATA), or None."""
    name, _, func = site
    text = _SITE_TEXT.get(site, "")
    for (n, f, fragment), why in NOT_DATA.items():
        if n == name and f == func and fragment in text:
            return why
    return None


def _own_nodes(fn):
    """The nodes of a function's body, not those of functions defined inside it."""
    import ast

    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def error_sites() -> list[tuple[str, int, str]]:
    """(file, line, function) of every SpecError site in reference/*.py."""
    import ast
    from pathlib import Path

    import pgspec.reference as ref

    out = []
    for path in sorted(Path(ref.__file__).parent.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "require":
                continue   # require's own raise is the mechanism: each require(...) call is a site
            for node in _own_nodes(fn):
                call = node.exc if isinstance(node, ast.Raise) else node
                if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                    continue
                if (isinstance(node, ast.Raise) and call.func.id == "SpecError") or \
                        (not isinstance(node, ast.Raise) and call.func.id == "require"):
                    site = (path.name, node.lineno, fn.name)
                    _SITE_TEXT[site] = ast.get_source_segment(source, node) or ""
                    if site not in out:
                        out.append(site)
    return sorted(set(out))


def _site_of(exc, sites) -> tuple[str, int, str] | None:
    """The site whose statement holds the innermost reference frame (other than require) of ``exc``."""
    import os

    import pgspec.reference as ref

    root = os.path.dirname(ref.__file__)
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if os.path.dirname(code.co_filename) == root and code.co_name != "require":
            frames.append((os.path.basename(code.co_filename), tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    for name, line, func in reversed(frames):
        best = [s for s in sites if s[0] == name and s[2] == func and s[1] <= line]
        if best:
            return max(best, key=lambda s: s[1])
    return None


def error_coverage(cases=None) -> tuple[dict, list[str]]:
    """(site -> expected-error case IDs reaching it, problems): a problem is a site no case reaches
    (and not in NOT_DATA), or an expected-error case the reference does not reject."""
    from pgspec.reference import SpecError

    from . import golden
    from .inputs import case_inputs

    cases = golden.load_all() if cases is None else cases
    sites = error_sites()
    hits: dict = {s: [] for s in sites}
    bad = []
    for c in cases:
        if not c.get("expect_error"):
            continue
        try:
            _evaluate(c["formula"], case_inputs(c), c["params"])
        except SpecError as e:
            site = _site_of(e, sites)
            if site is None:
                bad.append(f"{c['id']}: SpecError from no known site: {e}")
            else:
                hits[site].append(c["id"])
            continue
        bad.append(f"{c['id']}: the reference does not reject it")
    for s, ids in hits.items():
        if not ids and not_data(s) is None:
            bad.append(f"reference/{s[0]}:{s[1]} ({s[2]}): no expected-error golden case reaches this SpecError")
    return hits, bad


def error_table(hits: dict) -> str:
    lines = [f"{'site':34s} {'cases':>5s}  example"]
    for (name, line, func), ids in hits.items():
        why = not_data((name, line, func))
        lines.append(f"{name + ':' + str(line) + ' ' + func:34s} {len(ids):5d}  "
                     + (ids[0] if ids else f"(none: {why})" if why else "(none)  <- no case"))
    return "\n".join(lines)


def _report(table_text: str, bad: list, what: str, ok: str) -> bool:
    """Print a table, then its problems (``what``: how to call them) or the ``ok`` line."""
    print(table_text)
    print()
    if bad:
        print(f"{len(bad)} {what}:")
        for p in bad:
            print("  " + p)
        return False
    print(ok)
    return True


def main() -> int:
    rows = coverage()
    if not _report(table(rows), problems(rows), "parameter side(s) without binding coverage",
                   f"every bounding parameter side binds in some case and not in another ({len(rows)} rows)"):
        return 1
    hits, bad = error_coverage()
    print()
    if not _report(error_table(hits), bad, "error-coverage problem(s)",
                   f"every reference SpecError site is reached by an expected-error case ({len(hits)} sites)"):
        return 1
    from . import regimes

    rows = regimes.coverage()
    print()
    if not _report(regimes.table(rows), regimes.problems(rows), "regime gap(s)",
                   f"every regime is witnessed at the formula level (float64 effects by {regimes.MIN_FLOAT64} cases) "
                   f"and, where a recipe composes it, in a loss.* case ({len(rows)} regimes)"):
        return 1
    return 0


def report(table_text: str, bad: list, what: str, ok: str) -> bool:
    """``_report`` for the rooms above (the property-strategy table of ``pgspec golden coverage``)."""
    return _report(table_text, bad, what, ok)


if __name__ == "__main__":
    import sys

    sys.exit(main())
