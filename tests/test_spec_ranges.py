"""The parameter ranges the spec pages state equal the registry's.

Every parameter table of spec/*.md (``| parameter | default | range | ... |``) states a range for each
parameter it names; the registry (``Param`` in pgspec.reference) enforces one. This test reads each
stated range into the registry's terms (kind, least and greatest value with open or closed ends,
choices, null allowed) and requires them equal, so a reader implementing from the text alone
accepts and refuses what the reference accepts and refuses.

A table belongs to the formula whose anchor precedes it (a table before any formula anchor on a
page, such as spec/loss.md's recipe options, belongs to every formula of the family that has the
parameter). What follows a ';' in a range cell, and an ordering between two parameters (``> a``,
``min < max``), are cross-parameter rules, which the expected-error cases check
(conformance/corpus/cases/errors.py). A bound written as a batch quantity (``>= the local count``) is
checked by the formula's function against the batch; the registry's own bound is then that
quantity's least possible value (SYMBOLIC_FLOORS), and a batch-dependent upper bound (``<= T``)
leaves the registry without one.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from pgspec.reference import REGISTRY

SPEC = Path(__file__).resolve().parents[1] / "spec"

# The least value of each batch quantity a spec range uses as a bound (all are counts or lengths of
# a batch that may hold empty rows, so each can be 0).
SYMBOLIC_FLOORS = {
    "the local count": 0,
    "the batch's token count": 0,
    "B": 0,
    "L_i": 0,
    "every n_i": 0,
    "1 + the last unmasked position (0 for an empty row)": 0,
    "the number of its unmasked tokens in this batch": 0,
}
SYMBOLIC_CEILINGS = {"T"}
KEYWORDS = {"real", "reals", "integer", "integers", "list"}


def _number(text):
    try:
        return Fraction(text)
    except ValueError:
        return None


def parse_range(cell: str) -> dict:
    """A spec range cell in the registry's terms: {kind, lo, lo_open, hi, hi_open, nullable, choices}."""
    t = cell.split(";")[0]
    t = re.sub(r"\\text\{([^}]*)\}", r"\1", t.replace("$", ""))
    t = t.replace("\\geq", ">=").replace("\\ge", ">=").replace("\\leq", "<=").replace("\\le", "<=")
    t = re.sub(r"\\(epsilon|tau|delta)\b", "", t)
    nullable = bool(re.search(r"\bor null\b", t))
    t = re.sub(r",?\s*\bor null\b", "", t).strip()
    # an ordering between two parameters: a cross-parameter rule, not this parameter's range
    t = re.sub(r",\s*(?:[A-Za-z_{}]+\s*)?(?:<=|<|>=|>)\s*[A-Za-z_{}]+\s*$", "", t).strip()
    out = {"kind": None, "lo": None, "lo_open": False, "hi": None, "hi_open": False, "nullable": nullable,
           "choices": None}
    if t in ("true or false", "bool"):
        return dict(out, kind="bool")
    if t in ("real", "reals"):
        return dict(out, kind="real")
    items = [w.strip().strip("`\"'") for w in re.split(r",|\bor\b", t)]
    if all(re.fullmatch(r"[A-Za-z_][\w*]*", w) for w in items) and not KEYWORDS & set(items):
        return dict(out, kind="choice", choices=tuple(items))
    m = re.fullmatch(r"list\s*\[([^\]]*)\]\s*of integers\s*(.*)", t)
    if m:
        out["kind"], out["length"], t = "int_list", m.group(1), m.group(2)
        t = re.sub(r"\s*summing to \S+$", "", t).strip()
    else:
        out["kind"] = "int" if re.match(r"integer\b", t) else "real"
        t = re.sub(r"^(integer|real)\s*(in\s*)?", "", t).strip()
    m = re.fullmatch(r"([\[(])\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*([\])])", t)
    if m:
        return dict(out, lo=_number(m.group(2)), lo_open=m.group(1) == "(", hi=_number(m.group(3)),
                    hi_open=m.group(4) == ")")
    t = re.sub(r"^[A-Za-z_{}]+\s*(?=[<>])", "", t)  # a symbol before the comparison (c > 0)
    floors, symbolic_floors = [], []
    for part in re.split(r"\s+and\s+", t) if t else []:
        m = re.fullmatch(r"(>=|>|<=|<)\s*(.+)", part.strip())
        if not m:
            raise ValueError(f"range {cell!r}: cannot read {part!r}")
        op, operand = m.group(1), m.group(2).strip()
        value = _number(operand)
        if op.startswith(">"):
            if value is not None:
                floors.append((value, op == ">"))
            elif operand in SYMBOLIC_FLOORS:
                symbolic_floors.append(SYMBOLIC_FLOORS[operand])
            else:
                raise ValueError(f"range {cell!r}: unknown batch quantity {operand!r} (add it to SYMBOLIC_FLOORS)")
        else:
            if value is not None:
                out["hi"], out["hi_open"] = value, op == "<"
            elif operand not in SYMBOLIC_CEILINGS:
                raise ValueError(f"range {cell!r}: unknown batch quantity {operand!r} (add it to SYMBOLIC_CEILINGS)")
    if floors:
        out["lo"], out["lo_open"] = max(floors)
    elif symbolic_floors:
        out["lo"] = Fraction(max(symbolic_floors))
    return out


