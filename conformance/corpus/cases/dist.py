"""Golden cases of the dist family (spec/dist.md)."""

from __future__ import annotations

from .case import Case, random_inputs

# the spec's CP example: 12 positions, the first 4 (the prompt) masked
MASK12 = [[t >= 4 for t in range(12)]]
ARANGE12 = [[float(t) for t in range(12)]]
# a small batch with prompt-like masked heads, one empty row and one row shorter than 2C
V = [[0.0, -1.5, 2.25, 0.5, 1.0, -0.75], [3.0, 1.25, -0.5, 4.0, 0.0, 0.0],
     [0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.5, -2.0, 0.0, 0.0, 0.0]]
VM = [[False, True, True, True, True, True], [False, False, True, True, False, False],
      [False] * 6, [False, True, False, False, False, False]]
VG = [1, 1, 0, 0]
VD = [[0, 0, 0, 1, 1, 1], [1, 1, 2, 2, 2, 2], [3, 3, 3, 3, 3, 3], [4, 4, 4, 4, 4, 4]]
DIRTY = [["nan", -1.5, 2.25, 0.5, 1.0, -0.75], ["inf", "-inf", -0.5, 4.0, "nan", "inf"],
         ["nan"] * 6, [1.0, 0.5, "-inf", 0.0, 0.0, 0.0]]
AGGS = ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
        "agg.document_mean")
AGG_PARAMS = {"agg.constant": {"divisor": 16}}
L7452 = ("https://github.com/NVIDIA/Megatron-LM/issues/7452",)
SLIME_2123 = ("https://github.com/THUDM/slime/pull/2123",)


def ids(aggregator, groups=VG, docs=VD):
    if aggregator == "agg.prompt_mean":
        return {"group_ids": groups}
    if aggregator == "agg.document_mean":
        return {"document_ids": docs}
    return {}


def agg_p(aggregator, **extra):
    p = {"aggregator": aggregator, **extra}
    if aggregator in AGG_PARAMS:
        p["agg_params"] = AGG_PARAMS[aggregator]
    return p


def cp_split_cases():
    fid = "dist.cp_split"
    return [
        Case(f"{fid}/slime-c2", fid, "example",
             "slime, T = 12, prompt 4, C = 2: c = 3; tokens 4..9 (logits 3..8) on rank 1, tokens 10, 11 on rank 0",
             {"mask": MASK12}, {"cp_size": 2}),
        Case(f"{fid}/sequence-lengths-at-their-bounds", fid, "edge",
             "sequence_lengths at both ends of their range [1 + last unmasked position, T]: n = (3, 6) in a width "
             "T = 6, ownership 'position', C = 2: chunks of 1 and 2",
             {"mask": [[False, True, True, False, False, False], [False, True, True, True, True, False]]},
             {"cp_size": 2, "ownership": "position", "sequence_lengths": [3, 6]}),
        Case(f"{fid}/position-sequence-length", fid, "example",
             "ownership 'position', n = 6 given, C = 2: chunks of 2, positions 1 and 2 on ranks 0 and 1",
             {"mask": [[False, True, True, False, False, False]]},
             {"cp_size": 2, "ownership": "position", "sequence_lengths": [6]}),
        Case(f"{fid}/bshd-c2", fid, "example",
             "bshd, T = 8, C = 2: c = 2 for both rows; position p -> chunk p // 2 -> ranks 0 0 1 1 1 1 0 0",
             {"mask": [[False, True, True, True, True, True, True, True], [False, True, True, False] + [False] * 4]},
             {"cp_size": 2, "layout": "bshd"}),
        Case(f"{fid}/thd-c3-two-lengths", fid, "example",
             "thd, C = 3: a row of n = 12 (c = 2) and a row of n = 7 (c = 2, chunk 3 short, chunks 4, 5 empty)",
             {"mask": [[t >= 2 for t in range(12)], [2 <= t < 7 for t in range(12)]]}, {"cp_size": 3}),
        Case(f"{fid}/slime-c4-empty-rank", fid, "regression",
             "slime, T = 12, prompt 4, C = 4: c = 2; rank 0 owns no token (it must still join collectives, "
             "slime #2123), rank 1 response token 0, rank 2 tokens 1, 2, 7, rank 3 tokens 3..6",
             {"mask": MASK12}, {"cp_size": 4}, links=SLIME_2123),
        Case(f"{fid}/empty-sequence", fid, "edge", "a row with no unmasked token: chunk size 0, owns nothing",
             {"mask": [[False, True, True, True], [False] * 4]}, {"cp_size": 2}),
        Case(f"{fid}/all-masked", fid, "edge", "no token: every rank holds 0 tokens",
             {"mask": [[False] * 5] * 2}, {"cp_size": 2}),
        Case(f"{fid}/short-sequence", fid, "edge", "n = 2 < 2C = 8: c = 1, the middle ranks get nothing",
             {"mask": [[False, True] + [False] * 6]}, {"cp_size": 4}),
        Case(f"{fid}/cp-1", fid, "edge", "C = 1: two chunks, both on rank 0",
             {"mask": [[False, True, True, True, True]]}, {"cp_size": 1}),
        Case(f"{fid}/random-1", fid, "random",
             "generator mask (seed 401), lengths 16, 9, 1 and 0, ownership 'position', C = 3",
             {"mask": random_inputs(401, 4, 16, ("mask",), (16, 9, 1, 0))["mask"]},
             {"cp_size": 3, "ownership": "position"}),
        Case(f"{fid}/random-2", fid, "random",
             "generator mask (seed 402), bshd, ownership 'position', C = 4",
             {"mask": random_inputs(402, 3, 13, ("mask",), (13, 5, 2))["mask"]},
             {"cp_size": 4, "layout": "bshd", "ownership": "position"}),
    ]


