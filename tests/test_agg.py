"""Tests of the agg family: gradients, precision, published anchors, scope identities, errors and an
independent float64 check."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import check_gradient_fd, check_precision, random_logprobs, random_mask
from pgspec.reference import SpecError, evaluate

Q = [[0.5, -1.25, 2.0, 3.0], [-0.75, 1.5, 0.25, -2.0], [4.0, 0.125, -3.5, 1.0]]
M = [[True, True, True, False], [True, True, False, False], [True, True, True, True]]
GROUPS = [7, 7, 3]
DOCS = [[0, 0, 1, 1], [1, 2, 2, 2], [3, 3, 3, 4]]
BASE = {"values": Q, "mask": M}

CASES = [
    ("agg.token_mean", {}, {}),
    ("agg.token_mean", {"num_tokens": 20, "eps": "1e-8"}, {}),
    ("agg.sample_mean", {}, {}),
    ("agg.sample_mean", {"num_sequences": 8, "sequence_token_counts": [5, 2, 9], "eps_length": "1e-8"}, {}),
    ("agg.seq_mean_token_sum", {}, {}),
    ("agg.constant", {"divisor": 4096}, {}),
    ("agg.constant", {"divisor": "2.5", "divide_by": "K"}, {}),
    ("agg.prompt_mean", {}, {"group_ids": GROUPS}),
    ("agg.prompt_mean", {"num_groups": 5, "group_token_counts": [11, 11, 4]}, {"group_ids": GROUPS}),
    ("agg.document_mean", {}, {"document_ids": DOCS}),
    ("agg.document_mean", {"num_documents": 9}, {"document_ids": DOCS}),
]
IDS = ["agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
       "agg.document_mean"]
EXTRA = {"agg.prompt_mean": {"group_ids": GROUPS}, "agg.document_mean": {"document_ids": DOCS}}
NEEDED = {"agg.constant": {"divisor": 3000}}


def frac(a, b):
    """a / b at the reference's working precision."""
    with mp.workdps(60):
        return mpf(a) / b


def run(fid, values, mask, params=None, **extra):
    inputs = {"values": values, "mask": mask, **EXTRA.get(fid, {}), **extra}
    return evaluate(fid, inputs, {**NEEDED.get(fid, {}), **(params or {})})


@pytest.mark.parametrize("fid,params,extra", CASES)
def test_gradient_matches_finite_difference(fid, params, extra):
    assert check_gradient_fd(fid, {**BASE, **extra}, params, h="1e-30") == 9


@pytest.mark.parametrize("fid,params,extra", CASES)
def test_precision_60_vs_100_digits(fid, params, extra):
    check_precision(fid, {**BASE, **extra}, params)
    extreme = [[1e30, -2.0 ** -20, 3.0, 0.0], [-1e-30, 2.0 ** -20, 1.0, 1.0], [1e300, -1e300, 7.0, 2.0 ** -40]]
    check_precision(fid, {"values": extreme, "mask": M, **extra}, params)


# Published anchors -------------------------------------------------------------------------------
def test_verl_593_token_mean_vs_sample_mean_2x10():
    """verl#593: 3.3333 (token mean) vs 6.0 (sample mean) on a 2x10 batch.  The research records only
    the two numbers; this 2x10 batch (arange(20) reshaped, 5 and 1 valid tokens) reproduces both."""
    values = [[float(10 * i + t) for t in range(10)] for i in range(2)]
    mask = [[t < 5 for t in range(10)], [t < 1 for t in range(10)]]
    tm = run("agg.token_mean", values, mask)["value"]
    sm = run("agg.sample_mean", values, mask)["value"]
    with mp.workdps(60):
        assert tm == mpf(20) / 6 and mp.nstr(tm, 5) == "3.3333"   # (0+1+2+3+4 + 10) / 6
        assert sm == 6                                             # (2 + 10) / 2


