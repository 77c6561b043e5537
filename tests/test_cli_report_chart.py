"""The HTML report's chart (``pgspec run --report html:PATH``): huge and infinite error ratios are
drawn distinctly (overflow bars labelled with their value), never clipped to look like the axis cap."""

from __future__ import annotations

import base64
import math
import re

from pgspec.conformance import report
from pgspec.conformance.run import runner

DTYPES = ["float64", "float32", "bfloat16"]


def summary_with(ratios: dict) -> runner.RunSummary:
    s = runner.RunSummary()
    for (family, dtype), w in ratios.items():
        outcome = "pass" if w <= 1 else "fail"
        s.results.append(runner.CaseResult("demo", "1", "cpu", dtype, f"{family}.x/c", f"{family}.x", family, "c",
                                           outcome, error_ratio=w))
    return s


def test_chart_bars_tell_the_cap_a_huge_ratio_and_infinity_apart():
    ratios = {("is", "float64"): 1e3, ("is", "float32"): 2e15, ("is", "bfloat16"): math.inf,
              ("kl", "float64"): 0.04, ("kl", "float32"): 12.0, ("agg", "float64"): 0.0,
              ("logprob", "float32"): math.nan}
    bars = {(b["family"], b["dtype"]): b for b in report.chart_bars(report.matrix(summary_with(ratios), DTYPES), DTYPES)}
    assert bars[("is", "float64")]["kind"] == "over" and bars[("is", "float64")]["height"] == report.CHART_CAP
    huge, inf = bars[("is", "float32")], bars[("is", "bfloat16")]
    assert huge["kind"] == "overflow" and huge["label"] == "2.0e+15" and huge["height"] > report.CHART_CAP
    assert inf["kind"] == "infinite" and inf["label"] == "inf" and inf["height"] > huge["height"]
    assert bars[("logprob", "float32")]["kind"] == "infinite" and bars[("logprob", "float32")]["label"] == "nan"
    assert bars[("kl", "float64")]["kind"] == "ok" and bars[("kl", "float32")]["kind"] == "over"
    assert bars[("agg", "float64")]["label"] == "0" and bars[("agg", "float64")]["height"] == report.CHART_FLOOR
    assert ("agg", "float32") not in bars  # no result, no bar


def _html_report(tmp_path, adapter: str, formulas: str, returncode: int) -> str:
    """The HTML report of ``pgspec run`` on the test CLI's user module (test_cli.MYMOD), in float64."""
    from test_cli import MYMOD, pgspec

    (tmp_path / "mymod.py").write_text(MYMOD)
    r = pgspec("run", "--adapter", adapter, "--formulas", formulas, "--dtype", "float64", "--no-properties",
               "--report", "html:out.html", cwd=tmp_path)
    assert r.returncode == returncode, r.stdout + r.stderr
    return (tmp_path / "out.html").read_text()


def test_html_report_of_a_run_with_an_infinite_ratio_embeds_the_chart(tmp_path):
    page = _html_report(tmp_path, "mymod:broken", "ratio.token", 1)
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_declared_deviations_are_marks_apart_from_the_bars():
    """A run that exits 0 with a declared convention of ratio inf draws no failure bar for it: the chart's
    bars are the results judged as they are, and the declared worst ratio is a mark of its own."""
    s = summary_with({("kl", "float64"): 0.5})
    s.results.append(runner.CaseResult("demo", "1", "cpu", "float64", "kl.x/d", "kl.x", "kl", "c", "convention",
                                       error_ratio=math.inf))
    s.results.append(runner.CaseResult("demo", "1", "cpu", "float32", "loss.x/d", "loss.x", "loss", "c", "bug",
                                       error_ratio=40.0))
    m = report.matrix(s, DTYPES)
    bars = {(b["family"], b["dtype"]): b for b in report.chart_bars(m, DTYPES)}
    assert bars[("kl", "float64")]["worst"] == 0.5 and ("loss", "float32") not in bars
    marks = {(k["family"], k["dtype"]): k for k in report.declared_marks(m, DTYPES)}
    assert marks[("kl", "float64")]["label"] == "inf" and marks[("kl", "float64")]["height"] == report.CHART_CAP
    assert marks[("loss", "float32")]["declared"] == 40.0 and marks[("loss", "float32")]["label"] == ""