def cp_reduce_cases():
    fid = "dist.cp_reduce"
    out = [
        Case(f"{fid}/worked", fid, "example",
             "q_t = t, tokens 4..11, token mean over N_tok = 8 on both ranks: R_0 = (10 + 11)/8 = 2.625, "
             "R_1 = (4 + ... + 9)/8 = 4.875, sum 7.5; gradient 1/8",
             {"values": ARANGE12, "mask": MASK12}, {"cp_size": 2}),
        Case(f"{fid}/sample-mean-c2", fid, "example",
             "q_t = t, agg.sample_mean over one row: the same numbers as the token mean (N = 1, D = 8)",
             {"values": ARANGE12, "mask": MASK12}, {"cp_size": 2, "aggregator": "agg.sample_mean"}),
        Case(f"{fid}/constant-c4", fid, "example",
             "q_t = t, agg.constant K = 16, C = 4: rank 0 0, rank 1 4/16, rank 2 (5 + 6 + 11)/16, "
             "rank 3 (7 + 8 + 9 + 10)/16; sum 60/16",
             {"values": ARANGE12, "mask": MASK12}, {"cp_size": 4, "aggregator": "agg.constant",
                                                    "agg_params": {"divisor": 16}}),
        Case(f"{fid}/c4-empty-rank", fid, "regression",
             "C = 4: rank 0 owns none of the response and contributes R_0 = 0 (slime #2123); q_t = t, token mean",
             {"values": ARANGE12, "mask": MASK12}, {"cp_size": 4}, links=SLIME_2123),
        Case(f"{fid}/given-global-counts", fid, "edge",
             "counts given in agg_params are kept: sample mean with D = (8, 4, 0, 2) and N = 6",
             {"values": V, "mask": VM}, {"cp_size": 2, "aggregator": "agg.sample_mean",
                                         "agg_params": {"sequence_token_counts": [8, 4, 0, 2], "num_sequences": 6}}),
        Case(f"{fid}/all-masked", fid, "edge", "no token: every partial and the unsharded value are 0",
             {"values": V, "mask": [[False] * 6] * 4}, {"cp_size": 2}),
        Case(f"{fid}/cp-1", fid, "edge", "C = 1: the one partial is the unsharded value",
             {"values": V, "mask": VM}, {"cp_size": 1, "aggregator": "agg.sample_mean"}),
        Case(f"{fid}/cp-8", fid, "edge", "C = 8 over rows of at most 6 positions: most ranks hold nothing",
             {"values": V, "mask": VM, "document_ids": VD}, {"cp_size": 8, "aggregator": "agg.document_mean"}),
    ]
    for aggregator in AGGS:
        short = aggregator.split(".")[1]
        for layout, C in (("thd", 2), ("bshd", 3)):
            out.append(Case(
                f"{fid}/{short}-{layout}-c{C}", fid, "example" if layout == "thd" else "edge",
                f"{aggregator}, {layout}, C = {C} over 4 rows (one empty, one shorter than 2C); groups (1, 1, 0, 0), "
                f"document 1 spans rows 0 and 1",
                {"values": V, "mask": VM, **ids(aggregator)}, agg_p(aggregator, cp_size=C, layout=layout)))
        out.append(Case(
            f"{fid}/{short}-masked-nan-inf", fid, "edge",
            f"{aggregator}: NaN and infinities at masked positions never reach a partial or the gradient",
            {"values": DIRTY, "mask": VM, **ids(aggregator)}, agg_p(aggregator, cp_size=2)))
    r1 = random_inputs(403, 3, 16, ("values", "mask"), (16, 11, 3))
    r2 = random_inputs(404, 4, 9, ("values", "mask"), (9, 0, 4, 9))
    out += [
        Case(f"{fid}/random-token-mean", fid, "random", "generator inputs (seed 403), ownership 'position', C = 3",
             r1, {"cp_size": 3, "ownership": "position"}),
        Case(f"{fid}/random-prompt-mean", fid, "random",
             "generator inputs (seed 403), groups (0, 1, 0), ownership 'position', bshd, C = 2",
             {**r1, "group_ids": [0, 1, 0]},
             {"cp_size": 2, "layout": "bshd", "ownership": "position", "aggregator": "agg.prompt_mean"}),
        Case(f"{fid}/random-document-mean", fid, "random",
             "generator inputs (seed 404), four documents, ownership 'position', C = 2",
             {**r2, "document_ids": [[t // 3 for t in range(9)], [0] * 9, [2, 2, 3, 3, 3, 3, 3, 3, 3], [3] * 9]},
             {"cp_size": 2, "ownership": "position", "aggregator": "agg.document_mean"}),
    ]
    return out


def accumulate_cases():
    fid = "dist.accumulate"
    out = [
        Case(f"{fid}/megatron-7452", fid, "regression",
             "Megatron-LM#7452 reconstruction, one sequence per micro-batch: contributions (6/4, 10/4) = (1.5, 2.5), "
             "total 4 (gradient 1/4 per token); naive (6/1 + 10/3)/2 = 14/3",
             {"values": [[6.0, 0.0, 0.0], [2.0, 4.0, 4.0]], "mask": [[True, False, False], [True, True, True]]},
             {"micro_batch_sizes": [1, 1]}, links=L7452),
        Case(f"{fid}/skyrl-925", fid, "regression",
             "SkyRL token_mean was a mean of micro-batch means (#925): rows of 1 and 3 tokens, q = (8) and "
             "(1, 2, 3): total 14/4 = 3.5, naive (8 + 2)/2 = 5",
             {"values": [[8.0, 0.0, 0.0], [1.0, 2.0, 3.0]], "mask": [[True, False, False], [True, True, True]]},
             {"micro_batch_sizes": [1, 1]}, links=("https://github.com/NovaSky-AI/SkyRL/pull/925",)),
        Case(f"{fid}/balanced", fid, "example",
             "two micro-batches of two full rows: naive = total = (1 + ... + 8)/8 = 4.5",
             {"values": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]], "mask": [[True, True]] * 4},
             {"micro_batch_sizes": [2, 2]}),
        Case(f"{fid}/sample-mean", fid, "example",
             "agg.sample_mean, micro-batches of 1 and 2 rows, N = 3: contributions 6/3 = 2 and (3 + 4)/3, "
             "total (6 + 3 + 4)/3 = 13/3; naive (6 + (3 + 4)/2)/2 = 4.75",
             {"values": [[6.0, 0.0], [2.0, 4.0], [4.0, 1.0]], "mask": [[True, False], [True, True], [True, False]]},
             {"micro_batch_sizes": [1, 2], "aggregator": "agg.sample_mean"}),
        Case(f"{fid}/prompt-mean-split-group", fid, "example",
             "agg.prompt_mean, group 1 (rows 0, 1) split over micro-batches [1, 3]: it keeps its whole D_g = 6",
             {"values": V, "mask": VM, "group_ids": VG},
             {"micro_batch_sizes": [1, 3], "aggregator": "agg.prompt_mean"}),
    ]
    for aggregator in AGGS:
        short = aggregator.split(".")[1]
        out.append(Case(
            f"{fid}/{short}-uneven", fid, "example" if aggregator in ("agg.document_mean", "agg.constant") else "edge",
            f"{aggregator}, micro-batches [2, 1, 1] (the third one empty, the fourth a single token)",
            {"values": V, "mask": VM, **ids(aggregator)}, agg_p(aggregator, micro_batch_sizes=[2, 1, 1])))
        out.append(Case(
            f"{fid}/{short}-masked-nan-inf", fid, "edge",
            f"{aggregator}: NaN and infinities at masked positions, one sequence per micro-batch",
            {"values": DIRTY, "mask": VM, **ids(aggregator)}, agg_p(aggregator)))
    out += [
        Case(f"{fid}/one-micro-batch", fid, "edge", "M = 1: naive = total = the aggregate",
             {"values": V, "mask": VM}, {"micro_batch_sizes": [4], "aggregator": "agg.sample_mean"}),
        Case(f"{fid}/all-masked", fid, "edge", "no token: every contribution is 0",
             {"values": V, "mask": [[False] * 6] * 4}, {"micro_batch_sizes": [2, 2]}),
        Case(f"{fid}/random-1", fid, "random", "generator inputs (seed 405), micro-batches [2, 3]",
             random_inputs(405, 5, 12, ("values", "mask"), (12, 3, 0, 12, 7)), {"micro_batch_sizes": [2, 3]}),
        Case(f"{fid}/random-2", fid, "random", "generator inputs (seed 406), sample mean, one row per micro-batch",
             random_inputs(406, 4, 10, ("values", "mask"), (10, 1, 6, 10)), {"aggregator": "agg.sample_mean"}),
    ]
    return out


def sdp_cases():
    fid = "dist.sdp_segment"
    lp = [[-1.0, -2.5, -0.5, -3.0, -0.25, -1.5, -2.0, -0.75, -1.25, -4.0],
          [-0.5, -1.0, -2.0, -0.125, -3.5, -1.0, -0.5, -0.25, -2.0, -1.5]]
    old = [[-1.5, -2.0, -0.75, -2.5, -0.5, -1.0, -2.0, -1.0, -1.0, -3.5],
           [-0.75, -1.5, -1.5, -0.25, -3.0, -1.5, -0.5, -0.5, -2.5, -1.0]]
    mask = [[t != 0 and t != 7 for t in range(10)], [t < 8 for t in range(10)]]
    docs = [[0] * 4 + [1] * 6, [1] * 2 + [2] * 8]   # document 1 spans rows 0 and 1
    out = [
        Case(f"{fid}/worked", fid, "example",
             "one row, documents (0, 0, 0, 1), S = 2: rho_0 = 0.5/3 + 0.5/3 = 1/3, R_0 = e^(1/3) = 1.3956124251; "
             "rho_1 = -1, R_1 = e^-1; gradient R_s / N_s",
             {"logprobs": [[-1.0, -2.0, -0.5, -3.0]], "old_logprobs": [[-1.5, -2.0, -1.0, -2.0]],
              "mask": [[True, True, True, True]], "document_ids": [[0, 0, 0, 1]]}, {"sdp_size": 2}),
        Case(f"{fid}/s1", fid, "example", "S = 1: one rank holds everything; rho_s is the segment's mean log-ratio",
             {"logprobs": [[-1.0, -2.0, -0.5, -3.0]], "old_logprobs": [[-1.5, -2.0, -1.0, -2.0]],
              "mask": [[True, True, True, True]], "document_ids": [[0, 0, 0, 1]]}, {"sdp_size": 1}),
        Case(f"{fid}/split-document-s3", fid, "example",
             "two packed rows of 10, document 1 spans both rows, S = 3 (pieces of 4, 4, 2 positions)",
             {"logprobs": lp, "old_logprobs": old, "mask": mask, "document_ids": docs}, {"sdp_size": 3}),
        Case(f"{fid}/one-position-per-rank", fid, "edge", "S = T = 10: every rank holds one position of each row",
             {"logprobs": lp, "old_logprobs": old, "mask": mask, "document_ids": docs}, {"sdp_size": 10}),
        Case(f"{fid}/more-ranks-than-positions", fid, "edge", "S = 6 > T = 4: pieces of 1, ranks 4 and 5 hold nothing",
             {"logprobs": [[-1.0, -2.0, -0.5, -3.0]], "old_logprobs": [[-1.5, -2.0, -1.0, -2.0]],
              "mask": [[True, True, True, True]], "document_ids": [[0, 0, 0, 1]]}, {"sdp_size": 6}),
        Case(f"{fid}/empty-sequence", fid, "edge", "the second row has no unmasked token and adds no segment",
             {"logprobs": lp, "old_logprobs": old, "mask": [mask[0], [False] * 10], "document_ids": docs},
             {"sdp_size": 2}),
        Case(f"{fid}/all-masked", fid, "edge", "no token: no segment (empty outputs)",
             {"logprobs": lp, "old_logprobs": old, "mask": [[False] * 10] * 2, "document_ids": docs}, {"sdp_size": 2}),
        Case(f"{fid}/masked-nan-inf", fid, "edge", "NaN and infinities at masked positions never reach a result",
             {"logprobs": [[-1.0, "nan", -0.5, "-inf"]], "old_logprobs": [[-1.5, "inf", -1.0, "nan"]],
              "mask": [[True, False, True, False]], "document_ids": [[0, 0, 0, 1]]}, {"sdp_size": 2}),
        Case(f"{fid}/log-ratio-20", fid, "edge", "segment mean log-ratios +20 and -20 (e^20 = 4.85e8)",
             {"logprobs": [[0.0, 0.0, -20.0, -20.0]], "old_logprobs": [[-20.0, -20.0, 0.0, 0.0]],
              "mask": [[True] * 4], "document_ids": [[0, 0, 1, 1]]}, {"sdp_size": 2}),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "segment mean log-ratios +200 and -200: e^200 = 7.2e86 overflows float32, e^-200 underflows",
             {"logprobs": [[0.0, 0.0, -200.0, -200.0]], "old_logprobs": [[-200.0, -200.0, 0.0, 0.0]],
              "mask": [[True] * 4], "document_ids": [[0, 0, 1, 1]]}, {"sdp_size": 2}),
        Case(f"{fid}/tiny-difference", fid, "edge",
             "log-ratios 2^-20 (rank 0) and -2^-21 (rank 1) in one document of 4: rho = 2^-22 - 2^-23 = 2^-23",
             {"logprobs": [[-2.0 ** -20, -0.5, -1.0, -2.0 ** -21]],
              "old_logprobs": [[-2.0 ** -19, -0.5, -1.0, 0.0]], "mask": [[True] * 4], "document_ids": [[0, 0, 0, 0]]},
             {"sdp_size": 2}),
    ]
    r = random_inputs(407, 3, 16, ("logprobs", "old_logprobs", "mask"), (16, 12, 5))
    out.append(Case(f"{fid}/random-1", fid, "random",
                    "generator inputs (seed 407), documents of 5 positions continuing across rows, S = 3",
                    {**r, "document_ids": [[(16 * i + t) // 5 for t in range(16)] for i in range(3)]}, {"sdp_size": 3}))
    r = random_inputs(408, 2, 11, ("logprobs", "old_logprobs", "mask"), (11, 8))
    out.append(Case(f"{fid}/random-2", fid, "random", "generator inputs (seed 408), three documents, S = 4",
                    {**r, "document_ids": [[0] * 6 + [1] * 5, [1] * 2 + [2] * 9]}, {"sdp_size": 4}))
    return out


SLIME_2060 = ("https://github.com/THUDM/slime/pull/2060",)
# a micro-batch whose longest sequence is 6 positions, held in arrays padded to 10
MB10 = [[t >= 1 and t < 6 for t in range(10)], [t >= 1 and t < 4 for t in range(10)]]


def bshd_max_seq_len_cases():
    """slime PR #2060's bshd layout: each row cut by the micro-batch's maximum length, not the array width."""
    split, reduce = "dist.cp_split", "dist.cp_reduce"
    vals = [[0.5 * t - 1.0 for t in range(10)], [2.0 - 0.25 * t for t in range(10)]]
    return [
        Case(f"{split}/bshd-max-seq-len-6", split, "example",
             "bshd, C = 2, arrays of width T = 10 but max_seq_len 6 (slime's max_seq_lens): c = ceil(6/4) = 2, "
             "logit p = t - 1 -> chunk p // 2 -> ranks 0 0 1 1 1 (row 0, tokens 1..5)",
             {"mask": MB10}, {"cp_size": 2, "layout": "bshd", "max_seq_len": 6}, SLIME_2060),
        Case(f"{split}/bshd-padded-width-10", split, "example",
             "the same rows with max_seq_len null: c = ceil(10/4) = 3, the padded width decides (chunks of 3): "
             "ranks 0 0 0 1 1 for row 0 -- a different split", {"mask": MB10}, {"cp_size": 2, "layout": "bshd"}),
        Case(f"{split}/bshd-max-seq-len-padded-up", split, "edge",
             "max_seq_len 8 (6 rounded up to a pad multiple of 4, as slime does): c = 2, C = 2",
             {"mask": MB10}, {"cp_size": 2, "layout": "bshd", "max_seq_len": 8}, SLIME_2060),
        Case(f"{split}/thd-same-rows", split, "example",
             "thd on the same rows: each row cut by its own length (6 and 4): c = 2 and 1",
             {"mask": MB10}, {"cp_size": 2, "layout": "thd"}, SLIME_2060),
        Case(f"{reduce}/bshd-max-seq-len-6", reduce, "example",
             "sample mean under bshd with max_seq_len 6, C = 2: the rank partials add up to the unsharded value",
             {"values": vals, "mask": MB10},
             {"cp_size": 2, "layout": "bshd", "max_seq_len": 6, "aggregator": "agg.sample_mean"}, SLIME_2060),
        Case(f"{reduce}/bshd-max-seq-len-3-ranks", reduce, "edge",
             "token mean under bshd with max_seq_len 6, C = 3: c = 1",
             {"values": vals, "mask": MB10}, {"cp_size": 3, "layout": "bshd", "max_seq_len": 6}, SLIME_2060),
        Case(f"{reduce}/thd-same-rows", reduce, "example",
             "sample mean under thd on the same rows, C = 2",
             {"values": vals, "mask": MB10}, {"cp_size": 2, "layout": "thd", "aggregator": "agg.sample_mean"},
             SLIME_2060),
    ]


FASTLLM_502 = ("https://github.com/ServiceNow/Fast-LLM/pull/502",)


def docs_per_step_cases():
    """Fast-LLM PR #502 docs_per_step: fetch micro-batches until the document target, divide by the step total."""
    fid = "dist.docs_per_step"
    # four rollouts, one per row (document id = row)
    one = {"values": [[1.0, 2.0, 0.0], [-4.0, 0.5, 0.25], [3.0, 0.0, 0.0], [8.0, 8.0, 8.0]],
           "mask": [[True, True, False], [True, True, True], [True, False, False], [True, True, True]],
           "document_ids": [[0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3]]}
    # packed rows of two documents each
    packed = {"values": [[1.0, 2.0, 3.0, 4.0], [0.5, -0.5, 1.5, 2.5], [9.0, 9.0, 9.0, 9.0]],
              "mask": [[True, True, True, True], [True, True, True, False], [True, True, True, True]],
              "document_ids": [[0, 0, 1, 1], [2, 3, 3, 3], [4, 4, 5, 5]]}
    gen = random_inputs(409, 6, 8, ("values", "mask"), (8, 3, 6, 1, 8, 5))
    return [
        Case(f"{fid}/one-rollout-micro-batches", fid, "example",
             "one rollout per micro-batch, target 3: micro-batches 0, 1, 2 fetched (D = 3); contributions "
             "3/3, -3.25/3, 3/3, null; total (3 - 3.25 + 3)/3 = 0.91666666667, gradient 1/3 on fetched tokens",
             one, {"docs_per_step": 3}, FASTLLM_502),
        Case(f"{fid}/whole-step-at-once", fid, "example",
             "the same three rollouts as one micro-batch of 3 rows (and the fourth alone): D = 3, the same total "
             "0.91666666667 (accumulation = the whole step at once)", one,
             {"docs_per_step": 3, "micro_batch_sizes": [3, 1]}, FASTLLM_502),
        Case(f"{fid}/overshoot", fid, "example",
             "packed micro-batches of 2 documents each, target 3: two micro-batches fetched, D = 4 > 3 (the step "
             "total, not the target, divides): (10 + 1.5)/4 = 2.875", packed, {"docs_per_step": 3}, FASTLLM_502),
        Case(f"{fid}/target-reached-exactly", fid, "edge", "target 4 on the packed rows: D = 4 after two micro-batches",
             packed, {"docs_per_step": 4}),
        Case(f"{fid}/target-1", fid, "edge", "target 1: the first micro-batch alone, D = 2 (its two documents)",
             packed, {"docs_per_step": 1}),
        Case(f"{fid}/normalize-by-documents-one-micro-batch", fid, "example",
             "Fast-LLM normalize_by_documents with the step in one micro-batch (micro_batch_sizes = [3]; any target "
             "up to D fetches it): the formula counts D = 5 documents (ids 0-4 among the unmasked tokens; the 9s "
             "sit at masked positions and are not read), total = token sum 3.875 / 5 = 0.775, gradient 1/5 "
             "(= agg.constant, divide_by K, divisor 5)",
             {"values": [[-1.25, 0.5, 2.0, 0.0], [0.75, -0.25, 0.0, 0.0], [1.5, 1.0, -0.5, 0.125]],
              "mask": [[True, True, True, False], [True, True, False, False], [True, True, True, True]],
              "document_ids": [[0, 0, 1, 9], [2, 2, 9, 9], [3, 3, 4, 4]]},
             {"docs_per_step": 1, "micro_batch_sizes": [3]}, FASTLLM_502),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities (and stray document ids) at masked positions reach no contribution or gradient",
             {"values": [[1.0, "nan"], ["inf", 2.0]], "mask": [[True, False], [False, True]],
              "document_ids": [[0, 7], [8, 1]]}, {"docs_per_step": 2}),
        Case(f"{fid}/random", fid, "random",
             "generator inputs (seed 409), 6 one-rollout rows, target 4 (one row has 1 token)",
             {**gen, "document_ids": [[i] * 8 for i in range(6)]}, {"docs_per_step": 4}),
    ]


def cases():
    return (cp_split_cases() + cp_reduce_cases() + accumulate_cases() + sdp_cases() + bshd_max_seq_len_cases()
            + docs_per_step_cases())
