"""The documentation site: the Sphinx build (warnings are errors), and the built pages opened in
headless Chromium: every page's math typesets with MathJax from the build's own copy, with no
MathJax error, and no request leaves the machine."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def sphinx_build(outdir: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    for o in overrides:
        args += ["-D", o]
    return subprocess.run(args + [str(ROOT / "docs"), str(outdir)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    result = sphinx_build(out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_sphinx_build_has_no_warnings(site):
    for family in ("conventions", "ratio"):
        assert (site / "spec" / f"{family}.html").exists()


def test_math_is_served_from_the_build_not_a_cdn(site):
    page = (site / "spec" / "kl.html").read_text()
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', page)
    mathjax = [s for s in scripts if "mathjax" in s.lower()]
    assert mathjax == ["../_static/mathjax/tex-chtml-full.js"], scripts
    assert (site / "_static" / "mathjax" / "tex-chtml-full.js").is_file()
    assert list((site / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    for html in site.rglob("*.html"):
        assert "cdn.jsdelivr" not in html.read_text(), html


# -- headless Chromium -------------------------------------------------------------------------

HARNESS = """<!doctype html><html><head><meta charset="utf-8"><title>pgspec math check</title></head><body>
<script>
const pages = %s;
async function check(path) {
  const frame = document.createElement("iframe");
  frame.style.width = "1400px"; frame.style.height = "800px"; frame.style.border = "0";
  const loaded = new Promise(resolve => frame.addEventListener("load", resolve, {once: true}));
  frame.src = path;
  document.body.appendChild(frame);
  await loaded;
  const win = frame.contentWindow, doc = frame.contentDocument;
  const math = Array.from(doc.querySelectorAll(".math"));
  const result = {page: path, math: math.length, mathjax: !!win.MathJax, typeset: 0, raw: [], errors: []};
  if (win.MathJax) {
    try { await win.MathJax.startup.promise; } catch (e) { result.errors.push("startup: " + e); }
  }
  for (const el of math) {
    if (el.querySelector("mjx-container")) result.typeset += 1;
    else result.raw.push(el.textContent.slice(0, 80));
  }
  for (const err of doc.querySelectorAll("mjx-merror, [data-mjx-error]")) {
    result.errors.push((err.getAttribute("data-mjx-error") || err.textContent).slice(0, 120));
  }
  // at a 1400 px viewport no page scrolls sideways, and a table fits its box (furo's .table-wrapper)
  // or, a table of nine or more columns (the matrix), scrolls in a box no taller than the window
  result.viewport = [win.innerWidth, win.innerHeight];
  result.scrollWidth = doc.documentElement.scrollWidth;
  result.wide = Array.from(doc.querySelectorAll("body *"))
    .filter(el => el.getBoundingClientRect().right > win.innerWidth + 0.5 && !el.querySelector("*"))
    .slice(0, 6).map(el => el.tagName.toLowerCase() + "." + el.className + "[" + el.textContent.slice(0, 20) + "] right=" + Math.round(el.getBoundingClientRect().right)
      + " in: " + ((el.closest("p, td, li, dd") || el).textContent || "").replace(/\\s+/g, " ").slice(0, 100));
  result.cut = Array.from(doc.querySelectorAll(".table-wrapper"))
    .filter(el => el.scrollWidth > el.clientWidth + 1)
    .map(el => {
      const widest = Array.from(el.querySelectorAll("td, th")).sort((a, b) => b.offsetWidth - a.offsetWidth)[0];
      return {head: (el.querySelector("th") || el).textContent.trim().slice(0, 30), width: el.scrollWidth,
              box: el.clientWidth, columns: (el.querySelector("tr") || el).children.length,
              height: el.getBoundingClientRect().height,
              widest: widest ? widest.offsetWidth + " px: " + widest.textContent.trim().slice(0, 60) : "-"};
    });
  frame.remove();
  return result;
}
(async () => {
  const results = [];
  for (const p of pages) {
    try { results.push(await check(p)); } catch (e) { results.push({page: p, errors: ["harness: " + e]}); }
  }
  const out = document.createElement("pre");
  out.id = "pgspec-result";
  out.textContent = "PGSPEC-RESULT " + JSON.stringify(results) + " PGSPEC-END";
  document.body.appendChild(out);
})();
</script></body></html>
"""


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):  # quiet: requests are recorded by log_request
        pass

    def log_request(self, code="-", size="-"):
        self.server.requests.append((self.command, self.path, str(int(code))))


def check_pages_in_chromium(site: Path, pages: list[str] | None = None, timeout: float = 240) -> dict:
    """Open every page of a built site in one headless Chromium over a loopback HTTP server.

    Returns {"results": per-page math counts and MathJax errors, "external": every URL Chromium
    requested that is not on the loopback server, "failed": local requests that did not answer 200}."""
    chromium = find_chromium()
    if pages is None:
        pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                       if p.name not in ("genindex.html", "search.html", "_pgspec_check.html")
                       and not p.relative_to(site).as_posix().startswith("_"))
    (site / "_pgspec_check.html").write_text(HARNESS % json.dumps(pages))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(site)))
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    netlog = site.parent / f"{site.name}-netlog.json"
    try:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--disable-default-apps", "--disable-extensions", "--no-pings",
               "--disable-features=AutofillServerCommunication,OptimizationHints,MediaRouter",
               f"--user-data-dir={site.parent / (site.name + '-chromium-profile')}",
               # nothing but the loopback server resolves: a CDN request fails (and is seen below)
               "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
               f"--log-net-log={netlog}", "--net-log-capture-mode=Default",
               "--virtual-time-budget=120000", "--dump-dom", f"http://127.0.0.1:{port}/_pgspec_check.html"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        server.shutdown()
        server.server_close()
    match = re.search(r'<pre id="pgspec-result">PGSPEC-RESULT (.*?) PGSPEC-END</pre>', proc.stdout, re.S)
    assert match, f"the check page did not finish:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    import html as _html

    results = json.loads(_html.unescape(match.group(1)))
    local = f"http://127.0.0.1:{port}"
    external = sorted(page_requests_leaving(netlog, local)) if netlog.exists() else None
    # the browser's own favicon probe is not a request of the pages
    failed = [r for r in server.requests if r[2] not in ("200", "304") and r[1] != "/favicon.ico"]
    return {"results": results, "external": external, "failed": failed}


def page_requests_leaving(netlog: Path, local: str) -> set[str]:
    """URLs requested by a page (a request with an initiating origin) that are not on ``local``.

    Chromium's own background requests (update checks, sign-in) carry no page origin
    ("not an origin") and are not the site's doing; with the resolver rules above they fail anyway."""
    data = json.loads(netlog.read_text(errors="replace"))
    start_job = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    out = set()
    for event in data["events"]:
        params = event.get("params") or {}
        if event.get("type") != start_job or "url" not in params:
            continue
        url, initiator = params["url"], params.get("initiator", "")
        if initiator == "not an origin":
            continue
        if not (url == local or url.startswith(local + "/") or url.startswith(("data:", "blob:", "about:"))):
            out.add(url)
    return out


