"""Input predicates added for OAT's and torchtune's capabilities: mask_gaps and eps_asymmetric."""

import pytest

from pgspec.conformance.verdicts import predicates, predicates_clamps, predicates_precision


def _case(formula, params=None, **inputs):
    return {"id": f"{formula}/x", "formula": formula, "params": params or {}, "inputs": inputs}


def test_mask_gaps_is_a_hole_inside_a_row_only():
    f = "surrogate.ppo_clip"
    assert predicates.mask_gaps(_case(f, mask=[[True, False, True]]))
    assert predicates.mask_gaps(_case(f, mask=[[False, True, True, False], [True, False, False, True]]))
    # leading or trailing masked tokens (a prompt, padding) and empty rows are one contiguous run
    for mask in ([[False, True, True, False]], [[True, True, False]], [[False, False, False]], [[True]]):
        assert not predicates.mask_gaps(_case(f, mask=mask)), mask
    assert not predicates.mask_gaps(_case("adv.group_normalized", rewards=[1.0], group_ids=[0]))


def test_eps_asymmetric_compares_the_resolved_bounds():
    f = "surrogate.ppo_clip"   # registry defaults 0.2 / 0.2
    assert not predicates.eps_asymmetric(_case(f))
    assert predicates.eps_asymmetric(_case(f, {"eps_high": 0.28}))
    assert not predicates.eps_asymmetric(_case(f, {"eps_low": "0.3", "eps_high": 0.3}))
    assert predicates.eps_asymmetric(_case("surrogate.gspo"))      # defaults 3e-4 / 4e-4
    assert not predicates.eps_asymmetric(_case("kl.k3"))          # no clip bounds at all


def test_both_are_known_to_the_declarations_reader():
    names = predicates.predicates()
    assert {"mask_gaps", "eps_asymmetric"} <= set(names)


# --- predicates added to scope rules by their cause (issue 42: fuzz findings) -----------------------

def test_logits_exceed_entropy_compares_the_transformed_logits_with_their_entropy():
    f = "logprob.entropy"
    assert not predicates.logits_exceed_entropy(_case(f, logits=[[[0.0, 0.0, 0.0, 0.0]]], mask=[[True]]))
    assert predicates.logits_exceed_entropy(_case(f, logits=[[[0.0, 0.0, 0.0, 6.25]]], mask=[[True]]))
    # the fuzzer's first example: (0, 0, 0, 1.25) at logit_scale 5
    assert predicates.logits_exceed_entropy(_case(f, {"logit_scale": 5}, logits=[[[0.0, 0.0, 0.0, 1.25]]], mask=[[True]]))
    assert not predicates.logits_exceed_entropy(_case(f, logits=[[[0.0, 0.125]]], mask=[[True]]))
    assert predicates.logits_exceed_entropy(_case(f, {"temperature": "0.01"}, logits=[[[0.0, 0.125]]], mask=[[True]]))
    # a masked position is not looked at
    assert not predicates.logits_exceed_entropy(_case(f, logits=[[[0.0, 0.0], [0.0, 50.0]]], mask=[[True, False]]))


def test_bound_predicates_read_the_resolved_parameters():
    assert predicates.c_min_not_positive(_case("is.token.mask", {"c_min": 0}))
    assert not predicates.c_min_not_positive(_case("is.token.mask"))                       # default 0.5
    assert predicates.c_min_not_positive(_case("loss.bnpo", {"is_level": "token", "is_c_min": 0}))
    assert predicates.reject_upper_not_positive_k2_k3(_case("is.reject", {"upper": 0}))    # default estimator k3
    assert not predicates.reject_upper_not_positive_k2_k3(_case("is.reject", {"estimator": "k1", "upper": 0}))
    assert not predicates.reject_upper_not_positive_k2_k3(_case("is.reject", {"upper": "0.01"}))
    assert predicates.one_sided_output_clamp(_case("kl.k1", {"output_max": 10}))
    assert not predicates.one_sided_output_clamp(_case("kl.k1", {"output_min": -10, "output_max": 10}))
    assert not predicates.one_sided_output_clamp(_case("kl.k1"))
    assert predicates.kl_log_ratio_clamp_without_k3(_case("loss.bnpo", {"beta": 0.04, "kl_estimator": "k1",
                                                                        "kl_log_ratio_max": 10}))
    assert not predicates.kl_log_ratio_clamp_without_k3(_case("loss.bnpo", {"beta": 0.04, "kl_estimator": "k3",
                                                                            "kl_log_ratio_max": 10}))
    assert not predicates.kl_log_ratio_clamp_without_k3(_case("loss.bnpo", {"beta": 0, "kl_estimator": "k1",
                                                                            "kl_log_ratio_max": 10}))


