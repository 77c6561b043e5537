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
        if r.error_ratio is not None and r.outcome in ("pass", "fail", "stale-deviation"):
            cell["worst"] = r.error_ratio if cell["worst"] is None else max(cell["worst"], r.error_ratio)
    return table


def cell_text(cell) -> str:
    c = cell["counts"]
    parts = [f"{c['pass']} pass"]
    for k in ("fail", "error", "deviation", "stale-deviation", "unsupported", "not-applicable"):
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
                        "worst = largest error/bound of the passing and failing cases")
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


def _header(adapter, device, dtypes):
    import datetime

    from .golden import load_manifest

    manifest = load_manifest()
    return {
        "adapter": adapter.name,
        "framework": adapter.framework,
        "version": adapter.version,
        "device": device,
        "dtypes": list(dtypes),
        "date": datetime.date.today().isoformat(),
        "golden": {"pgspec": manifest["pgspec"], "mpmath": manifest["mpmath"], "dps": manifest["dps"]},
    }


def to_json(summary, adapter, device, dtypes) -> dict:
    m = matrix(summary, dtypes)
    return {
        **_header(adapter, device, dtypes),
        "totals": {k: sum(1 for r in summary.results if r.outcome == k) for k in OUTCOMES},
        "matrix": {fam: {d: {"counts": c["counts"], "worst_error_ratio": c["worst"]} for d, c in row.items()}
                   for fam, row in m.items()},
        "results": [r.to_json() for r in summary.results],
    }


