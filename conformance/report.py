"""Reports of a run: the terminal matrix, and JSON, Markdown and HTML files."""

from __future__ import annotations

import math

from .runner import OUTCOMES


def matrix(summary, dtypes):
    """{family: {dtype: {"counts": {outcome: n}, "worst": float|None}}}."""
    table = {}
    for r in summary.results:
        cell = table.setdefault(r.family, {}).setdefault(r.dtype, {"counts": dict.fromkeys(OUTCOMES, 0), "worst": None})
        cell["counts"][r.outcome] += 1
        if r.error_ratio is not None and r.outcome in ("pass", "fail", "deviation", "stale-deviation"):
            cell["worst"] = r.error_ratio if cell["worst"] is None else max(cell["worst"], r.error_ratio)
    return table


def cell_text(cell) -> str:
    c = cell["counts"]
    parts = [f"{c['pass']} pass"]
    for k in ("fail", "error", "deviation", "stale-deviation", "unsupported"):
        if c[k]:
            parts.append(f"{c[k]} {k}")
    worst = cell["worst"]
    if worst is not None:
        parts.append("worst " + ("inf" if not math.isfinite(worst) else f"{worst:.2g}"))
    return ", ".join(parts)


def print_matrix(summary, adapter, device, dtypes):
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"pgspec conformance: {adapter.name} ({adapter.version}) on {device}; "
                        "worst = largest error/bound")
    table.add_column("family")
    for d in dtypes:
        table.add_column(d)
    m = matrix(summary, dtypes)
    for family in sorted(m):
        row = [family]
        for d in dtypes:
            cell = m[family].get(d)
            if cell is None:
                row.append("-")
                continue
            text = cell_text(cell)
            bad = cell["counts"]["fail"] + cell["counts"]["error"] + cell["counts"]["stale-deviation"]
            row.append(f"[red]{text}[/red]" if bad else f"[green]{text}[/green]")
        table.add_row(*row)
    console.print(table)
    bad = [r for r in summary.results if r.outcome in ("fail", "error", "stale-deviation")]
    for r in bad[:20]:
        console.print(f"[red]{r.outcome}[/red] {r.case_id} [{r.dtype}]: {r.message.strip().splitlines()[-1] if r.message else ''}")
    if len(bad) > 20:
        console.print(f"... and {len(bad) - 20} more (see --report json:PATH)")
    total = {k: sum(1 for r in summary.results if r.outcome == k) for k in OUTCOMES}
    console.print(", ".join(f"{v} {k}" for k, v in total.items() if v) or "no cases")


def write(kind, path, summary, adapter, device, dtypes):
    raise NotImplementedError