def test_verl_agg_loss_vector_3x5():
    """verl 0.9.1 agg_loss on arange(15) [3,5], masks (1,1,1,0,0), (1,1,1,1,1), (1,0,0,0,0)
    (research verl_openrlhf_areal_skyrl.md section 8, vector 9)."""
    values = [[float(5 * i + t) for t in range(5)] for i in range(3)]
    mask = [[t < 3 for t in range(5)], [True] * 5, [t < 1 for t in range(5)]]
    assert run("agg.token_mean", values, mask)["value"] == frac(48, 9)          # 5.3333
    assert run("agg.seq_mean_token_sum", values, mask)["value"] == 16
    assert run("agg.sample_mean", values, mask)["value"] == 6
    # seq-mean-token-sum-norm: verl's default K is the mask width T = 5
    assert run("agg.constant", values, mask, {"divisor": 5})["value"] == frac(16, 5)  # 3.2


def test_skyrl_sequence_mean_counts_empty_rows():
    """One empty row of three: SkyRL 0.3.1 sequence_mean = 2/3 of verl's seq-mean-token-mean."""
    rng = random.Random(5)
    values = random_logprobs(rng, 3, 4)
    mask = [[True, True, False, False], [False] * 4, [True, True, True, True]]
    verl = run("agg.sample_mean", values, mask)["value"]
    skyrl = run("agg.sample_mean", values, mask, {"count_empty_sequences": True})["value"]
    with mp.workdps(60):
        assert abs(skyrl - verl * 2 / 3) < mpf(10) ** -55


# Dr.GRPO constant divisor --------------------------------------------------------------------------
def test_constant_is_linear_in_the_token_sum_and_padding_invariant():
    values, mask = [[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]], [[True, True, False], [True, False, False]]
    r = run("agg.constant", values, mask, {"divisor": 3000})
    assert r["value"] == frac(11, 6000)                      # (1 + 2 + 8) / (3000 * 2)
    assert r["grad"]["values"] == [[frac(1, 6000)] * 2 + [0], [frac(1, 6000), 0, 0]]
    doubled = run("agg.constant", [[2 * x for x in row] for row in values], mask, {"divisor": 3000})
    with mp.workdps(60):
        assert doubled["value"] == 2 * r["value"]
    padded_v = [row + [float("nan")] * 5 for row in values]
    padded_m = [row + [False] * 5 for row in mask]
    padded = run("agg.constant", padded_v, padded_m, {"divisor": 3000})
    assert padded["value"] == r["value"] and [g[:3] for g in padded["grad"]["values"]] == r["grad"]["values"]
    # verl seq-mean-token-sum-norm's default K = the padded width T is not padding invariant
    assert run("agg.constant", values, mask, {"divisor": 3})["value"] != run(
        "agg.constant", padded_v, padded_m, {"divisor": 8})["value"]
    assert run("agg.constant", values, mask, {"divisor": 4, "divide_by": "K"})["value"] == frac(11, 4)


# Scope identities --------------------------------------------------------------------------------
def test_global_token_count_makes_shards_add_up():
    whole = run("agg.token_mean", Q, M)["value"]
    parts = [run("agg.token_mean", [Q[i]], [M[i]], {"num_tokens": 9})["value"] for i in range(3)]
    with mp.workdps(60):
        assert abs(mp.fsum(parts) - whole) < mpf(10) ** -58
    split_s = [run("agg.sample_mean", [Q[i]], [M[i]], {"num_sequences": 3})["value"] for i in range(3)]
    with mp.workdps(60):
        assert abs(mp.fsum(split_s) - run("agg.sample_mean", Q, M)["value"]) < mpf(10) ** -58


