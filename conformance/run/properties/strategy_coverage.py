"""Do the property examples reach the options (``pgspec golden coverage``, last table)?

Every option of ``DRAWN_OPTIONS`` must be drawn by the fixed property examples (``fixed_examples``
of every property and formula) on both sides of its binding region, and ``prop.clamp`` must cover
every formula with a clamp parameter (``CLAMP_PARAMS``; exclusions with their reason in
``NOT_CLAMP_CHECKED``).  Issue 36 item 4; spec/golden-format.md, "Regime coverage".
"""

from __future__ import annotations

import math

from pgspec.reference import REGISTRY

from ...corpus.coverage import BOUNDS, base_name


# option -> how "both sides" is decided: "clamp" (a log-ratio clamp that binds at an unmasked token in
# some example, and an example where it is null or does not bind), "choice" (every value drawn),
# "cp" (dist.cp_reduce's max_seq_len: null and a value longer than the padded width, in the bshd
# layout, in the cp_rank_sum examples).  Aggregated over every formula that has the option.
DRAWN_OPTIONS = {
    "log_ratio_clamp": "clamp",
    "kl_aggregation": "choice",
    "step_divisor": "choice",
    "advantage_gate": "choice",
    "is_level": "choice",
    "max_seq_len": "cp",
}


def _clamp_binds(fid, ex) -> bool:
    """Does the example's log_ratio_clamp c bind: |log-ratio| > c at an unmasked token (the policy
    log-ratio l - l_old, or l_old - l_mu for the is family)?"""
    c = ex["params"].get("log_ratio_clamp")
    ins = ex["inputs"]
    if c is None:
        return False
    num, den = ("old_logprobs", "sampler_logprobs") if fid.startswith("is.") else ("logprobs", "old_logprobs")
    if num not in ins or den not in ins:
        return False
    for a_row, b_row, m_row in zip(ins[num], ins[den], ins["mask"]):
        for a, b, m in zip(a_row, b_row, m_row):
            if m and math.isfinite(a) and math.isfinite(b) and abs(a - b) > c:
                return True
    return False


def option_coverage():
    """(table rows, problems) for the property examples (``fixed_examples`` of every property and
    formula): each option of DRAWN_OPTIONS on both sides, and every clamped formula in the clamp
    property (``CLAMP_PARAMS``; exclusions with their reason in ``NOT_CLAMP_CHECKED``)."""
    from . import PROPERTIES, fixed_examples
    from .clamp import CLAMP_PARAMS, NOT_CLAMP_CHECKED

    seen: dict = {name: set() for name in DRAWN_OPTIONS}
    where: dict = {name: set() for name in DRAWN_OPTIONS}
    for pid, prop in PROPERTIES.items():
        for fid in prop.formulas:
            declared = {p.name: p for p in REGISTRY[fid].params}
            for ex in fixed_examples(pid, fid):
                for name, how in DRAWN_OPTIONS.items():
                    if how == "cp":
                        cp = ex.get("cp")
                        if cp and cp.get("layout") == "bshd":
                            where[name].add("dist.cp_reduce")
                            seen[name].add("set" if cp.get("max_seq_len") is not None else "null")
                        continue
                    if name not in declared:
                        continue
                    where[name].add(fid)
                    value = ex["params"].get(name, declared[name].default)
                    if how == "clamp":
                        seen[name].add("binds" if _clamp_binds(fid, ex) else "does not bind")
                    else:
                        seen[name].add(value)
    rows, bad = [], []
    for name, how in DRAWN_OPTIONS.items():
        if how == "clamp":
            need = {"binds", "does not bind"}
        elif how == "cp":
            need = {"null", "set"}
        else:
            need = set()
            for fid in where[name]:
                need |= set(next(p.choices for p in REGISTRY[fid].params if p.name == name))
        missing = sorted(map(str, need - seen[name]))
        rows.append((name, how, len(where[name]), sorted(map(str, seen[name])), missing))
        if missing:
            bad.append(f"property examples: option {name} ({len(where[name])} formula(s)) never drawn "
                       f"{'as' if how != 'clamp' else 'where it'} {', '.join(missing)}")
    clamped = sorted(fid for fid in REGISTRY if not fid.startswith(("loss.", "dist.")) and any(
        base_name(p.name) in ("log_ratio_clamp", "log_ratio_min", "log_ratio_max", "output_min", "output_max",
                              "c_min", "c_max") and BOUNDS[base_name(p.name)] for p in REGISTRY[fid].params
        if p.kind == "real"))
    for fid in clamped:
        if fid not in CLAMP_PARAMS and fid not in NOT_CLAMP_CHECKED:
            bad.append(f"prop.clamp: {fid} has a clamp parameter but no parameter set in CLAMP_PARAMS "
                       f"(conformance/run/properties/clamp.py)")
    rows.append(("prop.clamp", "formulas", len(clamped), [f for f in clamped if f in CLAMP_PARAMS],
                 [f for f in clamped if f not in CLAMP_PARAMS and f not in NOT_CLAMP_CHECKED]))
    return rows, bad


def option_table(rows) -> str:
    lines = [f"{'option':18s} {'kind':8s} {'formulas':>8s}  drawn / missing"]
    for name, how, n, seen, missing in rows:
        if name == "prop.clamp":
            lines.append(f"{name:18s} {how:8s} {n:8d}  {len(seen)} in CLAMP_PARAMS"
                         + (f"; missing {', '.join(missing)}" if missing else ""))
            continue
        lines.append(f"{name:18s} {how:8s} {n:8d}  {', '.join(seen)}" + (f"  <- missing {', '.join(missing)}"
                                                                        if missing else ""))
    return "\n".join(lines)
