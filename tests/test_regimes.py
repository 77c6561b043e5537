"""Regime coverage (pgspec golden coverage, conformance/corpus/regimes.py): every regime of the
catalogue is witnessed by a case of its formula (float64-only effects by MIN_FLOAT64 cases) and, where
a recipe composes the formula, by a loss.* case; the check names the gap when a regime's cases go."""

from __future__ import annotations

import copy

from pgspec.conformance.corpus import golden, regimes


def _cases(*formulas):
    return [c for c in golden.load_all() if c["formula"] in formulas or c["formula"].startswith(formulas)]


def test_every_regime_is_witnessed():
    rows = regimes.coverage()
    bad = regimes.problems(rows)
    assert not bad, "regime gaps:\n" + "\n".join(bad) + "\n\n" + regimes.table(rows)


def test_removing_a_regimes_cases_names_the_gap():
    cases = _cases("mask.")
    key = "mask.geometric_sequence: g = upper"
    rows = regimes.coverage(cases)
    witnesses = set(rows[key].formula_cases)
    assert witnesses, "the corpus should witness the regime"
    assert not any(p.startswith(key + " ") for p in regimes.problems(rows))
    rows = regimes.coverage([c for c in cases if c["id"] not in witnesses])
    assert any(p.startswith(key + " [equality] witnessed by no case of mask.geometric_sequence")
               for p in regimes.problems(rows))


def test_a_recipe_gap_is_named_separately():
    cases = _cases("surrogate.sapo", "loss.sapo")
    key = "surrogate.sapo: r = 1, A > 0"
    rows = regimes.coverage(cases)
    assert rows[key].formula_cases and rows[key].recipe_cases
    recipe = set(rows[key].recipe_cases)
    bad = regimes.problems(regimes.coverage([c for c in cases if c["id"] not in recipe]))
    assert f"{key} [equality] witnessed by no loss.* recipe case" in " ".join(bad)
    assert not any(p.startswith(key + " [equality] witnessed by no case") for p in bad)


def test_equality_is_exact_and_needs_the_gated_term():
    # one ppo_clip case: eps = 0, l = l_old, A = (1, -1): r = 1 = 1 - eps_low = 1 + eps_high exactly
    base = {"id": "surrogate.ppo_clip/t", "formula": "surrogate.ppo_clip", "category": "edge",
            "params": {"eps_low": 0, "eps_high": 0},
            "inputs": {"logprobs": [[-1.0], [-1.0]], "old_logprobs": [[-1.0], [-1.0]], "mask": [[True], [True]],
                       "advantages": [1.0, -1.0]}}
    rows = regimes.coverage([base])
    assert rows["surrogate.ppo_clip: r = 1 - eps_low, A < 0"].formula_cases == ["surrogate.ppo_clip/t"]
    assert rows["surrogate.ppo_clip: r = 1 + eps_high, A > 0"].formula_cases == ["surrogate.ppo_clip/t"]
    zero = copy.deepcopy(base)          # A = 0: the gated term is 0, the gate's output cannot show it
    zero["inputs"]["advantages"] = [0.0, 0.0]
    off = copy.deepcopy(base)           # l - l_old = 2^-40: not equality
    off["inputs"]["logprobs"] = [[-1.0 + 2.0 ** -40], [-1.0 + 2.0 ** -40]]
    rows = regimes.coverage([zero, off])
    assert not rows["surrogate.ppo_clip: r = 1 - eps_low, A < 0"].formula_cases
    assert not rows["surrogate.ppo_clip: r = 1 + eps_high, A > 0"].formula_cases


def test_float64_regimes_need_three_cases():
    cases = _cases("agg.token_mean")
    key = "agg.token_mean: float32 accumulation visible"
    rows = regimes.coverage(cases)
    have = rows[key].formula_cases
    assert len(have) >= regimes.MIN_FLOAT64
    bad = regimes.problems(regimes.coverage([c for c in cases if c["id"] != have[0]]))
    if len(have) == regimes.MIN_FLOAT64:
        assert any(p.startswith(key + f" [float64] witnessed by {len(have) - 1} case(s), 3 needed") for p in bad)


def test_the_catalogue_is_data_the_reader_can_audit():
    from pgspec.conformance.corpus.regime_catalogue import catalogue

    for r in catalogue():
        assert r.kind in ("equality", "branch", "order", "option", "float64"), r
        assert r.where.startswith("spec/") and r.text and callable(r.test), r


def test_property_examples_draw_every_option_on_both_sides():
    from pgspec.conformance.run.properties import strategy_coverage

    rows, bad = strategy_coverage.option_coverage()
    assert not bad, "\n".join(bad) + "\n\n" + strategy_coverage.option_table(rows)


def test_an_option_never_drawn_is_named(monkeypatch):
    from pgspec.conformance.run.properties import _common, clamp, strategy_coverage

    monkeypatch.setitem(_common.OPTION_DRAWS, "kl_aggregation", ("policy",))
    monkeypatch.delitem(clamp.CLAMP_PARAMS, "kl.k3_unbiased")
    _, bad = strategy_coverage.option_coverage()
    assert "property examples: option kl_aggregation (11 formula(s)) never drawn as sample_mean, token_mean" in bad
    assert any(p.startswith("prop.clamp: kl.k3_unbiased has a clamp parameter but no parameter set") for p in bad)