def test_is_mask_keeps_nothing_reads_the_expected_keep_at_unmasked_positions():
    c = _case("is.token.mask", mask=[[True, False]])
    c["outputs"] = {"keep": [[False, None]]}
    assert predicates.is_mask_keeps_nothing(c)
    c["outputs"] = {"keep": [[True, None]]}
    assert not predicates.is_mask_keeps_nothing(c)
    c = _case("is.token.truncate", mask=[[True]])
    c["outputs"] = {"keep": [[False]]}
    assert not predicates.is_mask_keeps_nothing(c)


def test_kl_estimate_predicates_honour_the_clamps_the_case_sets():
    x21 = dict(logprobs=[[-21.0, 0.0]], ref_logprobs=[[0.0, 0.0]], mask=[[True, True]])   # x = 21
    assert predicates.k3_above_10_unclamped(_case("kl.k3", **x21))
    assert not predicates.k3_above_10_unclamped(_case("kl.k3", {"output_max": 10}, **x21))
    assert not predicates.k3_above_10_unclamped(_case("kl.k1", **x21))
    small = dict(logprobs=[[-2.0]], ref_logprobs=[[0.0]], mask=[[True]])                  # k3(2) = 4.39
    assert not predicates.k3_above_10_unclamped(_case("kl.k3", **small))
    assert predicates.kl_estimate_beyond_10_unclamped(_case("kl.k1", **x21))                # k1 = -21
    assert not predicates.kl_estimate_beyond_10_unclamped(_case("kl.k1", {"output_min": -10}, **x21))
    assert not predicates.kl_estimate_beyond_10_unclamped(_case("kl.k1", {"log_ratio_max": 5}, **x21))
    masked = dict(logprobs=[[-21.0]], ref_logprobs=[[0.0]], mask=[[False]])
    assert not predicates.kl_estimate_beyond_10_unclamped(_case("kl.k2", **masked))
    assert predicates.kl_estimate_beyond_10_unclamped(_case("loss.grpo", **x21, old_logprobs=x21["logprobs"],
                                                           advantages=[1.0]))          # default beta 0.04, k3


def test_log_ratio_predicates_look_at_unmasked_tokens_or_masked_ones_as_named():
    f = "surrogate.ppo_clip"
    big = dict(logprobs=[[0.0, 0.0]], old_logprobs=[[-21.0, 0.0]], advantages=[1.0])
    assert predicates.policy_log_ratio_beyond_20(_case(f, mask=[[True, True]], **big))
    assert not predicates.policy_log_ratio_beyond_20(_case(f, mask=[[False, True]], **big))
    assert not predicates.policy_log_ratio_beyond_20(_case(f, {"log_ratio_clamp": 20}, mask=[[True, True]], **big))
    g = "is.sequence.truncate"
    row = dict(old_logprobs=[[0.0] * 3], sampler_logprobs=[[-7.0] * 3])                     # sum 21, each 7
    assert predicates.rollout_log_ratio_beyond_20(_case(g, mask=[[True] * 3], **row))
    assert not predicates.rollout_log_ratio_beyond_20(_case(g, mask=[[True, True, False]], **row))
    assert predicates.masked_log_ratio_overflows(_case(f, mask=[[True, False]], logprobs=[[0.0, 0.0]],
                                                       old_logprobs=[[0.0, -1000.0]], advantages=[1.0]))
    assert not predicates.masked_log_ratio_overflows(_case(f, mask=[[False, True]], logprobs=[[0.0, 0.0]],
                                                           old_logprobs=[[0.0, -1000.0]], advantages=[1.0]))
    assert not predicates.masked_log_ratio_overflows(_case(f, mask=[[True, False]], logprobs=[[0.0, 0.0]],
                                                           old_logprobs=[[0.0, -50.0]], advantages=[1.0]))
    dirty = _case(f, mask=[[True, False]], logprobs=[[0.0, float("nan")]], old_logprobs=[[0.0, 0.0]],
                  advantages=[1.0])
    assert predicates.nonfinite_or_overflowing_masked(dirty) and not predicates.masked_log_ratio_overflows(dirty)


def test_nonfinite_or_overflowing_masked_takes_huge_finite_junk_too():
    f = "surrogate.ppo_clip"
    huge = _case(f, mask=[[True, False]], logprobs=[[0.0, 3e38]], old_logprobs=[[0.0, 3e38]], advantages=[1.0])
    assert predicates.nonfinite_or_overflowing_masked(huge) and not predicates.nonfinite_masked(huge)
    ok = _case(f, mask=[[True, False]], logprobs=[[0.0, -5.0]], old_logprobs=[[0.0, -3.0]], advantages=[1.0])
    assert not predicates.nonfinite_or_overflowing_masked(ok)
