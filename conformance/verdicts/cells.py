"""Per-formula verdicts (spec/verdicts.md, "Verdicts per formula"), from result rows as JSON dicts.

One function decides a formula's verdict for a framework; the terminal table, the Markdown and
HTML reports, the combined matrix and ``docs/conformance/verdicts.json`` all use it.
"""

from __future__ import annotations

import math

# the first outcome present (in this order) decides the verdict
PRECEDENCE = ("error", "fail", "stale-deviation", "bug", "convention", "pass", "not-applicable", "unsupported")
VERDICT_NAME = {"stale-deviation": "stale"}
COMPARED = ("pass", "fail", "bug", "convention", "stale-deviation")
DECLARED = ("bug", "convention")


def _ratio(r):
    x = r.get("error_ratio")
    return float(x) if isinstance(x, str) else x


def formula_verdicts(results: list[dict]) -> dict:
    """{formula: {"verdict", "counts", "worst_ratio", "declared_worst_ratio", "reason", "rules"}} over the
    result rows: ``worst_ratio`` over the results judged as they are (pass, fail, stale), as the
    reports' "worst" column; ``declared_worst_ratio`` over those a declared rule explains (known bugs,
    conventions), apart, so that a declared deviation never reads as the formula's accuracy."""
    out: dict = {}
    for r in results:
        v = out.setdefault(r["formula"], {"counts": {}, "worst_ratio": None, "declared_worst_ratio": None,
                                          "reason": "", "rules": {}, "validation": {}})
        if r.get("category") == "error" and r["outcome"] not in ("fail", "error", "stale-deviation"):
            # expected-error cases: whether the framework rejects what the spec rejects is its own axis
            # (spec/verdicts.md, "Validation"), never part of the numeric verdict
            v["validation"][r["outcome"]] = v["validation"].get(r["outcome"], 0) + 1
            continue
        v["counts"][r["outcome"]] = v["counts"].get(r["outcome"], 0) + 1
        ratio = _ratio(r)
        if ratio is not None and r["outcome"] in COMPARED:
            key = "declared_worst_ratio" if r["outcome"] in DECLARED else "worst_ratio"
            v[key] = ratio if v[key] is None else max(v[key], ratio)
        d = r.get("declaration")
        if d and r["outcome"] in ("bug", "convention", "stale-deviation"):
            key = f"{d['source']} {d['declaration']}"
            rule = v["rules"].setdefault(key, {"kind": d["kind"], "reason": d["reason"], "link": d["link"],
                                               "declaration": d["declaration"], "cases": 0})
            rule["cases"] += 1
        if r["outcome"] in ("unsupported", "not-applicable") and not v["reason"]:
            v["reason"] = r.get("message", "")
    for v in out.values():
        v["verdict"] = next((VERDICT_NAME.get(k, k) for k in PRECEDENCE if v["counts"].get(k)), "not-applicable")
        v["rules"] = sorted(v["rules"].values(), key=lambda x: (-x["cases"], x["declaration"]))
        if v["verdict"] not in ("unsupported", "not-applicable"):
            v["reason"] = ""
    return dict(sorted(out.items()))


def ratio_text(x) -> str:
    if x is None:
        return ""
    return "inf" if not math.isfinite(x) else f"{x:.2g}"


def validation_text(v: dict) -> str:
    """How the expected-error cases of a formula went: 'rejects 9 of 9', 'rejects 0 of 9'; '-' when
    none was run.  A run recorded before rejections were attributed to the framework (its expected-error
    cases "pass" by any exception) says so instead of a count."""
    c = v.get("validation") or {}
    if any(k in c for k in ("pass", "bug", "convention")):
        return "not attributed (recorded before pgspec-verdicts/2)"
    total = c.get("rejected", 0) + c.get("not-rejected", 0)
    if not total:
        return "-"
    return f"rejects {c.get('rejected', 0)} of {total}"


def cell_text(v: dict) -> str:
    """A short cell: 'pass 0.31', 'bug (12)', 'convention (3)', 'not applicable', 'FAIL (2)' ..."""
    verdict = v["verdict"]
    c = v["counts"]
    if verdict == "pass":
        return f"pass {ratio_text(v['worst_ratio'])}".strip()
    if verdict in ("bug", "convention"):
        return f"{verdict} ({c[verdict]})"
    if verdict == "stale":
        return f"STALE ({c['stale-deviation']})"
    if verdict in ("fail", "error"):
        return f"{verdict.upper()} ({c[verdict]})"
    return verdict.replace("-", " ")