def test_prompt_mean_special_cases_and_split_groups():
    # one group = token mean; one sequence per group = sample mean
    one = run("agg.prompt_mean", Q, M, group_ids=[1, 1, 1])["value"]
    assert one == run("agg.token_mean", Q, M)["value"]
    singles = run("agg.prompt_mean", Q, M, group_ids=[1, 2, 3])["value"]
    with mp.workdps(60):
        assert abs(singles - run("agg.sample_mean", Q, M)["value"]) < mpf(10) ** -58
    # prompt mean by hand: group 7 = rows 0,1 (5 tokens), group 3 = row 2 (4 tokens)
    want = ((0.5 - 1.25 + 2.0 - 0.75 + 1.5) / 5 + (4.0 + 0.125 - 3.5 + 1.0) / 4) / 2
    assert float(run("agg.prompt_mean", Q, M)["value"]) == want
    # group 7 split over two shards: each shard gets the group's whole token count and P = 2
    shards = [run("agg.prompt_mean", [Q[i]], [M[i]], {"num_groups": 2, "group_token_counts": [c]},
                  group_ids=[GROUPS[i]])["value"] for i, c in enumerate([5, 5, 4])]
    with mp.workdps(60):
        assert abs(mp.fsum(shards) - run("agg.prompt_mean", Q, M)["value"]) < mpf(10) ** -58


def test_document_mean_definition_and_split_documents():
    # documents: 0 -> (0,0),(0,1); 1 -> (0,2),(1,0); 2 -> (1,1); 3 -> (2,0),(2,1),(2,2); 4 -> (2,3)
    want = ((0.5 - 1.25) / 2 + (2.0 - 0.75) / 2 + 1.5 + (4.0 + 0.125 - 3.5) / 3 + 1.0) / 5
    r = run("agg.document_mean", Q, M)
    assert math.isclose(float(r["value"]), want, rel_tol=1e-15)
    assert r["grad"]["values"][1][0] == frac(1, 10) and r["grad"]["values"][2][3] == frac(1, 5)
    # one document per row = sample mean
    per_row = run("agg.document_mean", Q, M, document_ids=[[0] * 4, [1] * 4, [2] * 4])["value"]
    with mp.workdps(60):
        assert abs(per_row - run("agg.sample_mean", Q, M)["value"]) < mpf(10) ** -58
    # document 1 spans rows 0 and 1: row shards with the global counts add up
    counts = [[2, 2, 2, None], [2, 1, None, None], [3, 3, 3, 1]]
    shards = [run("agg.document_mean", [Q[i]], [M[i]], {"num_documents": 5, "document_token_counts": [counts[i]]},
                  document_ids=[DOCS[i]])["value"] for i in range(3)]
    with mp.workdps(60):
        assert abs(mp.fsum(shards) - r["value"]) < mpf(10) ** -58


def test_all_masked_batch_gives_zero_and_zero_gradient():
    mask = [[False] * 4] * 3
    for fid in IDS:
        r = run(fid, Q, mask)
        assert r["value"] == 0 and all(g == 0 for row in r["grad"]["values"] for g in row), fid
    assert run("agg.token_mean", Q, mask, {"eps": "1e-8"})["value"] == 0


def test_empty_sequence_contributes_zero():
    mask = [M[0], [False] * 4, M[2]]
    r = run("agg.sample_mean", Q, mask, {"count_empty_sequences": True})
    with mp.workdps(60):
        want = (mp.fsum([mpf(0.5), mpf(-1.25), mpf(2.0)]) / 3 + mp.fsum([4, mpf(0.125), mpf(-3.5), 1]) / 4) / 3
        assert abs(r["value"] - want) < mpf(10) ** -58


def test_nan_and_inf_at_masked_positions_never_reach_results():
    dirty = [row[:] for row in Q]
    dirty[0][3], dirty[1][2], dirty[1][3] = float("nan"), float("inf"), float("-inf")
    for fid, params, extra in CASES:
        assert evaluate(fid, {"values": dirty, "mask": M, **extra}, params) == evaluate(fid, {**BASE, **extra}, params)