def registry_range(p) -> dict:
    """A registry Param in the same terms (its range text decides whether null is accepted)."""
    kind = p.kind
    lo = p.lo
    if kind == "int_list":
        lo = p.floor()
    return {"kind": kind, "lo": None if lo is None else Fraction(lo), "lo_open": bool(p.lo_open) and lo is not None,
            "hi": None if p.hi is None else Fraction(p.hi), "hi_open": bool(p.hi_open) and p.hi is not None,
            "nullable": "or null" in p.range_text(),
            "choices": tuple(p.choices) if kind == "choice" else None,
            **({"length": p.length.strip("[]") if p.depth == 1 else "B,T"} if kind == "int_list" else {})}


def table_rows():
    """(page:line, formula IDs, parameter names, range cell) for every row of every parameter table."""
    rows = []
    for page in sorted(SPEC.glob("*.md")):
        family, formula, header = None, None, None
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            m = re.match(r"^\(([\w.-]+)\)=\s*$", line)
            if m:
                family = family or m.group(1)
                if m.group(1) in REGISTRY:
                    formula = m.group(1)
                continue
            if line.startswith("| parameter |"):
                header = [c.strip() for c in line.strip().strip("|").split("|")]
                continue
            if header and line.startswith("|---"):
                continue
            if header and line.startswith("|"):
                cells = dict(zip(header, (c.strip() for c in line.strip().strip("|").split("|"))))
                names = re.findall(r"`([a-z_0-9]+)`", cells["parameter"])
                ids = [formula] if formula else sorted(f for f in REGISTRY if f.startswith(family + "."))
                rows.append((f"{page.name}:{n}", ids, names, cells["range"]))
                continue
            header = None
    return rows


def split_cell(names, cell):
    """One range per name: a cell naming several parameters gives one range each, comma-separated
    (``$[0, 1]$, $\\ge 0$``), or one range for all of them (``reals or null, min < max``)."""
    if len(names) == 1:
        return [cell]
    parts, depth, cur = [], 0, ""
    for ch in cell.split(";")[0]:
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    parts = [p.strip() for p in parts]
    kept = [p for p in parts if not re.fullmatch(r"\$?[A-Za-z_{}]+\s*(<=|<|\\le|>=|>|\\ge)\s*[A-Za-z_{}]+\$?", p)]
    if len(kept) == len(names):
        return kept
    if len(kept) == 1 or (len(kept) == 2 and re.fullmatch(r"or null", kept[1])):
        return [cell] * len(names)
    raise ValueError(f"cannot split {cell!r} over {names}")


ROWS = table_rows()
STATED = [(where, ids, names, cell) for where, ids, names, cell in ROWS if cell and cell != "see above"]


def test_the_tables_are_found():
    assert len(ROWS) > 120 and len(STATED) > 110


@pytest.mark.parametrize("where,ids,names,cell", STATED, ids=[r[0] for r in STATED])
def test_stated_range_equals_the_registry(where, ids, names, cell):
    for name, text in zip(names, split_cell(names, cell)):
        params = [p for fid in ids for p in REGISTRY[fid].params if p.name == name]
        assert params, f"{where}: no formula of {ids} has a parameter {name!r}"
        stated = parse_range(text)
        for p in params:
            reg = registry_range(p)
            assert stated == reg, f"{where}: {name}: the spec says {text!r}, the registry {p.range_text()!r}"


