"""Every SpecError the reference raises is golden data: some expected-error case reaches each site
(conformance/corpus/coverage.py, error_coverage), found by evaluating the cases, never by a list of ids."""

from __future__ import annotations

import pytest

from pgspec.conformance.corpus import coverage, golden
from pgspec.conformance.corpus.cases.errors import SPECIFIC


@pytest.fixture(scope="module")
def checked():
    return coverage.error_coverage()


def test_every_reference_spec_error_site_is_reached_by_an_expected_error_case(checked):
    hits, bad = checked
    assert not bad, "\n".join(bad) + "\n\n" + coverage.error_table(hits)


def test_the_check_names_a_site_that_no_case_reaches(checked):
    hits, _ = checked
    site = next(s for s, ids in hits.items() if ids == ["agg.prompt_mean/error-group-token-counts-differ-in-group"])
    cases = [c for c in golden.load_all() if c["id"] != "agg.prompt_mean/error-group-token-counts-differ-in-group"
             and (c.get("expect_error") or c["formula"] == "agg.prompt_mean")]
    _, bad = coverage.error_coverage(cases)
    assert bad == [f"reference/{site[0]}:{site[1]} ({site[2]}): no expected-error golden case reaches this SpecError"]


def test_the_check_names_an_expected_error_case_the_reference_accepts():
    case = next(c for c in golden.load_all() if c["id"] == "agg.token_mean/error-num-tokens-below-local")
    accepted = dict(case, params={**case["params"], "num_tokens": 3})   # exactly the local count: valid
    _, bad = coverage.error_coverage([accepted])
    assert f"{case['id']}: the reference does not reject it" in bad


def test_every_exemption_names_an_existing_site():
    sites = coverage.error_sites()
    for key in coverage.NOT_DATA:
        assert any(coverage.not_data(s) and (s[0], s[2]) == key[:2] for s in sites), key


def test_each_formula_specific_case_reaches_its_own_site(checked):
    """A formula-specific case is rejected for its own reason, not by an earlier generic check: the
    site it reaches is never the input-shape checks (which the generic ragged / mask-rows cases cover)."""
    hits, _ = checked
    where = {cid: s for s, ids in hits.items() for cid in ids}
    for fid, slug, argument, *_ in SPECIFIC:
        cid = f"{fid}/error-{slug}"
        assert cid in where, f"{cid}: not in the corpus or not rejected"
        assert where[cid][2] not in ("_shape", "_match_shape"), (cid, where[cid])