def test_errors_name_the_argument():
    with pytest.raises(SpecError, match="'num_tokens' = 5 is smaller than .* \\(9\\)"):
        run("agg.token_mean", Q, M, {"num_tokens": 5})
    with pytest.raises(SpecError, match="'num_tokens' must be integer in \\[0, \\+inf\\)"):
        run("agg.token_mean", Q, M, {"num_tokens": -1})
    with pytest.raises(SpecError, match="'divisor' is required"):
        evaluate("agg.constant", BASE)
    for bad in (0, -3):
        with pytest.raises(SpecError, match="'divisor' must be real in \\(0, \\+inf\\)"):
            run("agg.constant", Q, M, {"divisor": bad})
    with pytest.raises(SpecError, match="'divide_by' must be one of"):
        run("agg.constant", Q, M, {"divide_by": "N"})
    with pytest.raises(SpecError, match="'sequence_token_counts'\\[1\\] = 1 is smaller than the 2"):
        run("agg.sample_mean", Q, M, {"sequence_token_counts": [3, 1, 4]})
    with pytest.raises(SpecError, match="'sequence_token_counts' must have one entry per sequence \\(B=3\\)"):
        run("agg.sample_mean", Q, M, {"sequence_token_counts": [3, 2]})
    with pytest.raises(SpecError, match="'sequence_token_counts'\\[0\\] must be an integer >= 0"):
        run("agg.sample_mean", Q, M, {"sequence_token_counts": [-3, 2, 4]})
    with pytest.raises(SpecError, match="'eps_count' must be real in \\[0"):
        run("agg.sample_mean", Q, M, {"eps_count": -1e-8})
    with pytest.raises(SpecError, match="'group_token_counts' must be the same for every sequence of a group; group 7"):
        run("agg.prompt_mean", Q, M, {"group_token_counts": [5, 6, 4]})
    with pytest.raises(SpecError, match="'num_groups' = 1 is smaller than"):
        run("agg.prompt_mean", Q, M, {"num_groups": 1})
    with pytest.raises(SpecError, match="missing input 'group_ids'"):
        evaluate("agg.prompt_mean", BASE)
    with pytest.raises(SpecError, match="input 'group_ids' must have shape \\[B\\]"):
        evaluate("agg.prompt_mean", {**BASE, "group_ids": [1, 2]})
    with pytest.raises(SpecError, match="'document_token_counts' must hold the same integer .* document 1"):
        run("agg.document_mean", Q, M, {"document_token_counts": [[2, 2, 2, 0], [3, 1, 0, 0], [3, 3, 3, 1]]})
    with pytest.raises(SpecError, match="'document_token_counts' must have the shape of 'mask'"):
        run("agg.document_mean", Q, M, {"document_token_counts": [[2, 2, 2, 0]]})
    with pytest.raises(SpecError, match="document_ids\\[0\\]\\[1\\] must be an integer"):
        evaluate("agg.document_mean", {**BASE, "document_ids": [[0, 0.5, 1, 1], [1, 2, 2, 2], [3, 3, 3, 4]]})
    with pytest.raises(SpecError, match="values\\[0\\]\\[0\\] must be finite"):
        evaluate("agg.token_mean", {"values": [[float("inf")]], "mask": [[True]]})


# An independent float64 implementation, written from the spec text alone -------------------------
def np_aggregates(q, m, groups, docs, K):
    q, m = np.asarray(q, dtype=np.float64), np.asarray(m, dtype=bool)
    qm = np.where(m, q, 0.0)
    L = m.sum(1)
    row_sums = qm.sum(1)
    nonempty = L > 0
    out = {"agg.token_mean": qm.sum() / L.sum() if L.sum() else 0.0}
    out["agg.sample_mean"] = (row_sums[nonempty] / L[nonempty]).sum() / nonempty.sum() if nonempty.any() else 0.0
    out["agg.seq_mean_token_sum"] = row_sums.sum() / nonempty.sum() if nonempty.any() else 0.0
    out["agg.constant"] = row_sums.sum() / (K * len(q))
    g = np.asarray(groups)
    terms = [row_sums[g == k].sum() / L[g == k].sum() for k in np.unique(g) if L[g == k].sum() > 0]
    out["agg.prompt_mean"] = sum(terms) / len(terms) if terms else 0.0
    d = np.asarray(docs)
    terms = [qm[(d == k) & m].sum() / ((d == k) & m).sum() for k in np.unique(d[m])]
    out["agg.document_mean"] = sum(terms) / len(terms) if terms else 0.0
    return out


