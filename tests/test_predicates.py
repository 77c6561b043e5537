"""Input predicates added for OAT's and torchtune's capabilities: mask_gaps and eps_asymmetric."""

from pgspec.conformance.verdicts import predicates


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


def test_ratio_near_clip_bound_leaves_out_an_exact_ratio_at_an_exact_bound():
    def case(d, eps):
        return {"formula": "surrogate.ppo_clip", "params": {"eps_low": eps, "eps_high": eps},
                "inputs": {"logprobs": [[-1.0 + d]], "old_logprobs": [[-1.0]], "mask": [[True]],
                           "advantages": [1.0]}}

    assert not predicates.ratio_near_clip_bound(case(0.0, 0))        # exp(0) = 1 = 1 -+ 0: exact in every dtype
    assert predicates.ratio_near_clip_bound(case(2.0 ** -10, 0))     # 1 + 2^-10 rounds to 1 in bfloat16
    assert predicates.ratio_near_clip_bound(case(0.0, 2.0 ** -9))    # the bound 1 + 2^-9 rounds to 1