def to_markdown(summary, adapter, device, dtypes) -> str:
    h = _header(adapter, device, dtypes)
    m = matrix(summary, dtypes)
    lines = [
        f"# pgspec conformance: {h['adapter']}",
        "",
        f"- framework: {h['framework']} ({h['version']})",
        f"- device: {device}; dtypes: {', '.join(dtypes)}; date: {h['date']}",
        f"- golden corpus: pgspec {h['golden']['pgspec']}, mpmath {h['golden']['mpmath']}, dps {h['golden']['dps']}",
        "",
        "Each cell: outcome counts and the worst error ratio (error / bound; below 1 passes) of the passing and "
        "failing cases (declared deviations are listed below with their reasons).",
        "",
        "| family | " + " | ".join(dtypes) + " |",
        "|---|" + "---|" * len(dtypes),
    ]
    for fam in sorted(m):
        cells = [cell_text(m[fam][d]) if d in m[fam] else "-" for d in dtypes]
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    lines.append("")
    bad = [r for r in summary.results if r.outcome in ("fail", "error", "stale-deviation")]
    if bad:
        lines += ["## Failures, errors and stale deviations", ""]
        for r in bad:
            lines.append(f"### `{r.case_id}` ({r.dtype}): {r.outcome}")
            lines.append("")
            if r.deviation:
                lines.append(f"Declared {r.deviation['kind']}: {r.deviation['reason']} ({r.deviation['link']})")
                lines.append("")
            if r.message:
                lines += ["```", r.message.strip(), "```", ""]
            lines += ["Reproduce:", "", "```python", r.repro.strip(), "```", ""]
    deviations = [r for r in summary.results if r.outcome == "deviation"]
    if deviations:
        lines += ["## Declared deviations that reproduce", "",
                  "| case | dtype | kind | reason | source |", "|---|---|---|---|---|"]
        for r in deviations:
            d = r.deviation
            reason = d["reason"].replace("|", "\\|")
            source = f"[link]({d['link']})" if d["link"].startswith(("http://", "https://")) else f"`{d['link']}`"
            lines.append(f"| `{r.case_id}` | {r.dtype} | {d['kind']} | {reason} | {source} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _plot_png(summary, dtypes) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = matrix(summary, dtypes)
    families = sorted(m)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(families)), 4))
    width = 0.8 / max(1, len(dtypes))
    for k, d in enumerate(dtypes):
        ys = []
        for fam in families:
            worst = m[fam].get(d, {}).get("worst")
            ys.append(min(worst, 1e3) if worst is not None and math.isfinite(worst) else (1e3 if worst else 0))
        xs = [i + (k - (len(dtypes) - 1) / 2) * width for i in range(len(families))]
        ax.bar(xs, [max(y, 1e-6) for y in ys], width, label=d)
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1, label="bound (error ratio 1)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(families)), families, rotation=30, ha="right")
    ax.set_ylabel("worst error ratio (error / bound)")
    ax.set_title("worst error ratio per family and dtype")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def to_html(summary, adapter, device, dtypes) -> str:
    import base64
    import html

    h = _header(adapter, device, dtypes)
    m = matrix(summary, dtypes)
    png = base64.b64encode(_plot_png(summary, dtypes)).decode()
    rows = []
    for fam in sorted(m):
        cells = []
        for d in dtypes:
            cell = m[fam].get(d)
            if cell is None:
                cells.append("<td>-</td>")
                continue
            c = cell["counts"]
            bad = c["fail"] + c["error"] + c["stale-deviation"]
            cls = "bad" if bad else ("dev" if c["deviation"] else "ok")
            cells.append(f'<td class="{cls}">{html.escape(cell_text(cell))}</td>')
        rows.append(f"<tr><th>{html.escape(fam)}</th>{''.join(cells)}</tr>")
    notable = [r for r in summary.results if r.outcome not in ("pass", "unsupported")]
    details = []
    for r in notable:
        dev = ""
        if r.deviation:
            dev = (f"<p>Declared {html.escape(r.deviation['kind'])}: {html.escape(r.deviation['reason'])} "
                   f'(<a href="{html.escape(r.deviation["link"])}">source</a>)</p>')
        details.append(
            f"<h3><code>{html.escape(r.case_id)}</code> ({r.dtype}): {r.outcome}</h3>{dev}"
            f"<pre>{html.escape(r.message.strip())}</pre><p>Reproduce:</p><pre>{html.escape(r.repro.strip())}</pre>"
        )
    totals = ", ".join(f"{sum(1 for r in summary.results if r.outcome == k)} {k}" for k in OUTCOMES)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgspec conformance: {html.escape(h['adapter'])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 70em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #999; padding: 0.3em 0.7em; text-align: left; }}
td.ok {{ background: #dff0d8; }} td.bad {{ background: #f2dede; }} td.dev {{ background: #fcf8e3; }}
pre {{ background: #f6f6f6; padding: 0.6em; overflow-x: auto; }}
</style></head><body>
<h1>pgspec conformance: {html.escape(h['adapter'])}</h1>
<p>{html.escape(h['framework'])} ({html.escape(h['version'])}) on {html.escape(device)}, {h['date']};
golden corpus pgspec {html.escape(h['golden']['pgspec'])}, mpmath {html.escape(h['golden']['mpmath'])}, dps {h['golden']['dps']}.</p>
<p>Totals: {html.escape(totals)}. Each cell gives outcome counts and the worst error ratio (error / bound; below 1 passes).</p>
<table><tr><th>family</th>{''.join(f'<th>{html.escape(d)}</th>' for d in dtypes)}</tr>
{''.join(rows)}
</table>
<h2>Error ratio per family and dtype</h2>
<img alt="worst error ratio per family and dtype" src="data:image/png;base64,{png}">
<h2>Failures, errors and deviations</h2>
{''.join(details) or '<p>None.</p>'}
</body></html>
"""


def write(kind, path, summary, adapter, device, dtypes):
    import json
    from pathlib import Path

    if kind == "json":
        text = json.dumps(to_json(summary, adapter, device, dtypes), indent=1) + "\n"
    elif kind == "md":
        text = to_markdown(summary, adapter, device, dtypes)
    elif kind == "html":
        text = to_html(summary, adapter, device, dtypes)
    else:
        raise ValueError(f"report kind must be json, md or html, got {kind!r}")
    write_atomic(Path(path), text)


def write_atomic(out, text: str) -> None:
    """Write ``text`` to a temporary file beside ``out``, then rename it over ``out``: a report is
    either wholly written or not at all (a full disk leaves the previous file, if any, intact)."""
    import os
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