def test_ratio_near_clip_bound_leaves_out_an_exact_ratio_at_an_exact_bound():
    def case(d, eps):
        return {"formula": "surrogate.ppo_clip", "params": {"eps_low": eps, "eps_high": eps},
                "inputs": {"logprobs": [[-1.0 + d]], "old_logprobs": [[-1.0]], "mask": [[True]],
                           "advantages": [1.0]}}

    assert not predicates.ratio_near_clip_bound(case(0.0, 0))        # exp(0) = 1 = 1 -+ 0: exact in every dtype
    assert predicates.ratio_near_clip_bound(case(2.0 ** -10, 0))     # 1 + 2^-10 rounds to 1 in bfloat16
    assert predicates.ratio_near_clip_bound(case(0.0, 2.0 ** -9))    # the bound 1 + 2^-9 rounds to 1


def test_is_mask_keeps_nothing_reads_a_recipes_icepop_band():
    batch = dict(logprobs=[[-1.0, -1.0]], old_logprobs=[[-1.0, -1.5]], sampler_logprobs=[[-1.25, -1.5]],
                 mask=[[True, True]], advantages=[1.0])          # token rho = e^0.25, e^0 = 1.284, 1
    band = {"is_level": "token", "is_mode": "mask", "is_c_min": 1.5, "is_c_max": 2.0}
    assert predicates.is_mask_keeps_nothing(_case("loss.grpo", band, **batch))
    assert not predicates.is_mask_keeps_nothing(_case("loss.grpo", dict(band, is_c_min=1.25), **batch))  # e^0.25 kept
    assert not predicates.is_mask_keeps_nothing(_case("loss.grpo", dict(band, is_mode="truncate"), **batch))
    assert not predicates.is_mask_keeps_nothing(_case("loss.grpo", {}, **batch))
    # the sequence's rho is the product e^0.25 (kept by [1.25, 2]); the geometric mean e^0.125 is not
    seq = dict(band, is_c_min=1.25)
    assert not predicates.is_mask_keeps_nothing(_case("loss.grpo", dict(seq, is_level="sequence"), **batch))
    assert predicates.is_mask_keeps_nothing(_case("loss.grpo", dict(seq, is_level="geometric"), **batch))
    # an all-masked batch rejects nothing: it has no token to reject
    assert not predicates.is_mask_keeps_nothing(_case("loss.grpo", band, **dict(batch, mask=[[False, False]])))


def test_is_mask_keeps_nothing_reads_the_inputs_of_a_case_stored_at_positions():
    old, sampler = [[-1.0, -1.5]], [[-1.25, -1.5]]           # sequence log rho 0.25: rho = 1.284
    c = _case("is.sequence.mask", {"c_min": 1.5, "c_max": 2.0}, old_logprobs=old, sampler_logprobs=sampler,
              mask=[[True, True]])
    assert predicates.is_mask_keeps_nothing(c)
    c = _case("is.sequence.mask", {"c_min": 1.25, "c_max": 2.0}, old_logprobs=old, sampler_logprobs=sampler,
              mask=[[True, True]])
    assert not predicates.is_mask_keeps_nothing(c)
    # the generated scale case verl crashes on: its sequence ratio 10.485 is outside the default band [0.5, 5]
    from pgspec.conformance.corpus import golden

    (scale,) = [x for x in golden.load_all() if x["id"] == "is.sequence.mask/scale-32768"]
    assert scale.get("positions") and predicates.is_mask_keeps_nothing(scale)
    assert not predicates.is_mask_keeps_nothing(dict(scale, params={"c_max": 20.0}))


