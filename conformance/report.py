"""Reports of a run: the terminal table, and JSON, Markdown and HTML files.

The primary view is per formula (spec/verdicts.md): one verdict per formula, with the worst error
ratio.  Family x dtype counts, the rules grouped by root cause with the number of cases each
matched, and the formulas the adapter does not implement follow on the framework's page.  Reports
carry no date, so a report of an unchanged run regenerates byte-identically.
"""

from __future__ import annotations

import math
import re

from .run.runner import OUTCOMES
from .verdicts.cells import cell_text as verdict_text
from .verdicts.cells import formula_verdicts, ratio_text, validation_text


# Where a result's error ratio goes: "worst", the results judged as they are (pass, fail, stale), or
# "declared", those a declaration explains (bug, convention), so that a declared deviation is never
# shown as a failure; the chart, the HTML and Markdown tables and the terminal's "pass <worst>" agree.
WORST_OF = {"pass": "worst", "fail": "worst", "stale-deviation": "worst", "bug": "declared", "convention": "declared"}


def _fold_worst(cell: dict, r) -> None:
    key = WORST_OF.get(r.outcome)
    if r.error_ratio is not None and key is not None:
        cell[key] = r.error_ratio if cell[key] is None else max(cell[key], r.error_ratio)


def matrix(summary, dtypes):
    """{family: {dtype: {"counts": {outcome: n}, "worst": float|None, "declared": float|None}}}: the
    worst error ratio of the results judged as they are (pass, fail, stale) and, apart, of those a
    declaration explains (bug, convention), so a declared deviation is never drawn as a failure."""
    table = {}
    for r in summary.results:
        cell = table.setdefault(r.family, {}).setdefault(r.dtype, {"counts": dict.fromkeys(OUTCOMES, 0), "worst": None,
                                                                  "declared": None})
        cell["counts"][r.outcome] += 1
        _fold_worst(cell, r)
    return table


def formula_worst(summary) -> dict:
    """{formula: {"worst": float|None, "declared": float|None}}: per formula, the worst error ratio of
    its results judged as they are and, apart, of those a declaration explains (as ``matrix``)."""
    out: dict = {}
    for r in summary.results:
        _fold_worst(out.setdefault(r.formula, {"worst": None, "declared": None}), r)
    return out


def cell_text(cell) -> str:
    c = cell["counts"]
    parts = [f"{c['pass']} pass"]
    for k in ("fail", "error", "bug", "convention", "stale-deviation", "not-applicable", "unsupported"):
        if c[k]:
            parts.append(f"{c[k]} {k}")
    if c["rejected"] or c["not-rejected"]:
        parts.append(f"rejects {c['rejected']} of {c['rejected'] + c['not-rejected']} invalid")
    worst = cell["worst"]
    if worst is not None:
        parts.append("worst " + ratio_text(worst))
    return ", ".join(parts)


def _rows(summary):
    return [r.to_json() for r in summary.results]


def _verdict_rows(summary):
    """The fields of each result that ``formula_verdicts`` reads, as it reads them in ``_rows`` (read
    only: nothing is copied; a non-finite ratio stays a float, which is what ``_rows``' string of it
    reads back as)."""
    return [{"formula": r.formula, "category": r.category, "outcome": r.outcome, "error_ratio": r.error_ratio,
             "declaration": r.declaration, "message": r.message} for r in summary.results]


def _bad(summary):
    return [r for r in summary.results if r.outcome in ("fail", "error", "stale-deviation")]


def failure_line(r) -> str:
    last = r.message.strip().splitlines()[-1] if r.message else ""
    return f"{r.outcome} {r.case_id} ({r.dtype}): {last}"


# the columns of the run's table: each sums, over the rows, to its count in the run's last line
TABLE_COLUMNS = ("pass", "fail", "error", "stale-deviation", "bug", "convention", "not-applicable")
COLUMN_NAMES = {"error": "err", "stale-deviation": "stale", "convention": "conv", "not-applicable": "n/a"}


