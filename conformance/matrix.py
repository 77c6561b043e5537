"""The combined conformance matrix: framework x family, from the JSON reports of several runs.

``python -m pgspec.conformance.matrix REPORT.json ... --out docs/conformance/matrix.md`` writes a
Markdown table (pass / deviation / unsupported counts and the worst error ratio per framework and
family, with framework versions, the date and the golden corpus digest).  A test checks that the
committed matrix names the current corpus digest, so a regenerated corpus without a new matrix
is caught.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
from pathlib import Path

from . import golden

DIGEST_LINE = re.compile(r"^- golden corpus digest: `([0-9a-f]{64})`", re.M)


def corpus_digest(directory: Path = golden.GOLDEN_DIR) -> str:
    """sha256 of the MANIFEST's file checksums: it changes whenever any golden file changes."""
    import hashlib

    files = golden.load_manifest(directory)["files"]
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def committed_digest(path: Path) -> str | None:
    m = DIGEST_LINE.search(path.read_text()) if path.exists() else None
    return m.group(1) if m else None


def _cell(results):
    counts = {}
    worst = None
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        ratio = r.get("error_ratio")
        if isinstance(ratio, str):
            ratio = float(ratio)
        if ratio is not None and r["outcome"] == "pass":
            worst = ratio if worst is None else max(worst, ratio)
    parts = [f"{counts.get('pass', 0)} pass"]
    for k in ("deviation", "unsupported", "fail", "error", "stale-deviation"):
        if counts.get(k):
            parts.append(f"{counts[k]} {k}")
    if worst is not None:
        parts.append("worst " + ("inf" if not math.isfinite(worst) else f"{worst:.2g}"))
    return ", ".join(parts)


def render(reports: list[dict], date: str | None = None) -> str:
    date = date or datetime.date.today().isoformat()
    families = sorted({r["family"] for rep in reports for r in rep["results"]})
    columns = []
    for rep in reports:
        for dtype in rep["dtypes"]:
            columns.append((rep, dtype))
    lines = [
        "# Conformance matrix",
        "",
        f"- date: {date}",
        f"- golden corpus digest: `{corpus_digest()}`",
        "",
        "Each cell: outcome counts over the golden cases of that family (or the property checks of that "
        "property) and the worst error ratio (error / bound, below 1 passes) among the passing ones. `unsupported`: the "
        "framework has no counterpart for that formula. Per-framework details and every deviation "
        "with its reason and source link: the framework's own page in this folder.",
        "",
        "| framework | version | device | dtype | " + " | ".join(families) + " |",
        "|---|---|---|---|" + "---|" * len(families),
    ]
    for rep, dtype in columns:
        row = [rep["adapter"], rep["version"], rep["device"], dtype]
        for fam in families:
            rs = [r for r in rep["results"] if r["family"] == fam and r["dtype"] == dtype]
            row.append(_cell(rs) if rs else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgspec.conformance.matrix")
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    reports = [json.loads(p.read_text()) for p in args.reports]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(reports))
    print(f"wrote {args.out} ({len(reports)} reports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
