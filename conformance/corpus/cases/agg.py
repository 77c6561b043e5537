"""Golden cases of the agg family (spec/agg.md)."""

from __future__ import annotations

from .case import Case, Generated, random_inputs

# the spec's worked-example batch: 3 unmasked tokens, lengths 2 and 1
V = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
M = [[True, True, False], [True, False, False]]
# a signed batch (tests/test_agg.py): lengths 3, 2 and 4
Q = [[0.5, -1.25, 2.0, 3.0], [-0.75, 1.5, 0.25, -2.0], [4.0, 0.125, -3.5, 1.0]]
QM = [[True, True, True, False], [True, True, False, False], [True, True, True, True]]
QG = [7, 7, 3]
QD = [[0, 0, 1, 1], [1, 2, 2, 2], [3, 3, 3, 4]]
DIRTY = [[0.5, -1.25, 2.0, "nan"], [-0.75, 1.5, "inf", "-inf"], [4.0, 0.125, -3.5, 1.0]]
NONE = [[False] * 4] * 3
EMPTY_ROW = [QM[0], [False] * 4, QM[2]]
BIG = 2.0 ** 60

# verl#593: arange(20) as [2, 10], 5 and 1 valid tokens
V593 = [[float(10 * i + t) for t in range(10)] for i in range(2)]
M593 = [[t < 5 for t in range(10)], [t < 1 for t in range(10)]]
L593 = ("https://github.com/volcengine/verl/issues/593",)
# Megatron-LM#7452 reconstruction: rank 0 holds one token (x = 6), rank 1 three (x = 2, 4, 4)
V7452 = [[6.0, 0.0, 0.0], [2.0, 4.0, 4.0]]
M7452 = [[True, False, False], [True, True, True]]
L7452 = ("https://github.com/NVIDIA/Megatron-LM/issues/7452",)

IDS = ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
       "agg.document_mean")
NEEDED = {"agg.constant": {"divisor": 16}}


def extra(fid, groups=QG, docs=QD):
    """The id inputs an aggregator needs besides values and mask."""
    if fid == "agg.prompt_mean":
        return {"group_ids": groups}
    if fid == "agg.document_mean":
        return {"document_ids": docs}
    return {}


def ids_for(fid, values):
    """One group / one document per row (a group id per sequence, a document id per token)."""
    return extra(fid, list(range(len(values))), [[i] * len(row) for i, row in enumerate(values)])