def test_agrees_with_independent_float64_numpy():
    rng = random.Random(2024)
    for _ in range(12):
        B, T = rng.randint(1, 5), rng.randint(1, 9)
        q = random_logprobs(rng, B, T)
        mask = random_mask(rng, B, T, min_len=0)
        groups = [rng.randint(0, 2) for _ in range(B)]
        docs = [[rng.randint(0, 3) for _ in range(T)] for _ in range(B)]
        want = np_aggregates(q, mask, groups, docs, 3000)
        for fid in IDS:
            ids = {"agg.prompt_mean": {"group_ids": groups}, "agg.document_mean": {"document_ids": docs}}
            got = run(fid, q, mask, **ids.get(fid, {}))["value"]
            # every value is a (nested) sum of at most B*T same-sign terms (all q < 0) and at most three
            # divisions: the float64 relative error is at most (B*T + 3) u with u = 2^-53.
            assert math.isclose(float(got), want[fid], rel_tol=(B * T + 3) * 2.0 ** -53, abs_tol=0.0) or \
                got == want[fid] == 0, (fid, float(got), want[fid])


def test_eps_placement_nemo_rl_style():
    """NeMo-RL: 1/(N_seq + 1e-8) * sum_i sum_t m q / (L_i + 1e-8); token level sum / (N_tok + 1e-8)."""
    p = {"eps_length": "1e-8", "eps_count": "1e-8"}
    got = run("agg.sample_mean", Q, M, p)["value"]
    tok = run("agg.token_mean", Q, M, {"eps": "1e-8"})["value"]
    with mp.workdps(60):
        e = mpf("1e-8")
        rows = [mp.fsum(mpf(q) for q, m in zip(Q[i], M[i]) if m) for i in range(3)]
        assert abs(got - mp.fsum(r / (sum(M[i]) + e) for i, r in enumerate(rows)) / (3 + e)) < mpf(10) ** -58
        assert abs(tok - mp.fsum(rows) / (9 + e)) < mpf(10) ** -58


def test_plain_functions_and_registry_metadata():
    import json

    from pgspec.reference import REGISTRY
    from pgspec.reference.agg import constant, token_mean

    with mp.workdps(60):
        vals = [[mpf(1), mpf(2), None], [mpf(4), None, None]]
        mask = [[True, True, False], [True, False, False]]
        assert token_mean(vals, mask) == mpf(7) / 3
        assert token_mean(vals, mask, num_tokens=7) == 1
        assert constant(vals, mask, 7, "K") == 1
    for fid in IDS:
        meta = json.loads(json.dumps(REGISTRY[fid].to_json()))
        assert meta["differentiable"] == ["values"] and meta["grad_of"] == "value"
    assert "required" in REGISTRY["agg.constant"].to_json()["params"][0]["range"]


# agg.prompt_mean's two step divisors (slime PR #2090) -------------------------------------------