def test_every_page_typesets_its_math_offline_in_chromium(site):
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("headless Chromium is required in CI (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium on this machine: apt-get install chromium (.ci/run does)")
    report = check_pages_in_chromium(site)
    results = report["results"]
    assert report["external"] is not None, "Chromium wrote no net log: the no-external-request check cannot run"
    assert report["external"] == [], f"requests left the machine: {report['external']}"
    assert report["failed"] == [], f"local requests that failed: {report['failed']}"
    assert len(results) >= 15, results
    with_math = [r for r in results if r.get("math")]
    assert any(r["page"] == "spec/kl.html" for r in with_math), "the KL page has no math?"
    problems = [r for r in results if r.get("errors") or r.get("raw") or (r.get("math") and not r.get("mathjax"))]
    assert problems == [], json.dumps(problems, indent=1)
    for r in with_math:
        assert r["typeset"] == r["math"], r
    # 1400 px: no page scrolls sideways (spec/logprob.html did, by a wide inline equation) and no table is cut
    # to furo's 46em column (each conformance page's rule table, the name map, the per-formula rows were)
    assert all(r.get("viewport", [0])[0] == 1400 for r in results), results[0]
    sideways = [(r["page"], r["scrollWidth"], r["wide"]) for r in results if r["scrollWidth"] > 1400]
    assert sideways == [], sideways
    cut = [(r["page"], t) for r in results for t in r["cut"]
           if t["columns"] < 9 or t["height"] > r["viewport"][1]]
    assert cut == [], json.dumps(cut, indent=1)
    matrix = next(r for r in results if r["page"] == "conformance/matrix.html")
    assert all(t["height"] <= matrix["viewport"][1] for t in matrix["cut"]), matrix["cut"]


def test_the_chromium_check_sees_a_cdn_request_and_raw_math(tmp_path):
    """The check above can fail: a page that loads MathJax from a CDN is caught twice (the request
    leaves the machine, and offline its math stays raw LaTeX)."""
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("headless Chromium is required in CI (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium on this machine: apt-get install chromium (.ci/run does)")
    site = tmp_path / "site"
    site.mkdir()
    (site / "page.html").write_text(
        '<!doctype html><html><head><script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js">'
        '</script></head><body><p><span class="math">\\(x^2\\)</span></p></body></html>')
    report = check_pages_in_chromium(site, pages=["page.html"], timeout=120)
    assert report["external"] == ["https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"]
    [result] = report["results"]
    assert result["math"] == 1 and result["typeset"] == 0 and result["raw"] == ["\\(x^2\\)"]


def test_plots_are_generated_from_the_reference_into_the_build(site):
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    from pgspec_docs import PLOTS

    page = (site / "plots.html").read_text()
    for name in PLOTS:
        png = site / "_static" / "pgspec-plots" / f"{name}.png"
        assert png.is_file() and png.stat().st_size > 20_000, png
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="_static/pgspec-plots/{name}.png"' in page, name