def test_the_html_report_is_per_formula_and_its_chart_fits_the_page(tmp_path):
    text = _html_report(tmp_path, "mymod:adapter", "ratio.token,kl.k1", 0)
    assert "<th>formula</th><th>verdict</th><th>pass</th>" in text and "<code>ratio.token</code>" in text
    assert "img { max-width: 100%; height: auto; }" in text
    assert re.search(r"Not implemented by mine \(\d+ formulas\): .*kl\.k1", text)


def test_the_html_report_lists_no_validation_result_as_a_failure(tmp_path):
    """An expected-error case that the implementation rejected passed validation: the HTML report listed
    each one under "Failures, errors and deviations" with a repro snippet (891 of them for loss.* and
    mask.* on the built-in backend), on a run that exits 0.  Validation is the rejects column."""
    text = _html_report(tmp_path, "torch", "kl.k1", 0)
    assert re.search(r"<td>(\d+)/\1</td>", text)                      # kl.k1's invalid inputs, all rejected
    details = text.split("<h2>Failures, errors and deviations</h2>", 1)[1]
    assert "rejected</h3>" not in details and details.lstrip().startswith("<p>None.</p>")


def _declared_and_judged():
    """kl.x: passes (worst 0.5) and a declared convention of ratio inf; loss.x: a declared bug alone (40);
    adv.x: passes alone (worst 0.125)."""
    s = summary_with({("kl", "float64"): 0.5, ("kl", "float32"): 0.25, ("adv", "float64"): 0.125})
    s.results.append(runner.CaseResult("demo", "1", "cpu", "float64", "kl.x/d", "kl.x", "kl", "c", "convention",
                                       error_ratio=math.inf))
    s.results.append(runner.CaseResult("demo", "1", "cpu", "float32", "loss.x/d", "loss.x", "loss", "c", "bug",
                                       error_ratio=40.0))
    return s


def _md_table(md: str) -> dict:
    """{formula: {column: cell}} of the Markdown report's verdict table."""
    lines = md.split("## Verdict per formula", 1)[1].splitlines()
    head = next(ln for ln in lines if ln.startswith("| formula |"))
    names = [c.strip() for c in head.strip("|").split("|")]
    rows = [dict(zip(names, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[lines.index(head) + 2:]
            if ln.startswith("| `")]
    return {r["formula"].strip("`"): r for r in rows}


def test_the_worst_column_is_of_the_results_judged_as_they_are_and_declared_ones_apart():
    """The HTML and Markdown tables' "worst" is the worst ratio of the results judged as they are (pass,
    fail, stale), as the chart's bars and the terminal's "pass <worst>"; a declared deviation's ratio
    (an inf convention, a bug of 40) is its own "declared worst" column, never in "worst"."""
    from types import SimpleNamespace

    s = _declared_and_judged()
    adapter = SimpleNamespace(name="demo", framework="demo", version="1")
    assert report.formula_worst(s) == {"kl.x": {"worst": 0.5, "declared": math.inf},
                                       "loss.x": {"worst": None, "declared": 40.0},
                                       "adv.x": {"worst": 0.125, "declared": None}}
    page = report.to_html(s, adapter, "cpu", DTYPES)
    heads = re.findall(r"<th>([^<]*)</th>", page.split("<table>", 1)[1].split("</tr>", 1)[0])
    rows = {fid: dict(zip(heads[1:], re.findall(r"<td[^>]*>([^<]*)</td>", cells)))
            for fid, cells in re.findall(r"<tr><th><code>([^<]+)</code></th>(.*?)</tr>", page)}
    md = _md_table(report.to_markdown(s, adapter, "cpu", DTYPES))
    for table in (rows, md):
        assert table["kl.x"]["worst"] == "0.5" and table["kl.x"]["declared worst"] == "inf"
        assert table["loss.x"]["worst"] == "" and table["loss.x"]["declared worst"] == "40"
        assert table["adv.x"]["worst"] == "0.12" and table["adv.x"]["declared worst"] == ""
    assert '<td class="dev">inf</td>' in page and '<td class="dev">40</td>' in page
    # the terminal shows a worst ratio in a passing formula's verdict: the same one
    verdicts = report.formula_table(s)[0]
    assert report.verdict_text(verdicts["adv.x"]) == "pass 0.12" and rows["adv.x"]["verdict"] == "pass 0.12"
    assert report.verdict_text(verdicts["kl.x"]) == "convention (1)"