def test_prompt_mean_divided_by_sequences_is_groups_over_sequences_times_the_default():
    """Identity: step_divisor 'sequences' = (N_grp / N_seq) x the 'groups' value, on random batches."""
    rng = random.Random(903)
    for _ in range(20):
        G, per = rng.randint(1, 4), rng.randint(1, 4)
        B, T = G * per, 5
        mask = random_mask(rng, B, T)
        values = random_logprobs(rng, B, T, lo=-3.0, hi=3.0)
        groups = [i // per for i in range(B)]
        rng.shuffle(groups)
        inputs = {"values": values, "mask": mask, "group_ids": groups}
        by_groups = evaluate("agg.prompt_mean", inputs)
        by_seqs = evaluate("agg.prompt_mean", inputs, {"step_divisor": "sequences"})
        n_grp = len({g for g, row in zip(groups, mask) if any(row)})
        with mp.workdps(60):
            assert abs(by_seqs["value"] - by_groups["value"] * n_grp / B) <= mpf(10) ** -50
            for gs, gg in zip(by_seqs["grad"]["values"], by_groups["grad"]["values"]):
                for a, b in zip(gs, gg):
                    assert (a is None and b is None) or abs(a - b * n_grp / B) <= mpf(10) ** -50


def test_prompt_mean_slime_2090_factor_p_over_n():
    """4 rollouts of 2 prompts: the sample-count divisor gives exactly half the prompt-count value."""
    inputs = {"values": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [0.5, 0.25, 0.125]],
              "mask": [[True, True, False], [True, False, False], [True, True, False], [True, True, True]],
              "group_ids": [0, 0, 1, 1]}
    with mp.workdps(60):
        want = (mpf(7) / 3 + mpf("15.875") / 5)
        assert abs(evaluate("agg.prompt_mean", inputs)["value"] - want / 2) <= mpf(10) ** -55
        assert abs(evaluate("agg.prompt_mean", inputs, {"step_divisor": "sequences"})["value"] - want / 4) <= mpf(10) ** -55
        assert abs(evaluate("agg.prompt_mean", inputs, {"step_divisor": "sequences", "num_sequences": 16})["value"]
                   - want / 16) <= mpf(10) ** -55
    assert check_gradient_fd("agg.prompt_mean", inputs, {"step_divisor": "sequences"}) == 8


def test_prompt_mean_divisor_parameters_are_exclusive():
    inputs = {"values": Q, "mask": M, "group_ids": [0] * len(M)}
    with pytest.raises(SpecError, match="'num_groups' has no meaning with step_divisor='sequences'"):
        evaluate("agg.prompt_mean", inputs, {"step_divisor": "sequences", "num_groups": 4})
    with pytest.raises(SpecError, match="'num_sequences' applies only to step_divisor='sequences'"):
        evaluate("agg.prompt_mean", inputs, {"num_sequences": 4})
    with pytest.raises(SpecError, match="'num_sequences' = 1 is smaller"):
        evaluate("agg.prompt_mean", inputs, {"step_divisor": "sequences", "num_sequences": 1})
    with pytest.raises(SpecError, match="parameter 'step_divisor'"):
        evaluate("agg.prompt_mean", inputs, {"step_divisor": "prompts"})


def test_slime_refusals_a_non_finite_divisor_and_a_null_group_id():
    """slime #2060/#2090 refuse a divisor that is not > 0, NaN included (pgspec also refuses +inf), and #2090
    raises on Sample.group_index = None: agg.constant and agg.prompt_mean reject both (spec/agg.md)."""
    values, mask = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[True, True], [True, False], [False, False]]
    for divisor in ("nan", float("nan"), "inf", 0, -1):
        with pytest.raises(SpecError, match="parameter 'divisor' must be real in \\(0, \\+inf\\)"):
            evaluate("agg.constant", {"values": values, "mask": mask}, {"divisor": divisor})
    assert evaluate("agg.constant", {"values": values, "mask": mask}, {"divisor": 2, "divide_by": "K"})["value"] == 3
    for ids in ([0, None, 1], [0, 1, None]):   # the null id of an empty row is refused too
        with pytest.raises(SpecError, match="input group_ids\\[\\d\\] must be an integer, got None"):
            evaluate("agg.prompt_mean", {"values": values, "mask": mask, "group_ids": ids})