def formula_table(summary) -> tuple[dict, list]:
    """The rows of the run's tables, terminal and HTML: ({formula: verdict} of the formulas the adapter
    ran or declared, [the formulas it does not implement at all], shown in one line instead of rows)."""
    verdicts = formula_verdicts(_verdict_rows(summary))
    lacking = [fid for fid, v in verdicts.items()
               if v["verdict"] == "unsupported" and not any(v["counts"].get(k) for k in TABLE_COLUMNS)]
    return {fid: v for fid, v in verdicts.items() if fid not in lacking}, lacking


def rejects_text(v: dict) -> str:
    """A formula's validation as a table cell: 'R/E' (rejected of run), '' when none was run."""
    val = v.get("validation") or {}
    run = val.get("rejected", 0) + val.get("not-rejected", 0)
    return f"{val.get('rejected', 0)}/{run}" if run else ""


def print_matrix(summary, adapter, device, dtypes):
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"pgspec conformance: {escape(adapter.name)} ({escape(adapter.version)}) on {device}, "
                        f"{', '.join(dtypes)}; worst = largest error/bound of the compared cases")
    shown, unsupported = formula_table(summary)
    # the columns the run has (pass always): an empty column is left out, so the table fits a terminal
    columns = [k for k in TABLE_COLUMNS if k == "pass" or any(v["counts"].get(k) for v in shown.values())]
    table.add_column("formula", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for k in columns:
        table.add_column(COLUMN_NAMES.get(k, k), justify="right", no_wrap=True)
    table.add_column("rejects", justify="right", no_wrap=True)
    for fid, v in shown.items():
        c = v["counts"]
        text = verdict_text(v)
        style = "red" if v["verdict"] in ("fail", "error", "stale") else (
            "yellow" if v["verdict"] in ("bug", "convention") else "green" if v["verdict"] == "pass" else "dim")
        table.add_row(escape(fid), f"[{style}]{escape(text)}[/{style}]",
                      *[str(c.get(k, 0) or "") for k in columns], rejects_text(v))
    console.print(table)
    if unsupported:
        console.print(escape(f"not implemented by {adapter.name} ({len(unsupported)} formulas): "
                             f"{', '.join(unsupported)}"), highlight=False, soft_wrap=True, style="dim")
    bad = _bad(summary)
    from .run.runner import rerun_command

    for r in bad[:20]:
        console.print(escape(failure_line(r)), style="red", highlight=False, soft_wrap=True)
        console.print(escape(f"  rerun: {rerun_command(r.adapter, r.case_id, r.dtype, r.device)}"), style="dim",
                      highlight=False, soft_wrap=True)
    if len(bad) > 20:
        console.print(f"... and {len(bad) - 20} more (see --report json:PATH)")
    console.print(summary.summary_line(adapter.name), highlight=False, soft_wrap=True)


def _header(adapter, device, dtypes):
    from .corpus.golden import load_manifest
    from .verdicts.matrix import corpus_digest

    manifest = load_manifest()
    return {
        "adapter": adapter.name,
        "framework": adapter.framework,
        "version": adapter.version,
        "device": device,
        "dtypes": list(dtypes),
        "golden": {"pgspec": manifest["pgspec"], "mpmath": manifest["mpmath"], "dps": manifest["dps"],
                   "digest": corpus_digest()},
    }


def to_json(summary, adapter, device, dtypes) -> dict:
    m = matrix(summary, dtypes)
    return {
        **_header(adapter, device, dtypes),
        "summary": summary.summary_line(adapter.name),
        "totals": {k: sum(1 for r in summary.results if r.outcome == k) for k in OUTCOMES},
        "formulas": formula_verdicts(_rows(summary)),
        "matrix": {fam: {d: {"counts": c["counts"], "worst_error_ratio": c["worst"]} for d, c in row.items()}
                   for fam, row in m.items()},
        "results": _rows(summary),
    }


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(link: str) -> str:
    return f"[source]({link})" if link.startswith(("http://", "https://")) else f"`{link}`"


def _declaration_tables(summary, adapter) -> list[str]:
    from .run.runner import declarations_of

    decl = declarations_of(adapter)
    matched: dict = {}
    for r in summary.results:
        for d in [r.declaration, *(r.also or [])]:
            if d:
                key = (d["source"], d["declaration"])
                matched.setdefault(key, {}).setdefault(r.outcome, 0)
                matched[key][r.outcome] += 1
    lines = []
    rules = decl.rules
    if rules:
        lines += ["## Deviations, by root cause", "",
                  "Each rule of the adapter's declarations file, with the results it classified in this run "
                  "(spec/verdicts.md).", "",
                  "| rule | kind | IDs | when | dtypes | absorbs | cases | reason | source |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for d in rules:
            m = matched.get((d.source, d.label), {})
            n = sum(v for k, v in m.items() if k in (d.kind, "stale-deviation"))
            stale = " (stale)" if m.get("stale-deviation") else ""
            when = ", ".join([f"{k} in {dom.to_json()}" for k, dom in d.params] + list(d.inputs)
                             + [f"float64: {p}" for p in d.inputs_float64]) or "-"
            lines.append(f"| {d.position} | {d.kind}{' (error)' if d.expect == 'error' else ''} | "
                         f"{_md(', '.join(f'`{i}`' for i in d.ids))} | {_md(when)} | {', '.join(d.dtypes) or 'all'} | "
                         f"{_md(absorbs_text(d))} | {n}{stale} | {_md(d.reason)} | {_link(d.link)} |")
        lines.append("")
    if decl.capabilities:
        lines += ["## Capabilities (cases outside them are not applicable)", "",
                  "| formulas | domain | cases not applicable | reason | source |", "|---|---|---|---|---|"]
        for d in decl.capabilities:
            n = matched.get((d.source, d.label), {}).get("not-applicable", 0)
            dom = ", ".join([f"{k} in {v.to_json()}" for k, v in d.params] + list(d.inputs))
            lines.append(f"| {_md(', '.join(f'`{i}`' for i in d.ids))} | {_md(dom)} | {n} | {_md(d.reason)} | "
                         f"{_link(d.link)} |")
        lines.append("")
    unsupported = sorted({r.formula: r for r in summary.results if r.outcome == "unsupported"
                          and "does not support" not in r.message}.items())
    if unsupported:
        lines += ["## Formulas not implemented", "", "| formula | why |", "|---|---|"]
        for fid, r in unsupported:
            why = _md(r.message)
            if r.declaration:
                why += " " + _link(r.declaration["link"])
            lines.append(f"| `{fid}` | {why} |")
        lines.append("")
    return lines


def absorbs_text(d) -> str:
    """What a rule absorbs (spec/verdicts.md, "Rules"): its outputs and error bound, or its exception."""
    if d.expect == "error":
        return f"raises {d.raises}" + (f" matching `{d.match}`" if d.match else "")
    text = ", ".join(f"`{o}`" for o in d.outputs) if d.outputs else "any output"
    text += f", ratio <= {d.max_ratio:g}" if d.max_ratio is not None else ""
    return text + (f", within the {d.within} tolerance" if d.within else "")


# what sets two runs of one adapter apart, as its version string names it: a PR head
# ("... (PR #2060 head 0baefb54, blobs verified)") or a variant after the checkout ("...); packed layout (...")
_VARIANTS = (re.compile(r"\((PR #\d+) head\b"), re.compile(r"\); ([^;()]+?) \("))


def title(h) -> str:
    """A report's title: the adapter and, where its version names one, the variant run (the docs'
    sidebar showed "pgspec conformance: slime" for main and two PR heads alike)."""
    variants = [m.group(1) for pattern in _VARIANTS if (m := pattern.search(h["version"]))]
    return f"pgspec conformance: {h['adapter']}" + (f" ({', '.join(variants)})" if variants else "")


def to_markdown(summary, adapter, device, dtypes) -> str:
    h = _header(adapter, device, dtypes)
    m = matrix(summary, dtypes)
    verdicts = formula_verdicts(_rows(summary))
    lines = [
        f"# {title(h)}",
        "",
        f"- framework: {h['framework']} ({h['version']})",
        f"- device: {device}; dtypes: {', '.join(dtypes)}",
        f"- golden corpus: pgspec {h['golden']['pgspec']}, mpmath {h['golden']['mpmath']}, dps {h['golden']['dps']}",
        f"- golden corpus digest: `{h['golden']['digest']}`",
        "",
        f"**{summary.summary_line(adapter.name)}**",
        "",
        "## Verdict per formula",
        "",
        "Verdicts as spec/verdicts.md defines them, over all dtypes and the property checks of the formula; "
        "worst: the largest error ratio (error / bound; below 1 passes) of the results judged as they are "
        "(pass, fail, stale); declared worst, apart: that of the results a declared rule explains (known bugs, "
        "conventions).",
        "",
        "| formula | verdict | pass | bug | convention | not applicable | worst | declared worst | validation |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worst = formula_worst(summary)
    for fid, v in verdicts.items():
        c = v["counts"]
        w = worst.get(fid, {"worst": None, "declared": None})
        lines.append(f"| `{fid}` | {verdict_text(v)} | {c.get('pass', 0)} | {c.get('bug', 0)} | "
                     f"{c.get('convention', 0)} | {c.get('not-applicable', 0)} | {ratio_text(w['worst'])} | "
                     f"{ratio_text(w['declared'])} | {validation_text(v)} |")
    lines.append("")
    lines += _declaration_tables(summary, adapter)
    lines += ["## Counts per family and dtype", "",
              "| family | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for fam in sorted(m):
        cells = [cell_text(m[fam][d]) if d in m[fam] else "-" for d in dtypes]
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    lines.append("")
    bad = _bad(summary)
    if bad:
        lines += ["## Failures, errors and stale deviations", ""]
        for r in bad:
            lines.append(f"### `{r.case_id}` ({r.dtype}): {r.outcome}")
            lines.append("")
            if r.declaration:
                d = r.declaration
                lines.append(f"Declared {d['kind']} ({d['declaration']}): {d['reason']} ({d['link']})")
                lines.append("")
            if r.message:
                lines += ["```", r.message.strip(), "```", ""]
            lines += ["Reproduce:", "", "```python", r.repro.strip(), "```", ""]
    return "\n".join(lines) + "\n"


CHART_CAP = 1e3      # the chart's axis stops here; larger ratios are drawn as overflow bars
CHART_FLOOR = 1e-6   # and starts here (a ratio of exactly 0, or below, sits on the floor)


def chart_bars(m, dtypes) -> list[dict]:
    """The bars of the HTML report's chart: one per (family, dtype) that has a worst error ratio.

    ``kind`` is "ok" (ratio <= 1), "over" (1 < ratio <= CHART_CAP), "overflow" (finite and beyond
    the axis) or "infinite"; overflow and infinite bars reach into the band above the axis and
    carry their value as a label, so 2e15 and inf never look like 1e3."""
    bars = []
    families = sorted(m)
    for i, fam in enumerate(families):
        for k, d in enumerate(dtypes):
            worst = m[fam].get(d, {}).get("worst")
            if worst is None:
                continue
            if not math.isfinite(worst):
                kind, height, label = "infinite", CHART_CAP * 30, "nan" if math.isnan(worst) else "inf"
            elif worst > CHART_CAP:
                kind, height, label = "overflow", CHART_CAP * 10, f"{worst:.1e}"
            else:
                kind, height = ("ok" if worst <= 1 else "over"), max(worst, CHART_FLOOR)
                label = "0" if worst == 0 else ""
            bars.append({"family": fam, "index": i, "dtype": d, "slot": k, "worst": worst, "kind": kind,
                         "height": height, "label": label})
    return bars


def declared_marks(m, dtypes) -> list[dict]:
    """The chart's marks for declared deviations (bug, convention): one per (family, dtype) with a
    declared worst ratio, drawn as a grey diamond apart from the bars (capped at the axis, its value
    printed when beyond it), so a run that exits 0 shows no failure bar for them."""
    marks = []
    for i, fam in enumerate(sorted(m)):
        for k, d in enumerate(dtypes):
            w = m[fam].get(d, {}).get("declared")
            if w is None:
                continue
            beyond = not math.isfinite(w) or w > CHART_CAP
            label = ("nan" if math.isnan(w) else "inf" if not math.isfinite(w) else f"{w:.1e}") if beyond else ""
            marks.append({"family": fam, "index": i, "dtype": d, "slot": k, "declared": w,
                          "height": CHART_CAP if beyond else max(w, CHART_FLOOR), "label": label})
    return marks


def _plot_png(summary, dtypes) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    m = matrix(summary, dtypes)
    families = sorted(m)
    bars = chart_bars(m, dtypes)
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(families) + 3), 4.6))
    width = 0.8 / max(1, len(dtypes))
    colors = plt.get_cmap("tab10").colors
    for b in bars:
        x = b["index"] + (b["slot"] - (len(dtypes) - 1) / 2) * width
        color = colors[b["slot"] % len(colors)]
        if b["kind"] in ("overflow", "infinite"):
            # drawn to the axis cap in the dtype's colour, then hatched through the overflow band
            ax.bar(x, CHART_CAP - CHART_FLOOR, width, bottom=CHART_FLOOR, color=color, edgecolor="black", linewidth=0.6)
            ax.bar(x, b["height"] - CHART_CAP, width, bottom=CHART_CAP, color="white", edgecolor="#b00020",
                   hatch="////" if b["kind"] == "overflow" else "xxxx", linewidth=1.0)
        else:
            ax.bar(x, b["height"] - CHART_FLOOR, width, bottom=CHART_FLOOR, color=color,
                   edgecolor="#b00020" if b["kind"] == "over" else "none", linewidth=1.0)
        if b["label"]:
            ax.annotate(b["label"], (x, b["height"]), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, rotation=90 if len(b["label"]) > 3 else 0,
                        color="#b00020" if b["kind"] in ("overflow", "infinite") else "black")
    for mk in declared_marks(m, dtypes):
        x = mk["index"] + (mk["slot"] - (len(dtypes) - 1) / 2) * width
        ax.plot([x], [mk["height"]], marker="D", markersize=6, color="#777777", markeredgecolor="black",
                linestyle="none", zorder=3)
        if mk["label"]:
            ax.annotate(mk["label"], (x, mk["height"]), xytext=(0, -10), textcoords="offset points", ha="center",
                        va="top", fontsize=6, color="#555555")
    ax.axhspan(CHART_CAP, CHART_CAP * 1000, color="#fde2e4", zorder=0)
    ax.axhline(CHART_CAP, color="#b00020", linestyle=":", linewidth=1)
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.set_ylim(CHART_FLOOR, CHART_CAP * 1000)
    ax.set_xlim(-0.6, max(len(families), 1) - 0.4)
    ax.set_xticks(range(len(families)), families, rotation=30, ha="right")
    ax.set_ylabel("worst error ratio (error / bound)")
    ax.set_title("worst error ratio per family and dtype (below the dashed line passes)")
    handles = [Patch(facecolor=colors[k % len(colors)], label=d) for k, d in enumerate(dtypes)]
    handles += [
        plt.Line2D([], [], color="red", linestyle="--", label="bound (error ratio 1)"),
        Patch(facecolor="white", edgecolor="#b00020", hatch="////", label=f"beyond {CHART_CAP:.0e} (value printed)"),
        Patch(facecolor="white", edgecolor="#b00020", hatch="xxxx", label="infinite (inf or NaN)"),
        plt.Line2D([], [], marker="D", color="#777777", markeredgecolor="black", linestyle="none",
                   label="declared bug / convention (worst ratio)"),
    ]
    # the legend sits outside the axes, right of the bars, so it never covers one
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def to_html(summary, adapter, device, dtypes) -> str:
    import base64
    import html

    h = _header(adapter, device, dtypes)
    png = base64.b64encode(_plot_png(summary, dtypes)).decode()
    shown, lacking = formula_table(summary)
    worst = formula_worst(summary)
    rows = []
    for fid, v in shown.items():
        c = v["counts"]
        cls = {"fail": "bad", "error": "bad", "stale": "bad", "bug": "dev", "convention": "dev",
               "pass": "ok"}.get(v["verdict"], "na")
        cells = "".join(f"<td>{c.get(k, 0) or ''}</td>" for k in TABLE_COLUMNS)
        w = worst.get(fid, {"worst": None, "declared": None})
        declared = ratio_text(w["declared"])
        dev = ' class="dev"' if declared else ""
        rows.append(f'<tr><th><code>{html.escape(fid)}</code></th><td class="{cls}">{html.escape(verdict_text(v))}</td>'
                    f"{cells}<td>{html.escape(ratio_text(w['worst']))}</td><td{dev}>{html.escape(declared)}</td>"
                    f"<td>{rejects_text(v)}</td></tr>")
    # failures, errors, stale and declared deviations; validation (rejected, not-rejected) is the rejects column
    notable = [r for r in summary.results
               if r.outcome not in ("pass", "unsupported", "not-applicable", "rejected", "not-rejected")]
    details = []
    for r in notable:
        dev = ""
        if r.declaration:
            dev = (f"<p>Declared {html.escape(r.declaration['kind'])}: {html.escape(r.declaration['reason'])} "
                   f'(<a href="{html.escape(r.declaration["link"])}">source</a>)</p>')
        details.append(
            f"<h3><code>{html.escape(r.case_id)}</code> ({r.dtype}): {r.outcome}</h3>{dev}"
            f"<pre>{html.escape(r.message.strip())}</pre><p>Reproduce:</p><pre>{html.escape(r.repro.strip())}</pre>"
        )
    heads = "".join(f"<th>{html.escape(COLUMN_NAMES.get(k, k))}</th>" for k in TABLE_COLUMNS)
    lacking_text = (f"<p>Not implemented by {html.escape(adapter.name)} ({len(lacking)} formulas): "
                    f"{html.escape(', '.join(lacking))}.</p>") if lacking else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title(h))}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 70em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #999; padding: 0.3em 0.7em; text-align: left; }}