@pytest.mark.parametrize("cell,expected", [
    ("$> 0$ or null", dict(kind="real", lo=0, lo_open=True, nullable=True)),
    ("$[0, 1]$", dict(kind="real", lo=0, hi=1)),
    ("$(0, 1)$", dict(kind="real", lo=0, lo_open=True, hi=1, hi_open=True)),
    ("integer $\\ge 1$", dict(kind="int", lo=1)),
    ("integer $\\ge$ the local count, or null", dict(kind="int", lo=0, nullable=True)),
    ("real or null, $> a$", dict(kind="real", nullable=True)),
    ("`groups`, `sequences`", dict(kind="choice", choices=("groups", "sequences"))),
    ('"K" or "K*N"', dict(kind="choice", choices=("K", "K*N"))),
    ("list $[M]$ of integers $\\ge 1$ summing to $B$, or null",
     dict(kind="int_list", length="M", lo=1, nullable=True)),
])
def test_parse_range_reads_the_spec_forms(cell, expected):
    base = {"kind": None, "lo": None, "lo_open": False, "hi": None, "hi_open": False, "nullable": False,
            "choices": None}
    want = dict(base, **{k: Fraction(v) if k in ("lo", "hi") else v for k, v in expected.items()})
    assert parse_range(cell) == want


def test_a_wrong_range_is_caught():
    """The comparison fails on a range that differs from the registry's in any one respect."""
    p = next(q for q in REGISTRY["is.token.truncate"].params if q.name == "c_max")
    assert parse_range("$> 0$ or null") == registry_range(p)
    for wrong in ("$\\ge 0$ or null", "$> 0$", "$> 1$ or null", "integer $> 0$ or null", "$(0, 5]$ or null"):
        assert parse_range(wrong) != registry_range(p), wrong
    q = next(q for q in REGISTRY["dist.docs_per_step"].params if q.name == "micro_batch_sizes")
    assert parse_range("list $[M]$ of integers $\\ge 0$ summing to $B$, or null") != registry_range(q)


def as_for_statements():
    """(page:line, formula, parameter names, other formula) for every '**Parameters.** ... as for `X`'
    paragraph: the spec says these parameters are X's (an empty name list: all of X's)."""
    out = []
    for page in sorted(SPEC.glob("*.md")):
        formula = None
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines, 1):
            m = re.match(r"^\(([\w.-]+)\)=\s*$", line)
            if m and m.group(1) in REGISTRY:
                formula = m.group(1)
            if not line.startswith("**Parameters.**") or formula is None:
                continue
            para = " ".join(lines[n - 1:n + 3]).split("\n\n")[0]
            m = re.search(r"(.*?)\b[Aa]s (?:for|in) `([\w.]+)`", para)
            if m and m.group(2) in REGISTRY:
                own = {p.name for p in REGISTRY[formula].params}
                names = [x for x in re.findall(r"`([a-z_0-9]+)`", m.group(1)) if x in own
                         # a parameter the paragraph gives its own range, e.g. "`micro_batch_sizes` (... positive
                         # integers ...)", is not one of X's
                         and not re.search(rf"`{x}` \([^`]*?(integer|real|\\ge|>)", m.group(1))]
                out.append((f"{page.name}:{n}", formula, names, m.group(2)))
    return out


AS_FOR = as_for_statements()


def test_as_for_statements_are_found():
    assert len(AS_FOR) >= 10


@pytest.mark.parametrize("where,formula,names,other", AS_FOR, ids=[a[0] for a in AS_FOR])
def test_parameters_stated_as_another_formulas_have_its_ranges(where, formula, names, other):
    mine = {p.name: p for p in REGISTRY[formula].params}
    theirs = {p.name: p for p in REGISTRY[other].params}
    for name in names or list(theirs):
        assert name in mine and name in theirs, f"{where}: {name!r} is not a parameter of both {formula} and {other}"
        assert registry_range(mine[name]) == registry_range(theirs[name]), (
            f"{where}: {formula}.{name} is {mine[name].range_text()!r}, {other}.{name} {theirs[name].range_text()!r}")
