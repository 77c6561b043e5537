"""Binding coverage (pgspec golden coverage): every side of every bounding parameter binds in some
case of its formula (recipe parameters: of some loss.* recipe) and does not bind in another."""

from __future__ import annotations

from pgspec.conformance.corpus import coverage, golden


def test_every_bounding_parameter_side_binds_somewhere_and_not_everywhere():
    rows = coverage.coverage()
    bad = coverage.problems(rows)
    assert not bad, "parameter sides without binding coverage:\n" + "\n".join(bad) + "\n\n" + coverage.table(rows)


def test_the_check_sees_a_side_that_never_binds():
    # the corpus without the cases in which kl.k3's input clamp takes effect on each side
    gone = ("kl.k3/input-clamp-both-sides", "kl.k3/regime-input-and-output-clamps")
    cases = [c for c in golden.load_all() if c["formula"] == "kl.k3" and c["id"] not in gone]
    bad = coverage.problems(coverage.coverage(cases))
    assert "kl.k3: log_ratio_min (lower) binds in no case (5 case(s) set it)" in bad
    assert any(p.startswith("kl.k3: log_ratio_max (upper) binds in no case") for p in bad)


def test_a_clamp_hidden_by_a_later_clamp_does_not_count():
    # x = -200 clamped to -20 on input, then the value clamped to 10: the input clamp changes nothing
    case = next(c for c in golden.load_all() if c["id"] == "kl.k3/log-ratio-200-clamped")
    sides = {(p, s): b for p, s, b in coverage.case_rows(case)}
    assert sides[("log_ratio_min", "lower")] is False and sides[("output_max", "upper")] is True


def test_symmetric_clamps_are_split_by_side():
    case = next(c for c in golden.load_all() if c["id"] == "ratio.sequence_product/clamp-both-sides")
    sides = {(p, s): b for p, s, b in coverage.case_rows(case)}
    assert sides == {("log_ratio_clamp", "lower"): True, ("log_ratio_clamp", "upper"): False}