td.ok {{ background: #dff0d8; }} td.bad {{ background: #f2dede; }} td.dev {{ background: #fcf8e3; }}
td.na {{ color: #777; }} img {{ max-width: 100%; height: auto; }}
pre {{ background: #f6f6f6; padding: 0.6em; overflow-x: auto; }}
</style></head><body>
<h1>{html.escape(title(h))}</h1>
<p><strong>{html.escape(summary.summary_line(adapter.name))}</strong></p>
<p>{html.escape(h['framework'])} ({html.escape(h['version'])}) on {html.escape(device)};
golden corpus pgspec {html.escape(h['golden']['pgspec'])}, mpmath {html.escape(h['golden']['mpmath'])}, dps {h['golden']['dps']}.</p>
<p>One row per formula, as the conformance matrix (spec/verdicts.md): the verdict over every dtype and the
property checks, the numeric results by outcome (they add up to the line above), the worst error ratio
(error / bound; below 1 passes) of the results judged as they are (pass, fail, stale), the worst of those
a declared rule explains (known bugs, conventions) apart, and how many of its invalid inputs the framework
rejects.</p>
<table><tr><th>formula</th><th>verdict</th>{heads}<th>worst</th><th>declared worst</th><th>rejects</th></tr>
{''.join(rows)}
</table>
{lacking_text}
<h2>Error ratio per family and dtype</h2>
<p>Bars: the worst ratio of the results judged as they are; grey diamonds: the worst ratio of the results a
declared rule explains (known bugs and conventions), drawn apart from failures.</p>
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
