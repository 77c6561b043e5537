"""docs/seeds.md is generated from the golden corpus by docs/seed_table.py and is never stale."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("seed_table", ROOT / "docs" / "seed_table.py")
seed_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seed_table)


def test_page_is_what_the_script_makes():
    assert (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8") == seed_table.render(), (
        "run: python docs/seed_table.py --write")


def test_every_number_on_the_page_is_the_corpus_string():
    cases = seed_table.corpus()
    page = (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8")
    shown = 0
    for line in page.splitlines():
        m = re.match(r"\| \d+ \|.*\| `([^`]+)` \| `([^`]+)` = `([^`]+)` \| (exact|pending[^|]*) \|$", line)
        if not m:
            continue
        case_id, out, number = m.groups()[:3]
        stored = seed_table.stored(cases[case_id], out)
        text = {True: "true", False: "false", None: "null"}.get(stored, str(stored)) if not isinstance(
            stored, str) else stored
        if number.endswith("…"):
            assert text.startswith(number[:-1]) and len(text) > len(number) - 1, (case_id, out)
        else:
            assert text == number, (case_id, out, number, text)
        shown += 1
    assert shown >= 30


def test_every_pull_request_has_rows():
    resolved = seed_table.resolve()
    assert {r["pr"] for r in resolved} == set(seed_table.PRS)


def test_only_rows_of_branch_seeds_are_pending():
    for r in seed_table.resolve():
        if r["status"] not in ("exact", seed_table.EXPLAINED):
            assert r["seeds"] and r["status"] == seed_table.PENDING, r["item"]
            assert seed_table.ALLOW_PENDING, f"{r['item']}: {r['case']} is not in the corpus"


def test_exact_rows_show_a_case_of_the_named_formula():
    for r in seed_table.resolve():
        if r["status"] == "exact":
            named = re.findall(r"@([\w.-]+)@", r["spec"])
            assert r["formula"] in named, (r["item"], r["formula"], named)


def test_a_missing_case_is_not_exact():
    rows = [seed_table.row("liger-4", "x", "@ratio.token@", "ratio.token/no-such-case", "ratio[0][0]", seeds=True)]
    (r,) = seed_table.resolve(rows)
    assert r["status"] == seed_table.PENDING


def test_every_row_is_exact_or_explained():
    """Issue 43: no seed item is left approximate; an explained row says why it has no formula of its own."""
    resolved = seed_table.resolve()
    assert {r["status"] for r in resolved} <= {"exact", seed_table.EXPLAINED}
    for r in resolved:
        if r["status"] == seed_table.EXPLAINED:
            assert r["case"] is None and r["number"] is None, r["item"]
            assert len(r["why"]) >= 60 and "Why no formula of its own" in r["spec_text"], r["item"]


def test_an_explained_row_must_name_an_anchor_and_no_case():
    ok = seed_table.explained("liger-4", "x", "@ratio.token@", "a configuration rule: " + "y" * 60)
    (r,) = seed_table.resolve([ok])
    assert r["status"] == seed_table.EXPLAINED
    for bad in (seed_table.explained("liger-4", "x", "@no.such-anchor@", "z" * 60),
                seed_table.explained("liger-4", "x", "no pgspec ID", "z" * 60),
                dict(seed_table.row("liger-4", "x", "@ratio.token@", "ratio.token/log-ratio-200-clamped",
                                    "ratio[0][0]"), why="z" * 60)):
        try:
            seed_table.resolve([bad])
        except SystemExit:
            continue
        raise AssertionError(f"accepted {bad}")


def test_an_error_case_shows_the_argument_its_error_names():
    cases = seed_table.corpus()
    assert seed_table.stored(cases["agg.constant/error-divisor-nan"], "expect_error.argument") == "divisor"
