"""The combined conformance matrix: formula x framework, from the JSON reports of several runs.

``python -m pgspec.conformance.matrix REPORT.json ... --out docs/conformance/matrix.md`` writes a
Markdown table with one verdict per formula and framework (spec/verdicts.md), the frameworks'
versions and the golden corpus digest, and ``verdicts.json`` beside it for the docs' per-formula
pages.  Recorded runs (``docs/conformance/recorded/<name>.json``) are merged in.  A test checks that the
committed matrix names the current corpus digest, so a regenerated corpus without a new matrix
is caught.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ..corpus import golden
from .cells import cell_text, formula_verdicts

# recorded runs of frameworks CI cannot install (their JSON reports, committed): merged into the matrix
RECORDED_DIR = Path(__file__).resolve().parents[2] / "docs" / "conformance" / "recorded"

DIGEST_LINE = re.compile(r"^- golden corpus digest: `([0-9a-f]{64})`", re.M)


def corpus_digest(directory: Path = golden.GOLDEN_DIR) -> str:
    """sha256 of the MANIFEST's file checksums: it changes whenever any golden file changes."""
    import hashlib

    files = golden.load_manifest(directory)["files"]
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


WITHDRAWN_LINE = re.compile(r"^- status: withdrawn ", re.M)


def withdrawn(path: Path) -> bool:
    """A report page that withdraws a recorded run it could not remake (its reason on the page)."""
    return path.exists() and WITHDRAWN_LINE.search(path.read_text()) is not None


def committed_digest(path: Path) -> str | None:
    m = DIGEST_LINE.search(path.read_text()) if path.exists() else None
    return m.group(1) if m else None


def verdicts_json(reports: list[dict]) -> dict:
    """docs/conformance/verdicts.json: every formula's verdict for every framework."""
    frameworks = {}
    formulas: dict = {}
    for rep in reports:
        name = rep["adapter"]
        frameworks[name] = {"version": rep["version"], "recorded": rep.get("recorded")}
        # a recorded run may be committed in compact form: its per-formula verdicts without the rows
        per_formula = formula_verdicts(rep["results"]) if "results" in rep else rep["formulas"]
        for fid, v in per_formula.items():
            formulas.setdefault(fid, {})[name] = v
    return {"corpus": corpus_digest(), "frameworks": frameworks,
            "formulas": {fid: formulas[fid] for fid in sorted(formulas)}}


def render(reports: list[dict]) -> str:
    data = verdicts_json(reports)
    names = list(data["frameworks"])
    lines = [
        "# Conformance matrix",
        "",
        f"- golden corpus digest: `{data['corpus']}`",
        "",
        "One verdict per formula and framework (spec/verdicts.md): `pass` with the worst error ratio (error / "
        "bound; below 1 passes), `bug (n)` and `convention (n)` with the number of (case, dtype) results a "
        "declared root cause explains, `not applicable` (outside what the framework can express), `unsupported` "
        "(the framework lacks the formula). Each cell links to the formula's conformance section (its "
        "definition beside every framework's verdict and declared root causes); each framework's own page "
        "in this folder lists every rule with its reason and source link.",
        "",
        "| framework | version |",
        "|---|---|",
    ]
    for name in names:
        fw = data["frameworks"][name]
        version = fw["version"] + (f", recorded at {fw['recorded']}" if fw.get("recorded") else "")
        lines.append(f"| {name} | {version} |")
    lines += ["", "| formula | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for fid, row in data["formulas"].items():
        cells = []
        for name in names:
            v = row.get(name)
            cells.append(f"[{cell_text(v)}](#conformance-{fid})" if v else "-")
        lines.append(f"| `{fid}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgspec.conformance.matrix")
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the Markdown matrix to write")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the per-formula verdicts as JSON (default: verdicts.json beside --out)")
    args = parser.parse_args(argv)
    reports = [json.loads(p.read_text()) for p in args.reports]
    reports += [json.loads(p.read_text()) for p in sorted(RECORDED_DIR.glob("*.json"))
                if p.stem not in {r["adapter"] for r in reports}]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(reports))
    out_json = args.json or args.out.with_name("verdicts.json")
    out_json.write_text(json.dumps(verdicts_json(reports), indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} and {out_json} ({len(reports)} reports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