def test_the_adapter_guide_shows_the_output_of_its_executed_example(site):
    text = html_text(site / "adapter-guide.html")
    assert "$ pgspec run --adapter my_adapter:adapter --formulas 'kl.k3,ratio.token' --no-properties" in text
    assert re.search(r"mine: no unexpected result; numeric: (\d+) of \1 applicable results pass", text), "the example adapter no longer passes"
    assert re.search(r"\d+ passed, \d+ deselected", text)
    assert "fail kl.k3/masked-nan-inf (float32): grad.logprobs" in text
    assert "pytest --pgspec-adapter my_adapter_v2:adapter 'pgspec::kl.k3/masked-nan-inf[float32]'" in text
    assert "load_adapter('my_adapter_v2:adapter')" in text
    # masked-nan-inf and masked-overflowing-log-ratio, each in float64, float32 and bfloat16
    assert re.search(r"kl\.k3\s+│\s+bug \(6\)", text)
    # the head example of `pgspec check`: both dtypes pass through the head
    assert "$ pgspec check --adapter my_head:adapter --formula logprob.token --vocab 5000" in text
    for dtype in ("bfloat16", "float32"):
        assert f"pgspec check my-head logprob.token {dtype} 2x128 V=5000 H=64 via head seed 0: pass" in text


def test_formula_pages_and_name_map_reflect_the_committed_files(site):
    kl = html_text(site / "formulas" / "kl.html")
    if (ROOT / "docs" / "conformance" / "verdicts.json").is_file():
        assert "No conformance results yet" not in kl and "worst error ratio" in kl
    else:
        assert "No conformance results yet" in kl
    # a formula that pgspec check has an oracle for says so, with what a check of it needs; another does not
    loss = html_text(site / "formulas" / "loss.html")
    assert "pgspec check --formula loss.gspo (it needs --shape BxT; its IS weight any (level, mode, bounds, clamp)" in loss
    assert "pgspec check --formula loss.gmpo (it needs --shape BxT" in loss     # every loss has one
    assert "pgspec check --formula kl." not in kl
    assert "pgspec check --formula surrogate." not in html_text(site / "formulas" / "surrogate.html")
    name_map = html_text(site / "name-map.html")
    if list((ROOT / "conformance" / "presets").glob("*.toml")):
        assert "No presets yet" not in name_map and "spec recipe" in name_map
    else:
        assert "No presets yet" in name_map


def html_text(page: Path) -> str:
    import html as _html

    return _html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_every_page_has_its_own_title(site):
    """The sidebar listed "pgspec conformance: slime" three times (main and two PR heads): a report's
    title names the variant its adapter's version names (report.title)."""
    titles = {}
    for page in sorted(site.rglob("*.html")):
        if page.name in ("genindex.html", "search.html") or page.relative_to(site).as_posix().startswith("_"):
            continue
        m = re.search(r"<title>(.*?)</title>", page.read_text(), re.S)
        titles.setdefault(m.group(1).strip(), []).append(page.relative_to(site).as_posix())
    assert {t: p for t, p in titles.items() if len(p) > 1} == {}
    for name, expected in (("slime-pr2060", "slime (PR #2060)"), ("megatron-packed", "megatron (packed layout)")):
        assert f"<h1>pgspec conformance: {expected}" in (site / "conformance" / f"{name}.html").read_text()


def test_the_report_title_names_the_variant():
    from pgspec.conformance.report import title

    assert title({"adapter": "slime", "version": "git:624b824a898a committed 2026-08-21 (main 624b824a, blobs "
                  "verified) (isolated)"}) == "pgspec conformance: slime"
    assert title({"adapter": "slime", "version": "git:0baefb547dcf committed 2026-06-12 (PR #2060 head 0baefb54, "
                  "blobs verified) (isolated)"}) == "pgspec conformance: slime (PR #2060)"
    assert title({"adapter": "megatron", "version": "git:d98e8a64ddf3 committed 2026-08-22 (main d98e8a64, blobs "
                  "verified); packed layout (seq_starts / seq_lengths) (isolated)"}) == \
        "pgspec conformance: megatron (packed layout)"
    assert title({"adapter": "liger-compiled", "version": "0.8.5; compiled=True (torch.compile, recompile_limit 256)"}) \
        == "pgspec conformance: liger-compiled"


def test_the_matrix_cells_are_coloured_by_verdict_and_keep_their_text(site):
    """Classes added by the docs extension (pgspec_docs._colour_matrix_cells); the text is matrix.py's."""
    page = (site / "conformance" / "matrix.html").read_text()
    cells = re.findall(r'<td class="pgspec-cell-([a-z-]+)"><p><a [^>]*><span[^>]*>([^<]*)</span>', page)
    assert cells, page[:2000]
    for cls, text in cells:
        assert text.lower().replace(" ", "-").startswith(cls), (cls, text)
    source = (ROOT / "docs" / "conformance" / "matrix.md").read_text()
    kinds = {cls for cls, _ in cells}
    assert {"pass", "unsupported"} <= kinds and ("bug" in kinds) == ("[bug (" in source)
    assert len(cells) == len(re.findall(r"\[(?:pass|bug|convention|unsupported|not applicable|FAIL|ERROR|STALE)\b",
                                        source))