def common(fid):
    """Edge and random cases every aggregator gets."""
    p = NEEDED.get(fid, {})
    gen_fields = ("values", "mask") + (("group_ids",) if fid == "agg.prompt_mean" else ()) \
        + (("document_ids",) if fid == "agg.document_mean" else ())
    out = [
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the middle sequence has no unmasked token: it contributes 0 and zero gradient",
             {"values": Q, "mask": EMPTY_ROW, **extra(fid)}, p),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts anywhere: value 0, gradient 0",
             {"values": Q, "mask": NONE, **extra(fid)}, p),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities at masked positions must not reach the value or the gradient (x * mask "
             "reductions give NaN, OpenRLHF #1240)",
             {"values": DIRTY, "mask": QM, **extra(fid)}, p),
        Case(f"{fid}/singleton", fid, "edge", "one unmasked token -0.375: every aggregator's weight is "
             "1 over its count (1/16 for agg.constant with K = 16)",
             {"values": [[-0.375, 5.0]], "mask": [[True, False]], **extra(fid, [0], [[0, 0]])}, p),
        Case(f"{fid}/cancellation", fid, "edge",
             "2^60 + 1 - 2^60 + 0.5 in one sequence: float32 loses the 1 and 0.5 against 2^60; the tolerance's "
             "scale is the sum of |q|, so a plain sum passes",
             {"values": [[BIG, 1.0, -BIG, 0.5]], "mask": [[True] * 4], **extra(fid, [0], [[0, 0, 0, 0]])}, p),
        Case(f"{fid}/tiny-and-huge", fid, "edge",
             "magnitudes 2^-100 .. 2^100 in one batch (no overflow in float32)",
             {"values": [[2.0 ** 100, 2.0 ** -100, -3.0], [2.0 ** -20, -2.0 ** 90, 1.0]],
              "mask": [[True, True, True], [True, True, False]], **extra(fid, [0, 1], [[0, 0, 1], [1, 2, 2]])}, p),
        Case(f"{fid}/random-1", fid, "random", "generator inputs (seed 301), 3 sequences of lengths 16, 9 and 1",
             {**random_inputs(301, 3, 16, ("values", "mask"), (16, 9, 1)),
              **extra(fid, [0, 1, 0], [[t // 5 for t in range(16)], [3 + t // 4 for t in range(16)], [0] * 16])}, p),
        Case(f"{fid}/random-2", fid, "random", "generator inputs (seed 302), 4 sequences of 7, one empty",
             {**random_inputs(302, 4, 7, ("values", "mask"), (7, 0, 7, 3)),
              **extra(fid, [5, 5, 2, 2], [[0] * 7, [1] * 7, [2, 2, 2, 3, 3, 3, 3], [0, 0, 4, 4, 4, 4, 4]])}, p),
    ]
    docs = 3 if fid == "agg.document_mean" else None
    out += [
        Case(f"{fid}/scale-8192", fid, "scale",
             "four sequences of 8192 positions (lengths 8192, 5000, 8192, 100) from the generator"
             + (", 2 prompt groups" if fid == "agg.prompt_mean" else "")
             + (", 3 documents per row" if docs else ""),
             Generated(seed=8192, B=4, T=8192, fields=gen_fields, lengths=(8192, 5000, 8192, 100),
                       groups=2 if fid == "agg.prompt_mean" else None, documents=docs), p),
        Case(f"{fid}/scale-32768", fid, "scale",
             "two sequences of 32768 positions (lengths 32768 and 20000) from the generator"
             + (", 2 prompt groups" if fid == "agg.prompt_mean" else "")
             + (", 3 documents per row" if docs else ""),
             Generated(seed=32768, B=2, T=32768, fields=gen_fields, lengths=(32768, 20000),
                       groups=2 if fid == "agg.prompt_mean" else None, documents=docs), p),
    ]
    return out


def cases():
    fid = "agg.token_mean"
    out = [
        Case(f"{fid}/worked", fid, "example", "(1 + 2 + 4) / 3 = 2.3333333333, gradient 1/3 per unmasked token",
             {"values": V, "mask": M}),
        Case(f"{fid}/global-count", fid, "example",
             "num_tokens = 6 (this batch is half of the scope): (1 + 2 + 4) / 6 = 1.1666666667, gradient 1/6",
             {"values": V, "mask": M}, {"num_tokens": 6}),
        Case(f"{fid}/signed", fid, "example",
             "(0.5 - 1.25 + 2 - 0.75 + 1.5 + 4 + 0.125 - 3.5 + 1) / 9 = 3.625 / 9 = 0.40277777778",
             {"values": Q, "mask": QM}),
        Case(f"{fid}/verl-3x5", fid, "example",
             "verl agg_loss vector: arange(15) as [3,5], lengths 3, 5, 1: (0+1+2 + 5+...+9 + 10) / 9 = 48/9",
             {"values": [[float(5 * i + t) for t in range(5)] for i in range(3)],
              "mask": [[t < 3 for t in range(5)], [True] * 5, [t < 1 for t in range(5)]]}),
        Case(f"{fid}/eps", fid, "edge", "NeMo-RL's eps = 1e-8: (1 + 2 + 4) / (3 + 1e-8)",
             {"values": V, "mask": M}, {"eps": "1e-8"}),
        Case(f"{fid}/eps-all-masked", fid, "edge", "eps = 1e-8 and no token: 0 / 1e-8 = 0",
             {"values": V, "mask": [[False] * 3] * 2}, {"eps": "1e-8"}),
        Case(f"{fid}/verl-593", fid, "regression",
             "verl#593: arange(20) as [2,10] with 5 and 1 valid tokens: (0+1+2+3+4 + 10) / 6 = 3.3333333333",
             {"values": V593, "mask": M593}, links=L593),
        Case(f"{fid}/megatron-7452-global", fid, "regression",
             "Megatron-LM#7452 reconstruction, global count: (6 + 2 + 4 + 4) / 4 = 4, gradient 1/4 per token, "
             "so d/dtheta of q = x theta is 16/4 = 4 (local per-rank means give 14/3, see dist.accumulate)",
             {"values": V7452, "mask": M7452}, links=L7452),
        Case(f"{fid}/megatron-7452-rank0", fid, "regression",
             "Megatron-LM#7452: rank 0's shard (one token, x = 6) with the global count num_tokens = 4: 6/4 = 1.5",
             {"values": [[6.0]], "mask": [[True]]}, {"num_tokens": 4}, links=L7452),
        Case(f"{fid}/nemo-rl-3656", fid, "regression",
             "NeMo-RL#3656: a 10-token and a 1000-token response; q = 1 on the short one, 0 on the long one: "
             "the short response's weight is 10/1010 = 0.0099009900990 (0.99%)",
             {"values": [[1.0] * 10 + [0.0] * 990, [0.0] * 1000],
              "mask": [[t < 10 for t in range(1000)], [True] * 1000]},
             links=("https://github.com/NVIDIA-NeMo/RL/issues/3656",)),
    ]
    fid = "agg.sample_mean"
    out += [
        Case(f"{fid}/worked", fid, "example", "((1 + 2)/2 + 4/1) / 2 = 2.75; gradient 1/4 and 1/2",
             {"values": V, "mask": M}),
        Case(f"{fid}/global-counts", fid, "example",
             "sequence_token_counts (4, 2), num_sequences 4: (3/4 + 4/2) / 4 = 0.6875; gradient 1/16 and 1/8",
             {"values": V, "mask": M}, {"sequence_token_counts": [4, 2], "num_sequences": 4}),
        Case(f"{fid}/verl-3x5", fid, "example",
             "verl agg_loss vector: arange(15) as [3,5], lengths 3, 5, 1: (1 + 7 + 10) / 3 = 6",
             {"values": [[float(5 * i + t) for t in range(5)] for i in range(3)],
              "mask": [[t < 3 for t in range(5)], [True] * 5, [t < 1 for t in range(5)]]}),
        Case(f"{fid}/count-empty-sequences", fid, "edge",
             "SkyRL sequence_mean counts the empty row: (1.25/3 + 1.625/4) / 3, 2/3 of the default",
             {"values": Q, "mask": EMPTY_ROW}, {"count_empty_sequences": True}),
        Case(f"{fid}/eps-length-only", fid, "edge",
             "eps_length = 1e-8 alone (verl's seq-mean-token-mean: count + 1e-8 per sequence, no epsilon on the "
             "sequence count): one token 0.0625, value 0.0625 / (1 + 1e-8)",
             {"values": [[0.0625]], "mask": [[True]]}, {"eps_length": "1e-8"}),
        Case(f"{fid}/eps", fid, "edge", "eps_length = eps_count = 1e-8 (verl, NeMo-RL): "
             "((1+2)/(2+1e-8) + 4/(1+1e-8)) / (2+1e-8)",
             {"values": V, "mask": M}, {"eps_length": "1e-8", "eps_count": "1e-8"}),
        Case(f"{fid}/verl-593", fid, "regression",
             "verl#593: arange(20) as [2,10] with 5 and 1 valid tokens: ((0+1+2+3+4)/5 + 10/1) / 2 = 6",
             {"values": V593, "mask": M593}, links=L593),
        Case(f"{fid}/nemo-rl-3656", fid, "regression",
             "NeMo-RL#3656: the 10-token response weighs 50% under the sample mean: (1 + 0) / 2 = 0.5",
             {"values": [[1.0] * 10 + [0.0] * 990, [0.0] * 1000],
              "mask": [[t < 10 for t in range(1000)], [True] * 1000]},
             links=("https://github.com/NVIDIA-NeMo/RL/issues/3656",)),
    ]
    fid = "agg.seq_mean_token_sum"
    out += [
        Case(f"{fid}/worked", fid, "example", "((1 + 2) + 4) / 2 = 3.5; gradient 1/2", {"values": V, "mask": M}),
        Case(f"{fid}/global-count", fid, "example", "num_sequences = 4: 7/4 = 1.75; gradient 1/4",
             {"values": V, "mask": M}, {"num_sequences": 4}),
        Case(f"{fid}/verl-3x5", fid, "example",
             "verl agg_loss vector: arange(15) as [3,5], lengths 3, 5, 1: (3 + 35 + 10) / 3 = 16",
             {"values": [[float(5 * i + t) for t in range(5)] for i in range(3)],
              "mask": [[t < 3 for t in range(5)], [True] * 5, [t < 1 for t in range(5)]]}),
        Case(f"{fid}/count-empty-sequences", fid, "edge", "the empty row counts in N: (1.25 + 1.625) / 3",
             {"values": Q, "mask": EMPTY_ROW}, {"count_empty_sequences": True}),
    ]
    fid = "agg.constant"
    out += [
        Case(f"{fid}/worked", fid, "example",
             "K = 3000, N = 2: (1 + 2 + 4) / 6000 = 0.0011666666667; gradient 1/6000",
             {"values": V, "mask": M}, {"divisor": 3000}),
        Case(f"{fid}/divide-by-K", fid, "example", "divide_by = 'K', K = 2.5: 7 / 2.5 = 2.8; gradient 0.4",
             {"values": V, "mask": M}, {"divisor": "2.5", "divide_by": "K"}),
        Case(f"{fid}/verl-3x5", fid, "example",
             "verl seq-mean-token-sum-norm with its default K = T = 5: arange(15) as [3,5], lengths 3, 5, 1: "
             "48 / (5 * 3) = 3.2",
             {"values": [[float(5 * i + t) for t in range(5)] for i in range(3)],
              "mask": [[t < 3 for t in range(5)], [True] * 5, [t < 1 for t in range(5)]]}, {"divisor": 5}),
        Case(f"{fid}/global-count", fid, "example", "K = 4096, num_sequences = 8: 7 / 32768; gradient 2^-15",
             {"values": V, "mask": M}, {"divisor": 4096, "num_sequences": 8}),
        Case(f"{fid}/exclude-empty-sequences", fid, "edge",
             "count_empty_sequences = false: N = 2 of 3 rows, (1.25 + 1.625) / (16 * 2)",
             {"values": Q, "mask": EMPTY_ROW}, {"divisor": 16, "count_empty_sequences": False}),
        Case(f"{fid}/huge-divisor", fid, "edge", "K = 1e30 (a parameter extreme): 7 / (2e30)",
             {"values": V, "mask": M}, {"divisor": "1e30"}),
        Case(f"{fid}/verl-5417-padded-width", fid, "regression",
             "verl's default K = the padded width T is not padding invariant: the batch (1, 2, .), (8, ., .) "
             "padded to T = 8 gives 11 / (8 * 2) = 0.6875 instead of 11 / (3 * 2) at T = 3",
             {"values": [[1.0, 2.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0], [8.0, 16.0, 32.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
              "mask": [[True, True] + [False] * 6, [True] + [False] * 7]}, {"divisor": 8},
             links=("https://github.com/verl-project/verl/pull/5417",)),
    ]
    fid = "agg.prompt_mean"
    out += [
        Case(f"{fid}/worked", fid, "example",
             "groups {rows 0, 1} and {row 2}: ((1 + 2 + 4)/3 + (7 + 8)/2) / 2 = 59/12 = 4.9166666667; "
             "gradient 1/6 and 1/4",
             {"values": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]],
              "mask": [[True, True, False], [True, False, False], [True, True, False]], "group_ids": [0, 0, 1]}),
        Case(f"{fid}/one-group", fid, "example", "one group = the token mean: (1 + 2 + 4) / 3",
             {"values": V, "mask": M, "group_ids": [5, 5]}),
        Case(f"{fid}/singleton-groups", fid, "example",
             "one sequence per group = the sample mean: (3/2 + 4) / 2 = 2.75",
             {"values": V, "mask": M, "group_ids": [2, 9]}),
        Case(f"{fid}/global-counts", fid, "example",
             "group 7 split across shards: group_token_counts (11, 11, 4), num_groups 5: "
             "((0.5 - 1.25 + 2 - 0.75 + 1.5)/11 + 1.625/4) / 5",
             {"values": Q, "mask": QM, "group_ids": QG}, {"num_groups": 5, "group_token_counts": [11, 11, 4]}),
        Case(f"{fid}/empty-group", fid, "edge",
             "group 3 (row 2) has no token: excluded from N_grp by default",
             {"values": Q, "mask": [QM[0], QM[1], [False] * 4], "group_ids": QG}),
        Case(f"{fid}/count-empty-groups", fid, "edge", "count_empty_groups: the empty group counts, N_grp = 2",
             {"values": Q, "mask": [QM[0], QM[1], [False] * 4], "group_ids": QG}, {"count_empty_groups": True}),
    ]
    # slime #2090 (its commits): the step sum of per-prompt token means divided by the SAMPLE count
    s2090 = {"values": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [0.5, 0.25, 0.125]],
             "mask": [[True, True, False], [True, False, False], [True, True, False], [True, True, True]],
             "group_ids": [0, 0, 1, 1]}
    out += [
        Case(f"{fid}/slime-2090-divide-by-groups", fid, "example",
             "N = 4 rollouts in P = 2 prompts of 2: per-prompt token means (1 + 2 + 4)/3 = 7/3 and "
             "(7 + 8 + 0.875)/5 = 3.175, step_divisor 'groups' (default, DAPO Eq. 8): (7/3 + 3.175)/2 = 2.7541666667",
             s2090, {}, ("https://github.com/THUDM/slime/pull/2090",)),
        Case(f"{fid}/slime-2090-divide-by-sequences", fid, "example",
             "the same batch with step_divisor 'sequences' (slime #2090 divides by step_global_batch_size = N = 4): "
             "(7/3 + 3.175)/4 = 1.3770833333 = (P/N) x the 'groups' value; gradient 1/12 and 1/20",
             s2090, {"step_divisor": "sequences"}, ("https://github.com/THUDM/slime/pull/2090",)),
        Case(f"{fid}/divide-by-sequences-global", fid, "example",
             "step_divisor 'sequences' with the step's sample count num_sequences = 16 and global group counts "
             "(a micro-batch of a larger step): (7/3 + 3.175)/16 scaled by D_g = (6, 10)",
             s2090, {"step_divisor": "sequences", "num_sequences": 16, "group_token_counts": [6, 6, 10, 10]}),
        Case(f"{fid}/divide-by-sequences-empty-row", fid, "edge",
             "step_divisor 'sequences' counts every sample, an empty one too (step_global_batch_size): N = 4",
             {**s2090, "mask": [s2090["mask"][0], [False] * 3, s2090["mask"][2], s2090["mask"][3]]},
             {"step_divisor": "sequences"}),
    ]
    # Fast-LLM PR #502 normalize_by_documents: the step's token sum / its document count D
    fid = "agg.constant"
    fl = {"values": [[-1.25, 0.5, 2.0, 0.0], [0.75, -0.25, 0.0, 0.0], [1.5, 1.0, -0.5, 0.125]],
          "mask": [[True, True, True, False], [True, True, False, False], [True, True, True, True]]}
    out += [
        Case(f"{fid}/fast-llm-normalize-by-documents", fid, "example",
             "Fast-LLM normalize_by_documents over 3 rollouts: the token sum 3.875 / D = 3 documents = 1.2916666667 "
             "(the reported loss; Fast-LLM's gradient divides by D^2 = 9, i.e. divisor 9), gradient 1/3",
             fl, {"divisor": 3, "divide_by": "K"}, ("https://github.com/ServiceNow/Fast-LLM/pull/502",)),
        Case(f"{fid}/fast-llm-normalize-by-documents-gradient", fid, "example",
             "the gradient Fast-LLM applies under normalize_by_documents: the same sum / D^2 = 9 (DeepSpeed's "
             "1/batch_size^2 gradient buffer): 0.43055555556, gradient 1/9",
             fl, {"divisor": 9, "divide_by": "K"}, ("https://github.com/ServiceNow/Fast-LLM/pull/502",)),
    ]
    fid = "agg.document_mean"
    out += [
        Case(f"{fid}/worked", fid, "example",
             "documents {1, 2}, {3, 4} (split over rows), {5}: (3/2 + 7/2 + 5) / 3 = 10/3; gradient 1/6, 1/6, 1/3",
             {"values": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], "mask": [[True, True, True], [True, True, False]],
              "document_ids": [[0, 0, 1], [1, 2, 2]]}),
        Case(f"{fid}/one-per-row", fid, "example", "one document per row = the sample mean: (3/2 + 4) / 2 = 2.75",
             {"values": V, "mask": M, "document_ids": [[0, 0, 0], [1, 1, 1]]}),
        Case(f"{fid}/signed", fid, "example",
             "five documents: ((0.5-1.25)/2 + (2-0.75)/2 + 1.5 + (4+0.125-3.5)/3 + 1) / 5",
             {"values": Q, "mask": QM, "document_ids": QD}),
        Case(f"{fid}/global-counts", fid, "example",
             "row 0 as a shard with the global counts: documents 0 (2 tokens) and 1 (2 tokens), num_documents 5: "
             "((0.5 - 1.25)/2 + 2/2) / 5 = 0.125",
             {"values": [Q[0]], "mask": [QM[0]], "document_ids": [QD[0]]},
             {"num_documents": 5, "document_token_counts": [[2, 2, 2, None]]}),
        Case(f"{fid}/masked-ids-ignored", fid, "edge",
             "document ids at masked positions are not read: a stray id 9 there adds no document",
             {"values": V, "mask": M, "document_ids": [[0, 0, 9], [1, 9, 9]]}),
    ]
    for fid in IDS:
        out += common(fid)
    return out + counts_equal_to_local()


def counts_equal_to_local():
    """Global counts exactly equal to the batch's own (the smallest a global count may be: 'integer >=
    the local count' is closed): accepted, and the value is the one with null counts."""
    counted = "every global count equal to the local one (the least allowed): the value of the null counts"
    qd = [[2, 2, 2, None], [2, 1, None, None], [3, 3, 3, 1]]
    rows = [("agg.token_mean", {"num_tokens": 9}),
            ("agg.sample_mean", {"sequence_token_counts": [3, 2, 4], "num_sequences": 3}),
            ("agg.seq_mean_token_sum", {"num_sequences": 3}),
            ("agg.constant", {"divisor": 16, "num_sequences": 3}),
            ("agg.prompt_mean", {"group_token_counts": [5, 5, 4], "num_groups": 2}),
            ("agg.prompt_mean", {"step_divisor": "sequences", "num_sequences": 3}),
            ("agg.document_mean", {"document_token_counts": qd, "num_documents": 5})]
    out = []
    for fid, params in rows:
        slug = "counts-equal-local" + ("-sequences" if params.get("step_divisor") == "sequences" else "")
        out.append(Case(f"{fid}/{slug}", fid, "edge", f"{counted} ({', '.join(f'{k} {v}' for k, v in params.items())})",
                        {"values": Q, "mask": QM, **extra(fid)}, params))
    return out