def test_k3_unbiased_gradient_cancels_where_e_to_the_x_dwarfs_x():
    def case(x, lw=0.0, params=None, mask=True, formula="kl.k3_unbiased", **extra):
        # one token with x = ref - l and w = e^lw (l - l_old = lw)
        return _case(formula, params, logprobs=[[-1.0]], old_logprobs=[[-1.0 - lw]], ref_logprobs=[[-1.0 + x]],
                     mask=[[mask]], **extra)

    p, p64 = predicates.k3_unbiased_gradient_cancels, predicates.k3_unbiased_gradient_cancels_beyond_float32
    # small |x|: e^x - 1 (from e^x, or expm1(x) + 1) rounds at 1 while the result is about |x|
    for x in (2.0 ** -30, 1 / 64, -1 / 64, 0.0625, -0.05):
        assert p(case(x)), x
    # |x| of order 1, and every x < -0.06: neither term is much larger than -w x
    for x in (0.125, -0.125, 0.5, -0.5, 1.0, 4.0, -20.0, -200.0):
        assert not p(case(x)), x
    # large x: w k3 and w (e^x - 1) of size w e^x
    for x in (4.5, 20.0, 88.0, 200.0):
        assert p(case(x)), x
    assert not p(case(0.0))                                       # x = 0: k3 = 0 and e^0 - 1 = 0 exactly
    assert not p(case(1 / 64, mask=False))                        # a masked token is not looked at
    assert not p(case(20.0, params={"log_ratio_max": 10}))         # clamped: gradient w k3(10) or 0
    assert p(case(20.0, params={"log_ratio_max": 20}))             # on the closed bound: still differentiated
    assert not p(case(5.0, params={"output_max": 10}))             # w k3(5) = 142.4 clamped: gradient 0
    assert p(case(5.0, lw=-5.0, params={"output_max": 10}))        # w k3(5) = 0.96 is not
    assert not p(case(1 / 64, params={"output_min": 0.25}))        # raised to the floor: gradient 0
    assert not p(case(float("nan")))
    assert not p(case(1 / 64, formula="kl.k3"))                   # no importance weight, no product rule
    # a loss.* KL term of kl_estimator k3_unbiased with beta > 0, its clamps named kl_*
    loss = dict(formula="loss.grpo", advantages=[1.0])
    assert p(case(1 / 64, params={"kl_estimator": "k3_unbiased", "beta": 0.04}, **loss))
    assert not p(case(1 / 64, params={"kl_estimator": "k3_unbiased", "beta": 0}, **loss))
    assert not p(case(1 / 64, params={"kl_estimator": "k3", "beta": 0.04}, **loss))
    assert not p(case(20.0, params={"kl_estimator": "k3_unbiased", "beta": 0.04, "kl_log_ratio_max": 10}, **loss))
    # beyond float32's tolerance even when computed in float64: e^x / |x| > 2^33, x above 26.1
    assert p64(case(88.0)) and p64(case(26.5)) and p64(case(200.0))
    assert not p64(case(26.0)) and not p64(case(20.0)) and not p64(case(2.0 ** -30))
    assert {"k3_unbiased_gradient_cancels", "k3_unbiased_gradient_cancels_beyond_float32"} <= set(predicates.predicates())


def test_k3_unbiased_beyond_20_or_10_unclamped_is_where_always_on_clamps_bind():
    def case(x, lw=0.0, params=None, mask=True):
        return _case("kl.k3_unbiased", params, logprobs=[[-1.0]], old_logprobs=[[-1.0 - lw]],
                     ref_logprobs=[[-1.0 + x]], mask=[[mask]])

    p = predicates.k3_unbiased_beyond_20_or_10_unclamped
    assert p(case(20.5)) and p(case(-20.5))                        # x beyond 20
    assert not p(case(-20.5, params={"log_ratio_min": -20, "output_max": 10}))   # the case clamps both itself
    assert p(case(-20.5, params={"log_ratio_min": -20}))           # clamped to -20: k3(-20) = 19 + e^-20 > 10
    assert p(case(-20.0, lw=20.0))                                 # w k3(-20) = e^20 (19 + e^-20) > 10
    assert p(case(-25.0, lw=-3.0))                                 # x beyond -20 although w k3 = 1.19
    assert not p(case(-25.0, lw=-3.0, params={"log_ratio_min": -20}))
    assert not p(case(20.0, lw=-20.0))                             # w k3(20) = 1 - 21 e^-20 < 10: the fuzz example
    assert p(case(20.0))                                           # k3(20) = 4.9e8
    assert not p(case(20.0, params={"output_max": 10}))            # the case clamps the value itself
    assert p(case(3.0)) and not p(case(2.0))                        # k3(3) = 16.1, k3(2) = 4.4
    assert not p(case(1 / 64)) and not p(case(0.0)) and not p(case(30.0, mask=False))
    loss = _case("loss.grpo", {"kl_estimator": "k3_unbiased", "beta": 0.04}, logprobs=[[-1.0]],
                 old_logprobs=[[-1.0]], ref_logprobs=[[24.0]], mask=[[True]], advantages=[1.0])
    assert p(loss)
    assert "k3_unbiased_beyond_20_or_10_unclamped" in predicates.predicates()


