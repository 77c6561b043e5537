"""The generated documentation pages, each built in a small Sphinx project of its own (fast) with
pgspec's docs extension: the per-formula conformance sections from a verdicts.json fixture, the
framework name map from a presets fixture, the plots from the reference, and the executed
examples of the adapter guide (a documented command that no longer behaves as the page says fails
the build)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "docs"

CONF = """
import sys
sys.path.insert(0, {ext!r})
extensions = ["myst_parser", "sphinx.ext.mathjax", "pgspec_docs"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "basic"
pgspec_verdicts = {verdicts!r}
pgspec_presets = {presets!r}
# the spec pages are not part of this small project: their labels are checked by the full build
suppress_warnings = ["ref.ref", "ref.doc"]
"""


def build(tmp_path: Path, pages: dict[str, str], verdicts: Path, presets: Path):
    src, out = tmp_path / "src", tmp_path / "out"
    for name, text in pages.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    (src / "conf.py").write_text(CONF.format(ext=str(ROOT / "docs" / "_ext"), verdicts=str(verdicts),
                                             presets=str(presets)))
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(src), str(out)],
                       capture_output=True, text=True)
    return r, out


def text_of(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


INDEX = "# t\n\n```{toctree}\n" + "\n".join(["formulas/kl", "formulas/loss", "name-map"]) + "\n```\n"


@pytest.fixture(scope="module")
def fixture_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pages")
    pages = {
        "index.md": INDEX,
        "formulas/kl.md": (ROOT / "docs" / "formulas" / "kl.md").read_text(),
        "formulas/loss.md": (ROOT / "docs" / "formulas" / "loss.md").read_text(),
        "name-map.md": (ROOT / "docs" / "name-map.md").read_text(),
    }
    r, out = build(tmp, pages, FIXTURES / "verdicts.json", FIXTURES / "presets")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_each_formula_shows_its_equation_beside_its_conformance_row(fixture_site):
    page = (fixture_site / "formulas" / "kl.html").read_text()
    section = page[page.index('id="conformance-kl-k3"'):page.index('id="conformance-kl-k3-straight-through"')]
    # the defining equation, taken from spec/kl.md
    assert 'class="math' in section and "\\tilde x_{i,t}" in html.unescape(section)
    text = html.unescape(re.sub(r"<[^>]+>", " ", section))
    row_trl = re.search(r"fixture-trl\s+1\.16\.0\s+pass 0\.12\s+63 pass\s+0\.12\s+rejects 15 of 18", text)
    assert row_trl, text
    assert re.search(r"fixture-verl\s+0\.9\.1\s+bug \(6\)\s+57 pass, 6 bug\s+inf\s+-\s+bug\s+\(6 cases\): fixture: masked NaN",
                     text), text
    assert 'href="https://github.com/volcengine/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L1"' in section
    assert 'class="pgspec-verdict-bug"' in section and 'class="pgspec-verdict-pass"' in section
    # a framework without results for a formula says so; an unsupported one gives its reason
    k1 = page[page.index('id="conformance-kl-k1"'):page.index('id="conformance-kl-k2"')]
    assert "fixture: TRL has no k1 penalty" in k1 and "unsupported" in k1
    # the frameworks that implement the formula come first, those that lack it after them
    k1_text = html.unescape(re.sub(r"<[^>]+>", " ", k1))
    assert k1_text.index("fixture-verl") < k1_text.index("fixture-trl"), k1_text
    assert "not run" in text_of(fixture_site / "formulas" / "kl.html")
    loss = text_of(fixture_site / "formulas" / "loss.html")
    assert re.search(r"fixture-trl\s+1\.16\.0\s+FAIL \(2\)", loss)


def test_name_map_renders_the_presets_with_links(fixture_site):
    page = (fixture_site / "name-map.html").read_text()
    text = text_of(fixture_site / "name-map.html")
    assert "fixture-trl 1.16.0" in text
    assert 'loss_type="dapo"' in text and "eps_high=0.28" in text and "fixture note: one line" in text
    # the recipe links to its conformance section, the source to the tested version's line
    assert re.search(r'href="formulas/loss\.html#conformance-loss-dapo"', page), page[-3000:]
    assert 'href="https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L1"' in page


def test_pages_say_plainly_when_the_files_are_absent(tmp_path):
    pages = {"index.md": INDEX, "formulas/kl.md": (ROOT / "docs" / "formulas" / "kl.md").read_text(),
             "formulas/loss.md": "# loss\n", "name-map.md": (ROOT / "docs" / "name-map.md").read_text()}
    r, out = build(tmp_path, pages, tmp_path / "missing.json", tmp_path / "no-presets")
    assert r.returncode == 0, r.stdout + r.stderr
    kl = text_of(out / "formulas" / "kl.html")
    assert "No conformance results yet" in kl and "python -m pgspec.conformance.matrix" in kl
    assert "\\tilde x_{i,t}" in kl  # the definitions are still there
    assert "No presets yet" in text_of(out / "name-map.html")


def test_a_documented_command_that_misbehaves_fails_the_build(tmp_path):
    """The adapter guide cannot rot: its commands run at build time and their exit status is checked."""
    page = """# guide

```{pgspec-example-module} rotten.py
import torch
from pgspec.adapters.base import Adapter


def ratio(inputs, params):  # masked by multiplication: a masked inf becomes NaN
    return {"ratio": torch.exp((inputs["logprobs"] - inputs["old_logprobs"]) * inputs["mask"])}


adapter = Adapter("rotten", "f", "0", implementations={"ratio.token": ratio})
```

```{pgspec-command}
pgspec run --adapter rotten:adapter --formulas ratio.token --dtype float64 --no-properties
```
"""
    r, _ = build(tmp_path, {"index.md": page}, tmp_path / "none.json", tmp_path / "none")
    assert r.returncode != 0
    assert "exited 1, the page says 0" in r.stdout + r.stderr


def test_a_rule_of_one_case_says_one_case():
    """Per-formula pages said "bug (1 cases)" (issue 38 had the console's "(1 root causes)")."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import pgspec_docs
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))

    def text(n):
        rule = {"kind": "bug", "reason": "r", "link": "https://example.org/a#L1", "cases": n}
        return "".join(node.astext() for node in pgspec_docs._details({"rules": [rule]}))

    assert text(1).startswith("bug (1 case): r")
    assert text(12).startswith("bug (12 cases): r")
