"""How a result is classified once it has run (spec/verdicts.md): the outcomes, validation's own axis,
and the rules of an adapter's declarations applied to a failing or erroring result (which of them
explains it, output by output).  No adapter is called here.
"""

from __future__ import annotations

OUTCOMES = ("pass", "fail", "error", "bug", "convention", "not-applicable", "unsupported", "stale-deviation",
            "rejected", "not-rejected")
BAD_OUTCOMES = ("fail", "error", "stale-deviation")
# the outcomes of an expected-error case (spec/verdicts.md, "Validation"): its own axis, never a rule's
VALIDATION_OUTCOMES = ("rejected", "not-rejected")


def is_validation(r) -> bool:
    """An expected-error case's result that is no crash: validation's own axis (its rejection, or a
    case that did not run)."""
    return r.category == "error" and r.outcome not in BAD_OUTCOMES


def _failed_keys(whole, gathered, present) -> list:
    """The outputs of a case compared at once (``compare.compare_cases``) that hold a failing
    element, in the case's order."""
    if whole.failure is None:
        return []
    joined = gathered[0] if isinstance(gathered, tuple) else None
    if whole.passed is None or joined is None or not hasattr(joined, "starts"):
        return [whole.failure_path[0]]
    keys = [key for key, _, _ in present]
    st = joined.starts
    return [keys[j] for j in range(len(keys)) if not whole.passed[st[j]:st[j + 1]].all()]


def classify(result, rules):
    """Apply the matching rules (spec/verdicts.md, step 5; ``rules``: one rule, a sequence of them in
    file order, or None).  A ``fail`` is explained when every failing output is covered by a matching
    mismatch rule (its ``outputs``; its ``max_ratio`` bounds the result's error ratio): one rule, or
    several root causes at once, each explaining its own outputs.  An ``error`` is explained by the
    first matching error rule whose exception it is (``raises``, ``match``).  An explained result takes
    the kind of its rules (``bug`` if any of them is a bug) and names the first of them.  Anything else
    keeps its outcome, with a message saying what of each matching rule did not hold (a passing case
    records the first matching rule, for the stale check at the end of a run)."""
    if rules is None or result.outcome in ("unsupported", "not-applicable", *VALIDATION_OUTCOMES):
        return result   # nothing ran, or a validation result: no rule explains it nor goes stale by it
    rules = (rules,) if not isinstance(rules, (tuple, list)) else tuple(rules)
    if not rules:
        return result
    if result.outcome not in ("fail", "error"):
        result.declaration = rules[0].summary()
        return result
    failed = getattr(result, "failed_outputs", None)
    ratio = getattr(result, "error_ratio", None)
    exception = getattr(result, "exception", None)
    reasons, used = [], None
    for rule in rules:
        why = rule.does_not_explain(result.outcome, failed_outputs=failed, error_ratio=ratio, exception=exception,
                                    within=getattr(result, "within", None))
        if why is None:
            used = [rule]
            break
        reasons.append(f"{rule.label} of {rule.source} matches this case but {why}")
    if used is None and result.outcome == "fail" and failed:
        used = _covering_rules(rules, failed, ratio, getattr(result, "within", None) or {})
    if used is None:
        result.declaration = rules[0].summary()
        result.message = f"{'; '.join(reasons)}; it stays {result.outcome}:\n{result.message}"
        return result
    result.outcome = "bug" if any(r.kind == "bug" for r in used) else used[0].kind
    first = next(r for r in used if r.kind == result.outcome)
    result.declaration = first.summary()
    others = [r.summary() for r in used if r is not first]
    if others and hasattr(result, "also"):
        result.also = others
    if len(used) > 1:
        result.message = ("two or more root causes: " + "; ".join(
            f"{r.label} ({r.cause}: {', '.join(r.outputs)})" for r in used) + "\n" + result.message)
    return result


def _covering_rules(rules, failed, ratio, within):
    """Mismatch rules that together cover every failing output (each output by the first rule, in
    file order, that names it in its ``outputs`` and covers it: ``Declaration.why_not_covering``), or
    None."""
    used = []
    for key in failed:
        rule = next((r for r in rules if r.expect == "mismatch" and r.outputs
                     and r.why_not_covering(key, ratio, within) is None), None)
        if rule is None:
            return None
        if rule not in used:
            used.append(rule)
    return used