def test_k2_score_nonfinite_or_overflowing_masked_needs_a_k2_score_and_masked_junk():
    p = predicates.k2_score_nonfinite_or_overflowing_masked
    junk = dict(logprobs=[[-1.0, float("nan")]], ref_logprobs=[[-1.5, 0.0]], mask=[[True, False]])
    clean = dict(logprobs=[[-1.0, -2.0]], ref_logprobs=[[-1.5, 0.0]], mask=[[True, False]])
    huge = dict(logprobs=[[-1.0, -3.004e38]], ref_logprobs=[[-1.5, 0.0]], mask=[[True, False]])
    assert p(_case("kl.k2", **junk)) and p(_case("kl.k3_straight_through", **junk)) and p(_case("kl.k2", **huge))
    assert not p(_case("kl.k2", **clean)) and not p(_case("kl.k3", **junk)) and not p(_case("kl.k1", **junk))
    rec = dict(junk, old_logprobs=[[-1.0, -1.0]], advantages=[1.0])
    assert p(_case("loss.dapo", {"beta": "0.04", "kl_estimator": "k2"}, **rec))
    assert p(_case("loss.dapo", {"beta": 0.25, "kl_estimator": "k3_straight_through"}, **rec))
    assert not p(_case("loss.dapo", {"beta": "0.04", "kl_estimator": "k3"}, **rec))     # no k2 score
    assert not p(_case("loss.dapo", {"beta": 0, "kl_estimator": "k2"}, **rec))          # no KL term
    assert not p(_case("loss.dapo", {"beta": 0.25, "kl_estimator": "k2"}, **dict(rec, logprobs=[[-1.0, -2.0]])))
    assert "k2_score_nonfinite_or_overflowing_masked" in predicates.predicates()


def test_kl_term_with_is_weight_needs_both_a_kl_term_and_an_is_level():
    p = predicates.kl_term_with_is_weight
    ins = dict(logprobs=[[-1.0]], old_logprobs=[[-1.0]], sampler_logprobs=[[-1.5]], ref_logprobs=[[-0.5]],
               mask=[[True]], advantages=[0.0])
    assert p(_case("loss.cispo", {"is_level": "token", "beta": 0.04}, **ins))
    assert p(_case("loss.grpo", {"is_level": "geometric"}, **ins))                  # loss.grpo's beta 0.04 default
    assert not p(_case("loss.grpo", {"is_level": "token", "beta": 0}, **ins))
    assert not p(_case("loss.cispo", {"beta": 0.04}, **ins))                       # is_level none (default)
    assert not p(_case("kl.k3", {}, logprobs=[[-1.0]], ref_logprobs=[[-0.5]], mask=[[True]]))
    assert "kl_term_with_is_weight" in predicates.predicates()


def test_nonfinite_or_huge_masked_leaves_out_a_merely_overflowing_log_ratio():
    f = "loss.grpo"
    base = dict(logprobs=[[-1.0, -1.0]], old_logprobs=[[-1.0, -1.0]], mask=[[True, False]])
    huge = _case(f, advantages=[[0.5, 3.004e38]], **base)
    assert predicates.nonfinite_or_huge_masked(huge) and not predicates.nonfinite_masked(huge)
    assert not predicates.nonfinite_or_huge_masked(_case(f, advantages=[[3.004e38, 0.5]], **base))   # unmasked
    assert predicates.nonfinite_or_huge_masked(_case(f, advantages=[[0.5, float("nan")]], **base))
    far = _case(f, advantages=[[0.5, 0.5]], **dict(base, old_logprobs=[[-1.0, -1001.0]]))
    assert predicates.nonfinite_or_overflowing_masked(far) and not predicates.nonfinite_or_huge_masked(far)
    # a huge masked log-prob (ratio 1 there) is no overflowing per-token loss: the k2 square overflows instead
    junk = _case(f, {"beta": 0.25, "kl_estimator": "k2"}, advantages=[0.5], ref_logprobs=[[-1.0, 0.0]],
                 **dict(base, logprobs=[[-1.0, 3.004e38]], old_logprobs=[[-1.0, 3.004e38]]))
    assert not predicates.nonfinite_or_huge_masked(junk)
    assert predicates.k2_score_nonfinite_or_overflowing_masked(junk)
    # where the log-prob is a factor of the per-token loss (CISPO's -w A l), a huge one overflows it (SkyRL)
    assert predicates.nonfinite_or_huge_masked(_case("loss.cispo", {}, advantages=[0.25], logprobs=[[-1.0, 3.004e38]],
                                                     old_logprobs=[[-1.0, -1.5]], mask=[[True, False]]))
    assert "nonfinite_or_huge_masked" in predicates.predicates()


def test_log_ratio_overflows_float64_past_709_78_at_an_unmasked_token():
    p = predicates_precision.log_ratio_overflows_float64
    f = "surrogate.ppo_clip"
    row = dict(mask=[[True, False]], advantages=[[0.0, 0.0]])
    assert p(_case(f, logprobs=[[0.0, 0.0]], old_logprobs=[[-768.0, 0.0]], **row))
    assert p(_case(f, logprobs=[[-768.0, 0.0]], old_logprobs=[[0.0, 0.0]], **row))           # either sign
    assert not p(_case(f, logprobs=[[0.0, 0.0]], old_logprobs=[[-709.5, 0.0]], **row))      # e^709.5 is finite
    assert not p(_case(f, logprobs=[[0.0, 0.0]], old_logprobs=[[-200.0, 0.0]], **row))      # float32's regime only
    assert not p(_case(f, logprobs=[[0.0, 0.0]], old_logprobs=[[0.0, -768.0]], **row))      # masked
    assert p(_case("kl.k3", logprobs=[[-768.0, 0.0]], ref_logprobs=[[0.0, 0.0]], mask=[[True, False]]))
    assert "log_ratio_overflows_float64" in predicates.predicates()

