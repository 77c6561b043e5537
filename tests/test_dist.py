"""Tests of the dist family: the zig-zag split, CP rank-sum invariance for every aggregator, micro-batch
invariance with global denominators, Megatron#7452, Fast-LLM SDP segment sums, and a float64 check."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import check_gradient_fd, check_precision, random_logprobs
from pgspec.reference import SpecError, evaluate

AGGS = ["agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
        "agg.document_mean"]
AGG_PARAMS = {"agg.constant": {"divisor": 16}}


def close(a, b, digits=55):
    with mp.workdps(60):
        return abs(a - b) <= mpf(10) ** -digits * max(1, abs(b))


def batch(rng, B, T):
    """Values, a mask with prompt-like masked heads, zero-length rows and rows shorter than 2C."""
    values = random_logprobs(rng, B, T, lo=-4.0, hi=4.0)
    mask = []
    for _ in range(B):
        kind = rng.random()
        if kind < 0.15:
            mask.append([False] * T)                        # length 0
        else:
            start = rng.randint(1, max(1, T // 3))          # prompt of length >= 1 (slime precondition)
            end = rng.randint(start, min(T, start + (2 if kind < 0.4 else T)))
            mask.append([start <= t < end for t in range(T)])
    if B >= 3:   # always one length-0 sequence and one shorter than 2C (n = 2, one token)
        mask[0] = [False] * T
        mask[1] = [t == 1 for t in range(T)]
    groups = [rng.randint(0, 2) for _ in range(B)]
    docs = [[rng.randint(0, 3) for _ in range(T)] for _ in range(B)]
    return values, mask, groups, docs


# dist.cp_split ----------------------------------------------------------------------------------
def test_slime_worked_examples():
    """slime logit ownership, T=12, R=8 (prompt 4): C=2 -> rank 0 owns response {6,7}, rank 1 {0..5};
    C=4 (c=2, padded to 16) -> rank 0 none, rank 1 {0}, rank 2 {1,2,7}, rank 3 {3,4,5,6}
    (research nemorl_slime_fastllm_megatron.md section 3.7)."""
    mask = [[t >= 4 for t in range(12)]]
    r2 = evaluate("dist.cp_split", {"mask": mask}, {"cp_size": 2})
    assert r2["rank"][0][4:] == [1, 1, 1, 1, 1, 1, 0, 0] and r2["chunk_size"] == [3]
    assert r2["tokens_per_rank"] == [2, 6]
    r4 = evaluate("dist.cp_split", {"mask": mask}, {"cp_size": 4})
    owned = {r: [t - 4 for t in range(4, 12) if r4["rank"][0][t] == r] for r in range(4)}
    assert owned == {0: [], 1: [0], 2: [1, 2, 7], 3: [3, 4, 5, 6]} and r4["chunk_size"] == [2]
    assert r4["rank"][0][:4] == [None] * 4


def np_zigzag(mask, C, layout, ownership):
    """Independent zig-zag ownership: build the 2C chunk list of each row and look positions up."""
    m = np.asarray(mask, dtype=bool)
    B, T = m.shape
    out = np.full((B, T), -1)
    for i in range(B):
        idx = np.flatnonzero(m[i])
        n = idx[-1] + 1 if len(idx) else 0
        c = math.ceil((n if layout == "thd" else T) / (2 * C))
        owner_of_chunk = list(range(C)) + list(range(C - 1, -1, -1))   # chunk k -> rank
        for t in idx:
            p = t - 1 if ownership == "logit" else t
            out[i, t] = owner_of_chunk[p // c]
    return out


@pytest.mark.parametrize("layout,ownership", list(itertools.product(["thd", "bshd"], ["logit", "position"])))
def test_split_is_a_partition_and_matches_an_independent_zigzag(layout, ownership):
    rng = random.Random(7)
    for C in (1, 2, 3, 4, 8):
        _, mask, _, _ = batch(rng, 6, rng.randint(3, 20))
        r = evaluate("dist.cp_split", {"mask": mask}, {"cp_size": C, "layout": layout, "ownership": ownership})
        want = np_zigzag(mask, C, layout, ownership)
        for i, row in enumerate(mask):
            for t, m in enumerate(row):
                got = r["rank"][i][t]
                assert (got is None and not m) or (m and got == want[i, t] and 0 <= got < C)
                if m:   # rank r holds exactly chunks r and 2C-1-r
                    assert r["chunk"][i][t] in (got, 2 * C - 1 - got)
        assert sum(r["tokens_per_rank"]) == sum(map(sum, mask))


def test_sequence_lengths_parameter_sets_thd_chunks():
    mask = [[False, True, True, False, False, False]]
    r = evaluate("dist.cp_split", {"mask": mask}, {"cp_size": 2, "sequence_lengths": [6], "ownership": "position"})
    assert r["chunk_size"] == [2] and r["rank"][0][1:3] == [0, 1]     # chunks of 2: [0,1] [2,3] [4,5] [6,7]
    short = evaluate("dist.cp_split", {"mask": mask}, {"cp_size": 2, "ownership": "position"})
    assert short["chunk_size"] == [1] and short["rank"][0][1:3] == [1, 1]  # n = 3 < 2C: chunks of 1


# dist.cp_reduce: rank-sum invariance --------------------------------------------------------------
@pytest.mark.parametrize("aggregator", AGGS)
@pytest.mark.parametrize("layout", ["thd", "bshd"])
def test_cp_rank_sum_invariance(aggregator, layout):
    rng = random.Random(2 * AGGS.index(aggregator) + (layout == "bshd"))
    for C, ownership in ((2, "logit"), (3, "position"), (4, "logit")):
        values, mask, groups, docs = batch(rng, 5, 2 * C + 3)
        inputs = {"values": values, "mask": mask, "group_ids": groups, "document_ids": docs}
        r = evaluate("dist.cp_reduce", inputs, {"cp_size": C, "layout": layout, "ownership": ownership,
                                                "aggregator": aggregator, "agg_params": AGG_PARAMS.get(aggregator)})
        extra = {"agg.prompt_mean": {"group_ids": groups}, "agg.document_mean": {"document_ids": docs}}
        ref = evaluate(aggregator, {"values": values, "mask": mask, **extra.get(aggregator, {})},
                       AGG_PARAMS.get(aggregator))
        assert len(r["partials"]) == C
        with mp.workdps(60):
            assert close(mp.fsum(r["partials"]), ref["value"]) and r["unsharded"] == ref["value"]
        assert all(close(g, h) for g, h in zip(sum(r["grad"]["values"], []), sum(ref["grad"]["values"], [])))


def test_cp_local_denominators_break_invariance():
    """Negative control: normalizing each rank by its own token count (local denominators) is wrong."""
    mask = [[t >= 4 for t in range(12)]]
    values = [[float(t) for t in range(12)]]
    split = evaluate("dist.cp_split", {"mask": mask}, {"cp_size": 2})["rank"][0]
    local = [evaluate("agg.token_mean", {"values": values, "mask": [[m and split[t] == r for t, m in enumerate(mask[0])]]})
             ["value"] for r in range(2)]
    glob = evaluate("dist.cp_reduce", {"values": values, "mask": mask}, {"cp_size": 2})
    with mp.workdps(60):
        assert glob["partials"] == [mpf(21) / 8, mpf(39) / 8]              # (10+11)/8, (4+...+9)/8
        assert mp.fsum(glob["partials"]) == mpf(60) / 8 != mp.fsum(local)  # local: 10.5 + 6.5 = 17


# dist.accumulate ---------------------------------------------------------------------------------
@pytest.mark.parametrize("aggregator", AGGS)
def test_micro_batch_invariance_with_global_denominators(aggregator):
    rng = random.Random(len(aggregator))
    values, mask, groups, docs = batch(rng, 6, 7)
    inputs = {"values": values, "mask": mask, "group_ids": groups, "document_ids": docs}
    totals = []
    for sizes in ([6], [1] * 6, [2, 4], [3, 1, 2], None):
        r = evaluate("dist.accumulate", inputs, {"micro_batch_sizes": sizes, "aggregator": aggregator,
                                                 "agg_params": AGG_PARAMS.get(aggregator)})
        with mp.workdps(60):
            assert close(mp.fsum(r["contributions"]), r["total"])
        totals.append((r["total"], r["grad"]["values"]))
    for t, g in totals[1:]:
        assert close(t, totals[0][0]) and all(close(a, b) for a, b in zip(sum(g, []), sum(totals[0][1], [])))


def test_megatron_7452_uneven_dp_global_vs_local_counts():
    """Megatron-LM#7452: with uneven valid-token counts per rank, local per-rank token means averaged
    over ranks give gradient 14/3 where the global per-token reference is 4.  The research gives only
    the two numbers; reconstruction: q_t = x_t * theta at theta = 1, rank 0 holds one token (x = 6),
    rank 1 three (x = 2, 4, 4); d loss / d theta = sum_t x_t * d loss / d q_t."""
    x = [[6.0, 0.0, 0.0], [2.0, 4.0, 4.0]]
    mask = [[True, False, False], [True, True, True]]
    r = evaluate("dist.accumulate", {"values": x, "mask": mask}, {"micro_batch_sizes": [1, 1]})
    with mp.workdps(60):
        d_theta = mp.fsum(x[i][t] * r["grad"]["values"][i][t] for i in range(2) for t in range(3))
        assert d_theta == 4 and r["total"] == 4                       # (6 + 2 + 4 + 4) / 4
        assert r["naive"] == mpf(14) / 3                               # (6/1 + 10/3) / 2
        naive_grad = mp.fsum(
            x[i][t] * g / 2
            for i in range(2)
            for t, g in enumerate(evaluate("agg.token_mean", {"values": [x[i]], "mask": [mask[i]]})["grad"]["values"][0])
        )
        assert naive_grad == mpf(14) / 3


def test_naive_equals_total_when_micro_batches_are_balanced():
    values = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]
    mask = [[True, True]] * 4
    r = evaluate("dist.accumulate", {"values": values, "mask": mask}, {"micro_batch_sizes": [2, 2]})
    assert r["naive"] == r["total"] == mpf(36) / 8


# dist.sdp_segment --------------------------------------------------------------------------------
def test_sdp_segment_sums_reduce_to_unsplit_gspo_ratio():
    rng = random.Random(11)
    B, T = 3, 10
    lp, old = random_logprobs(rng, B, T), random_logprobs(rng, B, T)
    mask = [[t != 0 and t != 7 for t in range(T)], [t < 6 for t in range(T)], [True] * T]
    docs = [[0] * 4 + [1] * 6, [1] * 2 + [2] * 8, [3] * 5 + [4] * 5]   # document 1 spans rows 0 and 1
    inputs = {"logprobs": lp, "old_logprobs": old, "mask": mask, "document_ids": docs}
    ref = None
    for S in (1, 2, 3, 4, 10):
        r = evaluate("dist.sdp_segment", inputs, {"sdp_size": S})
        assert r["segment_ids"] == [0, 1, 2, 3, 4] and len(r["partials"]) == S
        for k in range(5):
            with mp.workdps(60):
                assert close(mp.fsum(r["partials"][j][k] for j in range(S)), r["log_ratio"][k])
        if ref is None:
            ref = r
        assert all(close(a, b) for a, b in zip(r["ratio"], ref["ratio"]))
        assert all(close(a, b) for a, b in zip(sum(r["grad"]["logprobs"], []), sum(ref["grad"]["logprobs"], [])))
    # unpack each segment into its own row and compare with ratio.sequence_geometric (GSPO s_i)
    for k, d in enumerate(ref["segment_ids"]):
        row_lp = [lp[i][t] for i in range(B) for t in range(T) if mask[i][t] and docs[i][t] == d]
        row_old = [old[i][t] for i in range(B) for t in range(T) if mask[i][t] and docs[i][t] == d]
        g = evaluate("ratio.sequence_geometric", {"logprobs": [row_lp], "old_logprobs": [row_old],
                                                  "mask": [[True] * len(row_lp)]})
        assert close(g["ratio"][0], ref["ratio"][k])
        grads = [ref["grad"]["logprobs"][i][t] for i in range(B) for t in range(T) if mask[i][t] and docs[i][t] == d]
        assert all(close(a, b) for a, b in zip(grads, g["grad"]["logprobs"][0]))


def np_sdp(lp, old, mask, docs, S):
    lp, old, m, d = map(np.asarray, (lp, old, mask, docs))
    T = m.shape[1]
    rank = np.arange(T) // math.ceil(T / S)
    ids = sorted(set(d[m.astype(bool)].tolist()))
    partial = np.zeros((S, len(ids)))
    for k, s in enumerate(ids):
        sel = m.astype(bool) & (d == s)
        for r in range(S):
            partial[r, k] = np.where(sel & (rank[None, :] == r), lp - old, 0.0).sum() / sel.sum()
    return ids, partial, np.exp(partial.sum(0))


def test_sdp_segment_agrees_with_independent_float64_numpy():
    rng = random.Random(99)
    for _ in range(8):
        B, T, S = rng.randint(1, 3), rng.randint(2, 12), rng.randint(1, 4)
        lp, old = random_logprobs(rng, B, T), random_logprobs(rng, B, T)
        mask = [[rng.random() < 0.8 for _ in range(T)] for _ in range(B)]
        docs = [[rng.randint(0, 2) for _ in range(T)] for _ in range(B)]
        r = evaluate("dist.sdp_segment", {"logprobs": lp, "old_logprobs": old, "mask": mask, "document_ids": docs},
                     {"sdp_size": S})
        ids, partial, ratio = np_sdp(lp, old, mask, docs, S)
        assert r["segment_ids"] == ids
        n = B * T
        for k in range(len(ids)):
            # a partial is a sum of <= n differences of bf16 values in [-6, 0], one division: its absolute
            # error is <= (n + 2) u * sum |l - l_old| / N_s <= (n + 2) u * 6; exp then adds relative error
            # (S * that) + u.
            for j in range(S):
                assert abs(float(r["partials"][j][k]) - partial[j, k]) <= (n + 2) * 2.0 ** -53 * 6
            assert math.isclose(float(r["ratio"][k]), ratio[k], rel_tol=(S * (n + 2) * 6 + 2) * 2.0 ** -53)


# Gradients, precision, errors, masked garbage -----------------------------------------------------
SMALL_V = [[0.0, -1.5, 2.25, 0.5], [1.0, -0.25, 3.0, 0.75]]
SMALL_M = [[False, True, True, True], [False, True, False, False]]
SMALL = {"values": SMALL_V, "mask": SMALL_M, "group_ids": [1, 1], "document_ids": [[0, 0, 1, 1], [0, 2, 2, 2]]}


@pytest.mark.parametrize("aggregator", AGGS)
def test_gradients_match_finite_difference(aggregator):
    p = {"cp_size": 2, "aggregator": aggregator, "agg_params": AGG_PARAMS.get(aggregator)}
    assert check_gradient_fd("dist.cp_reduce", SMALL, p, h="1e-30") == 4
    p = {"micro_batch_sizes": [1, 1], "aggregator": aggregator, "agg_params": AGG_PARAMS.get(aggregator)}
    assert check_gradient_fd("dist.accumulate", SMALL, p, h="1e-30") == 4


def test_sdp_gradient_matches_finite_difference():
    inputs = {"logprobs": [[-1.0, -2.5, -0.5, -3.0]], "old_logprobs": [[-1.25, -2.0, -0.75, -2.5]],
              "mask": [[True, True, False, True]], "document_ids": [[0, 0, 1, 1]]}
    assert check_gradient_fd("dist.sdp_segment", inputs, {"sdp_size": 2}, skip=("old_logprobs",)) == 3


def test_precision_60_vs_100_digits():
    extreme = {**SMALL, "values": [[0.0, 1e30, -2.0 ** -20, 3.0], [7.0, -1e-30, 0.0, 0.0]]}
    for aggregator in AGGS:
        for inputs in (SMALL, extreme):
            check_precision("dist.cp_reduce", inputs, {"cp_size": 3, "aggregator": aggregator,
                                                       "agg_params": AGG_PARAMS.get(aggregator)})
            check_precision("dist.accumulate", inputs, {"aggregator": aggregator, "agg_params": AGG_PARAMS.get(aggregator)})
    check_precision("dist.cp_split", {"mask": SMALL_M}, {"cp_size": 2})
    for d in (20.0, -20.0, 200.0, -200.0, 2.0 ** -20):
        check_precision("dist.sdp_segment", {"logprobs": [[d, 0.0, d / 2]], "old_logprobs": [[0.0, 0.0, 0.0]],
                                             "mask": [[True, True, True]], "document_ids": [[0, 0, 1]]}, {"sdp_size": 2})


def test_nan_and_inf_at_masked_positions_never_reach_results():
    dirty = {**SMALL, "values": [[float("nan"), -1.5, 2.25, 0.5], [float("inf"), -0.25, float("-inf"), float("nan")]]}
    for aggregator in AGGS:
        for fid, p in (("dist.cp_reduce", {"cp_size": 2}), ("dist.accumulate", {})):
            p = {**p, "aggregator": aggregator, "agg_params": AGG_PARAMS.get(aggregator)}
            assert evaluate(fid, dirty, p) == evaluate(fid, SMALL, p)
    clean = {"logprobs": [[0.0, -1.0, -2.0]], "old_logprobs": [[0.0, -0.5, -2.5]], "mask": [[False, True, True]],
             "document_ids": [[0, 0, 0]]}
    dirty = {**clean, "logprobs": [[float("nan"), -1.0, -2.0]], "old_logprobs": [[float("inf"), -0.5, -2.5]]}
    assert evaluate("dist.sdp_segment", dirty) == evaluate("dist.sdp_segment", clean)


def test_errors_name_the_argument():
    mask = [[True, True, False]]
    with pytest.raises(SpecError, match="mask\\[0\\]\\[0\\] is true but ownership='logit'"):
        evaluate("dist.cp_split", {"mask": mask})
    with pytest.raises(SpecError, match="'cp_size' must be integer in \\[1, \\+inf\\)"):
        evaluate("dist.cp_split", {"mask": mask}, {"cp_size": 0})
    with pytest.raises(SpecError, match="'layout' must be one of 'thd', 'bshd'"):
        evaluate("dist.cp_split", {"mask": mask}, {"layout": "sbhd"})
    with pytest.raises(SpecError, match="'sequence_lengths'\\[0\\] = 1 must lie in \\[2, 3\\]"):
        evaluate("dist.cp_split", {"mask": mask}, {"ownership": "position", "sequence_lengths": [1]})
    with pytest.raises(SpecError, match="'sequence_lengths' must have one entry per sequence"):
        evaluate("dist.cp_split", {"mask": mask}, {"ownership": "position", "sequence_lengths": [2, 2]})
    with pytest.raises(SpecError, match="'micro_batch_sizes' must be positive integers summing to B=2"):
        evaluate("dist.accumulate", SMALL, {"micro_batch_sizes": [1, 2]})
    # an empty micro-batch is outside the registry's range (a list [M] of integers >= 1), as the spec says
    with pytest.raises(SpecError, match="'micro_batch_sizes'\\[0\\] must be an integer >= 1, got 0"):
        evaluate("dist.accumulate", SMALL, {"micro_batch_sizes": [0, 2]})
    with pytest.raises(SpecError, match="'micro_batch_sizes'\\[1\\] must be an integer >= 1, got 0"):
        evaluate("dist.docs_per_step", SMALL, {"micro_batch_sizes": [2, 0]})
    with pytest.raises(SpecError, match="'agg_params': agg.token_mean: unknown parameter\\(s\\) \\['divisor'\\]"):
        evaluate("dist.accumulate", SMALL, {"agg_params": {"divisor": 3}})
    with pytest.raises(SpecError, match="'agg_params': agg.constant: parameter 'divisor' is required"):
        evaluate("dist.cp_reduce", SMALL, {"aggregator": "agg.constant"})
    with pytest.raises(SpecError, match="'agg_params' must be an object"):
        evaluate("dist.cp_reduce", SMALL, {"agg_params": [1]})
    with pytest.raises(SpecError, match="'aggregator' must be one of"):
        evaluate("dist.cp_reduce", SMALL, {"aggregator": "agg.median"})
    with pytest.raises(SpecError, match="aggregator 'agg.prompt_mean' needs input 'group_ids'"):
        evaluate("dist.cp_reduce", {"values": SMALL_V, "mask": SMALL_M}, {"aggregator": "agg.prompt_mean"})
    with pytest.raises(SpecError, match="'sdp_size' must be integer in \\[1"):
        evaluate("dist.sdp_segment", {"logprobs": [[0.0]], "old_logprobs": [[0.0]], "mask": [[True]],
                                      "document_ids": [[0]]}, {"sdp_size": 0})
    with pytest.raises(SpecError, match="missing input 'document_ids'"):
        evaluate("dist.sdp_segment", {"logprobs": [[0.0]], "old_logprobs": [[0.0]], "mask": [[True]]})


# bshd: the micro-batch's maximum length, not the array width (slime PR #2060 max_seq_lens) ---------

MB10 = [[1 <= t < 6 for t in range(10)], [1 <= t < 4 for t in range(10)]]


def test_bshd_max_seq_len_equal_to_the_width_changes_nothing():
    for C in (1, 2, 3):
        a = evaluate("dist.cp_split", {"mask": MB10}, {"cp_size": C, "layout": "bshd"})
        b = evaluate("dist.cp_split", {"mask": MB10}, {"cp_size": C, "layout": "bshd", "max_seq_len": 10})
        assert a == b


def test_bshd_chunks_by_max_seq_len():
    """c = ceil(S / 2C) for every row: S = 6, C = 2 gives c = 2, and rank(p) follows the zig-zag of p // 2."""
    out = evaluate("dist.cp_split", {"mask": MB10}, {"cp_size": 2, "layout": "bshd", "max_seq_len": 6})
    assert out["chunk_size"] == [2, 2]
    zig = {0: 0, 1: 1, 2: 1, 3: 0}
    for i, row in enumerate(MB10):
        assert out["rank"][i] == [zig[(t - 1) // 2] if m else None for t, m in enumerate(row)]
    wide = evaluate("dist.cp_split", {"mask": MB10}, {"cp_size": 2, "layout": "bshd"})
    assert wide["chunk_size"] == [3, 3] and wide["rank"] != out["rank"]


def test_bshd_max_seq_len_partials_add_up_to_the_unsharded_value():
    rng = random.Random(906)
    for _ in range(10):
        B, T = 3, 10
        lengths = [rng.randint(2, 7) for _ in range(B)]
        mask = [[1 <= t < n for t in range(T)] for n in lengths]
        values = random_logprobs(rng, B, T, lo=-3.0, hi=3.0)
        S = max(lengths) + rng.randint(0, 4)
        for aggregator in ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum"):
            out = evaluate("dist.cp_reduce", {"values": values, "mask": mask},
                           {"cp_size": rng.randint(1, 4), "layout": "bshd", "max_seq_len": S, "aggregator": aggregator})
            with mp.workdps(60):
                assert abs(mp.fsum(out["partials"]) - out["unsharded"]) <= mpf(10) ** -50


def test_max_seq_len_errors_name_the_argument():
    with pytest.raises(SpecError, match="'max_seq_len' applies only to layout='bshd'"):
        evaluate("dist.cp_split", {"mask": MB10}, {"cp_size": 2, "max_seq_len": 6})
    with pytest.raises(SpecError, match="'max_seq_len' = 5 is shorter than sequence 0"):
        evaluate("dist.cp_split", {"mask": MB10}, {"cp_size": 2, "layout": "bshd", "max_seq_len": 5})
    with pytest.raises(SpecError, match="'max_seq_len' = 5 is shorter"):
        evaluate("dist.cp_reduce", {"values": [[0.0] * 10] * 2, "mask": MB10},
                 {"cp_size": 2, "layout": "bshd", "max_seq_len": 5})


# dist.docs_per_step (Fast-LLM PR #502) -----------------------------------------------------------

def test_docs_per_step_one_rollout_micro_batches_equal_the_whole_step_at_once():
    """Property: accumulating one-rollout micro-batches = the fetched rows as one batch = their token sum / D."""
    rng = random.Random(909)
    for _ in range(20):
        B, T = rng.randint(2, 7), 5
        lengths = [rng.randint(1, T) for _ in range(B)]
        mask = [[t < n for t in range(T)] for n in lengths]
        values = random_logprobs(rng, B, T, lo=-3.0, hi=3.0)
        inputs = {"values": values, "mask": mask, "document_ids": [[i] * T for i in range(B)]}
        target = rng.randint(1, B)
        acc = evaluate("dist.docs_per_step", inputs, {"docs_per_step": target})
        assert acc["micro_batches"] == target and acc["num_documents"] == target
        rest = [B - target] if B > target else []
        whole = evaluate("dist.docs_per_step", inputs, {"docs_per_step": target, "micro_batch_sizes": [target] + rest})
        step = evaluate("agg.constant", {"values": values[:target], "mask": mask[:target]},
                        {"divisor": target, "divide_by": "K"})
        with mp.workdps(60):
            assert abs(acc["total"] - whole["total"]) <= mpf(10) ** -50
            assert abs(acc["total"] - step["value"]) <= mpf(10) ** -50
        assert acc["contributions"][target:] == [None] * (B - target)


def test_docs_per_step_divides_by_the_step_total_which_can_overshoot():
    packed = {"values": [[1.0, 2.0, 3.0, 4.0], [0.5, -0.5, 1.5, 2.5], [9.0, 9.0, 9.0, 9.0]],
              "mask": [[True] * 4, [True, True, True, False], [True] * 4],
              "document_ids": [[0, 0, 1, 1], [2, 3, 3, 3], [4, 4, 5, 5]]}
    out = evaluate("dist.docs_per_step", packed, {"docs_per_step": 3})
    assert out["micro_batches"] == 2 and out["num_documents"] == 4
    with mp.workdps(60):
        assert abs(out["total"] - mpf("11.5") / 4) <= mpf(10) ** -55
    assert check_gradient_fd("dist.docs_per_step", packed, {"docs_per_step": 3}) == 11


def test_docs_per_step_errors_name_the_argument():
    one = {"values": [[1.0], [2.0]], "mask": [[True], [True]], "document_ids": [[0], [1]]}
    with pytest.raises(SpecError, match="'docs_per_step' = 3 exceeds the 2 documents"):
        evaluate("dist.docs_per_step", one, {"docs_per_step": 3})
    with pytest.raises(SpecError, match="document 0 spans micro-batches 0 and 1"):
        evaluate("dist.docs_per_step", {**one, "document_ids": [[0], [0]]}, {"docs_per_step": 1})
    with pytest.raises(SpecError, match="parameter 'docs_per_step'"):
        evaluate("dist.docs_per_step", one, {"docs_per_step": 0})


def test_normalize_by_documents_changes_only_the_divisor():
    """Fast-LLM: loss = token sum / N_lab (default) or / D (normalize_by_documents); the gradient it applies
    under normalize_by_documents is the sum / D^2.  All three are agg.constant(divide_by='K') of one sum."""
    rng = random.Random(910)
    values = random_logprobs(rng, 3, 5, lo=-2.0, hi=2.0)
    mask = [[True] * 5, [True, True, False, False, False], [True] * 3 + [False] * 2]
    n_lab, D = 10, 3
    tok = evaluate("agg.token_mean", {"values": values, "mask": mask})
    by_doc = evaluate("agg.constant", {"values": values, "mask": mask}, {"divisor": D, "divide_by": "K"})
    grad_doc = evaluate("agg.constant", {"values": values, "mask": mask}, {"divisor": D * D, "divide_by": "K"})
    with mp.workdps(60):
        assert abs(tok["value"] * n_lab - by_doc["value"] * D) <= mpf(10) ** -50
        assert abs(grad_doc["value"] * D - by_doc["value"]) <= mpf(10) ** -50


def test_docs_per_step_counts_the_documents_that_agg_constant_is_given():
    """normalize_by_documents without a caller-supplied count: with the step in one micro-batch,
    dist.docs_per_step counts D itself (distinct document ids among the unmasked tokens) and its total is
    agg.constant with divide_by = K and divisor D (spec/dist.md, dist.docs_per_step)."""
    rng = random.Random(1102)
    for _ in range(20):
        B, T = 3, 5
        mask = [[rng.random() < 0.7 for _ in range(T)] for _ in range(B)]
        mask[0][0] = True
        values = [[rng.choice([-1.5, -0.25, 0.5, 2.0]) for _ in range(T)] for _ in range(B)]
        docs = [[rng.randint(0, 6) for _ in range(T)] for _ in range(B)]
        D = len({docs[i][t] for i in range(B) for t in range(T) if mask[i][t]})
        out = evaluate("dist.docs_per_step", {"values": values, "mask": mask, "document_ids": docs},
                       {"docs_per_step": rng.randint(1, D), "micro_batch_sizes": [B]})
        ref = evaluate("agg.constant", {"values": values, "mask": mask}, {"divisor": D, "divide_by": "K"})
        assert out["micro_batches"] == 1 and out["num_documents"] == D
        with mp.workdps(60):
            assert abs(out["total"] - ref["value"]) <= mpf(10) ** -50
            wrong = evaluate("agg.constant", {"values": values, "mask": mask}, {"divisor": D + 1, "divide_by": "K"})
            assert out["total"] == 0 or abs(out["total"] - wrong["value"]) > mpf(10) ** -6
            for i in range(B):
                for t in range(T):
                    assert out["grad"]["values"][i][t] == ref["grad"]["values"][i][t]