def test_entropy_quantile_float32_keep_differs_where_a_float32_position_rounds_onto_a_tie():
    p = predicates_precision.entropy_quantile_float32_keep_differs
    f = "mask.entropy_quantile"
    eight = dict(entropy=[[0.0] * 7 + [0.03125]], mask=[[True] * 8])
    seven = dict(entropy=[[0.0] * 5 + [0.03125, 0.0625]], mask=[[True] * 7])
    # the fuzzer's levels: h = 6 + 4.55e-13 and 5 + 3.96e-13 lie outside the tie window (2^-44 (n - 1)), the
    # spec's q just above x_h; torch.quantile's float32 position fl32(1 - rho) (n - 1) rounds to the integer
    assert p(_case(f, {"top_entropy_quantile": 1 / 7 - 6.5e-14}, **eight))
    assert p(_case(f, {"top_entropy_quantile": 1 / 6 - 6.6e-14}, **seven))
    # inside the tie window both take the integer; far from it both interpolate alike
    assert not p(_case(f, {"top_entropy_quantile": 1 / 7 - 2e-14}, **eight))
    assert not p(_case(f, {"top_entropy_quantile": 1 / 7}, **eight))
    assert not p(_case(f, {"top_entropy_quantile": 0.125}, **eight))
    assert not p(_case(f, {"top_entropy_quantile": "0.3"}, entropy=[[0.5, 1.0, 2.0, 3.0]], mask=[[True] * 4]))
    # the window's outside edge (rho = 0.25 - 3 * 2^-45, n = 5, a top entropy of 2^20): q = 2 + 3.6e-7 drops H = 2
    five = dict(entropy=[[0.5, 1.0, 1.5, 2.0, 1048576.0]], mask=[[True] * 5])
    assert p(_case(f, {"top_entropy_quantile": 0.25 - 3 * 2.0 ** -45}, **five))
    assert not p(_case(f, {"top_entropy_quantile": 0.25 - 2.0 ** -44}, **five))     # on the edge: taken as 3
    # masked entropies are not in the quantile; a loss.* recipe reads entropy_quantile
    masked = dict(entropy=[[0.0] * 7 + [0.03125, "nan"]], mask=[[True] * 8 + [False]])
    assert p(_case(f, {"top_entropy_quantile": 1 / 7 - 6.5e-14}, **masked))
    assert p(_case("loss.grpo", {"entropy_quantile": 1 / 7 - 6.5e-14}, **eight))
    assert not p(_case("loss.grpo", {}, **eight))
    assert not p(_case(f, {"top_entropy_quantile": 1 / 7 - 6.5e-14}, entropy=[[0.0, "nan"]], mask=[[True, True]]))
    assert "entropy_quantile_float32_keep_differs" in predicates.predicates()


def test_entropy_quantile_float32_differs_where_the_position_is_large_against_its_fraction():
    p = predicates_precision.entropy_quantile_float32_differs
    f = "mask.entropy_quantile"
    seven = dict(entropy=[[0.0] * 6 + [0.03125]], mask=[[True] * 7])
    # the fuzzer's example (ms-swift): h = 5.4, h32 = 5.39999962: q = 1/80 is 16 float32 ulps off, no keep changes
    assert p(_case(f, {"top_entropy_quantile": 0.1}, **seven))
    assert not predicates_precision.entropy_quantile_float32_keep_differs(_case(f, {"top_entropy_quantile": 0.1}, **seven))
    # the same position next to large entropies: the step is small against q, the float32 tolerance holds it
    assert not p(_case(f, {"top_entropy_quantile": 0.1}, entropy=[[1.0] * 6 + [1.03125]], mask=[[True] * 7]))
    assert not p(_case(f, {"top_entropy_quantile": 0.5}, **seven))      # h = 3 exactly, in float32 too
    assert not p(_case(f, {"top_entropy_quantile": "0.3"}, entropy=[[0.5, 1.0, 2.0, 3.0]], mask=[[True] * 4]))
    # the keep differences of the predicate it extends, and a recipe reads keep only
    assert p(_case(f, {"top_entropy_quantile": 1 / 7 - 6.5e-14}, entropy=[[0.0] * 7 + [0.03125]], mask=[[True] * 8]))
    assert not p(_case("loss.grpo", {"entropy_quantile": 0.1}, **seven))
    assert "entropy_quantile_float32_differs" in predicates.predicates()


def test_masked_logits_overflow_float32_once_divided_by_the_temperature():
    big = 1.765625 * 2.0 ** 127          # 3.004e38, finite in float32
    f = "logprob.token"
    row = dict(logits=[[[1.0, 2.0, 0.5], [big, 1.0, -big]]], targets=[[1, 0]], mask=[[True, False]])
    p = predicates_precision.masked_logits_overflow_float32
    assert p(_case(f, {"temperature": "0.1"}, **row))
    assert not p(_case(f, {}, **row))                               # 3.004e38 itself fits float32
    assert p(_case(f, {"logit_scale": 2}, **row))                   # s z overflows
    assert not p(_case(f, {"temperature": "0.1", "softcap": 30}, **row))   # capped at 30 / 0.1
    assert not p(_case(f, {"temperature": "0.1"}, logits=row["logits"], targets=[[1, 0]], mask=[[True, True]]))
    assert not p(_case(f, {"temperature": 0}, **row))              # a rejected temperature: no transform
    assert predicates.nonfinite_or_overflowing_masked(_case(f, {"temperature": "0.1"}, **row))
    assert not predicates.nonfinite_or_overflowing_masked(_case(f, {}, **row))


def test_log_normalizer_above_8_after_the_transform():
    p = predicates_precision.log_normalizer_above_8
    f = "logprob.token"
    row = dict(logits=[[[0.0, 0.0, 2.625, 3.25]]], targets=[[0]], mask=[[True]])
    assert p(_case(f, {"logit_scale": 10, "temperature": "0.5"}, **row))     # z' up to 65: log Z = 65 + 3.7e-6
    assert not p(_case(f, {}, **row))                                         # log Z = 3.6
    assert not p(_case(f, {"logit_scale": 10, "temperature": "0.5"}, logits=row["logits"], targets=[[0]],
                       mask=[[False]]))                                       # masked
    assert p(_case(f, {}, logits=[[[-20.0, -30.0]]], targets=[[0]], mask=[[True]]))   # |log Z| = 20, below 0
    assert not p(_case(f, {"softcap": 2}, logits=[[[20.0, 30.0]]], targets=[[0]], mask=[[True]]))  # capped at 2
    assert "log_normalizer_above_8" in predicates.predicates()


def test_kl_gradient_paths_cancel_at_zero_log_ratio_needs_a_k3_term_and_an_on_reference_token():
    p = predicates_precision.kl_gradient_paths_cancel_at_zero_log_ratio
    base = dict(logprobs=[[0.0, -0.015625]], old_logprobs=[[-2.0, -0.015625]], mask=[[True, True]],
                advantages=[0.125], ref_logprobs=[[-2.0, -0.015625]])
    k3 = {"beta": "0.04", "kl_estimator": "k3"}
    assert p(_case("loss.vespo", k3, **base))
    assert p(_case("loss.cispo", dict(k3, kl_estimator="k3_unbiased"), **base))
    assert not p(_case("loss.vespo", dict(k3, beta=0), **base))                 # no KL term
    assert not p(_case("loss.vespo", dict(k3, kl_estimator="k2"), **base))      # k2's gradient x is one path
    assert not p(_case("kl.k3", {}, **base))                                    # a recipe's KL term only
    assert not p(_case("loss.vespo", k3, **dict(base, mask=[[True, False]])))   # the x = 0 token is masked
    assert not p(_case("loss.vespo", k3, **dict(base, ref_logprobs=[[-2.0, -0.0078125]])))
    assert "kl_gradient_paths_cancel_at_zero_log_ratio" in predicates.predicates()


def test_rollout_log_ratio_beyond_20_reads_a_recipes_is_options():
    p = predicates.rollout_log_ratio_beyond_20
    base = dict(logprobs=[[-201.0, -1.0]], old_logprobs=[[-201.0, -1.0]], sampler_logprobs=[[-1.0, -1.0]],
                mask=[[True, True]], advantages=[0.5])
    assert p(_case("loss.grpo", {"is_level": "token"}, **base))
    assert not p(_case("loss.grpo", {}, **base))                                          # no IS correction
    assert not p(_case("loss.grpo", {"is_level": "token", "is_log_ratio_clamp": 20}, **base))
    assert p(_case("loss.grpo", {"is_level": "token", "log_ratio_clamp": 20}, **base))   # the policy's clamp
    assert not p(_case("loss.grpo", {"is_level": "token"}, **dict(base, sampler_logprobs=[[-200.0, -1.0]])))
    is_base = {k: v for k, v in base.items() if k not in ("advantages", "logprobs")}
    assert p(_case("is.token.truncate", {}, **is_base))
    assert not p(_case("is.token.truncate", {"log_ratio_clamp": 20}, **is_base))


def test_kl_term_small_log_ratio_zero_included():
    p = predicates_precision.kl_term_small_log_ratio
    base = dict(logprobs=[[-0.015625, -1.0]], old_logprobs=[[-0.015625, -1.0]], mask=[[True, True]],
                advantages=[0.0], ref_logprobs=[[-0.015625, -2.0]])
    assert p(_case("loss.grpo", {}, **base))                                   # default beta 0.04, k3; x = 0
    assert p(_case("loss.dapo", {"beta": 0.04, "kl_estimator": "k3_unbiased"},
                   **dict(base, ref_logprobs=[[-0.03125, -2.0]])))              # |x| = 1/64
    assert not p(_case("loss.grpo", {"beta": 0}, **base))
    assert not p(_case("loss.grpo", {"kl_estimator": "k2"}, **base))
    assert not p(_case("loss.grpo", {}, **dict(base, ref_logprobs=[[-0.125, -2.0]])))    # |x| = 0.11, 1
    assert not p(_case("loss.grpo", {}, **dict(base, mask=[[False, True]])))
    assert "kl_term_small_log_ratio" in predicates.predicates()


def test_k3_log_ratio_beyond_40_unclamped_after_the_cases_own_clamp():
    p = predicates_clamps.k3_log_ratio_beyond_40_unclamped
    row = dict(logprobs=[[0.0]], ref_logprobs=[[-768.0]], mask=[[True]])
    assert p(_case("kl.k3", {}, **row))                                          # x = -768
    assert not p(_case("kl.k3", {"log_ratio_min": -20}, **row))                  # the case clamps it to -20
    assert not p(_case("kl.k3", {}, logprobs=[[0.0]], ref_logprobs=[[-40.0]], mask=[[True]]))   # on the bound
    assert not p(_case("kl.k1", {}, **row))
    recipe = dict(row, old_logprobs=[[0.0]], advantages=[0.5])
    assert p(_case("loss.grpo", {}, **recipe)) and not p(_case("loss.grpo", {"beta": 0}, **recipe))
    assert "k3_log_ratio_beyond_40_unclamped" in predicates.predicates()



def test_geometric_token_log_ratio_beyond_20_whatever_the_cases_clamp():
    p = predicates_clamps.geometric_token_log_ratio_beyond_20
    row = dict(old_logprobs=[[-0.015625, -1.0]], sampler_logprobs=[[-0.015625, -201.0]], mask=[[True, True]])
    assert p(_case("is.geometric.truncate", {"log_ratio_clamp": 20}, **row))    # the mean 100 is clamped, a token not
    assert p(_case("is.geometric.mask", {}, **row))
    assert not p(_case("is.token.truncate", {}, **row))                         # a token level: the clamps agree
    assert not p(_case("is.geometric.truncate", {}, **dict(row, mask=[[True, False]])))
    assert not p(_case("is.geometric.truncate", {}, **dict(row, sampler_logprobs=[[-0.015625, -21.0]])))
    recipe = dict(row, logprobs=[[-0.015625, -1.0]], advantages=[0.5])
    assert p(_case("loss.grpo", {"is_level": "geometric"}, **recipe)) and not p(_case("loss.grpo", {"is_level": "token"}, **recipe))
    assert "geometric_token_log_ratio_beyond_20" in predicates.predicates()


def test_a_rules_inputs_float64_replace_its_inputs_in_a_float64_run(tmp_path):
    from pgspec.conformance.verdicts.declarations import DeclarationError, load

    path = tmp_path / "deviations.toml"
    path.write_text('''[[rule]]
ids = ["surrogate.*"]
when = { inputs = ["large_log_ratio"], inputs_float64 = ["log_ratio_overflows_float64"] }
kind = "bug"
cause = "exp-overflow"
reason = "r"
link = "l"
''')
    rule = load(path).rules[0]
    base = dict(mask=[[True]], advantages=[[0.0]], logprobs=[[0.0]])
    at200 = dict(_case("surrogate.ppo_clip", **base, old_logprobs=[[-200.0]]), id="surrogate.ppo_clip/a200")
    at768 = dict(_case("surrogate.ppo_clip", **base, old_logprobs=[[-768.0]]), id="surrogate.ppo_clip/a768")
    assert rule.conditions_hold(at200, "float32") and rule.conditions_hold(at768, "float32")
    assert not rule.conditions_hold(at200, "float64") and rule.conditions_hold(at768, "float64")
    assert rule.conditions_hold(at200) and rule.conditions_hold(at768)       # no dtype: either set
    d = load(path)
    assert d.rules_for(at200["id"], "surrogate.ppo_clip", "float64", at200) == ()
    assert d.rules_for(at768["id"], "surrogate.ppo_clip", "float64", at768) == (rule,)
    path.write_text(path.read_text().replace('kind = "bug"', 'dtypes = ["float32"]\nkind = "bug"'))
    with pytest.raises(DeclarationError, match="inputs_float64"):
        load(path)
