"""dist: distributed reductions - context-parallel split, rank-local contributions, micro-batch
accumulation, and Fast-LLM's sequence-data-parallel segment sums (spec/dist.md).

The invariant behind every formula here: an ``agg.*`` aggregate is a masked sum times constants
that depend only on the *whole* batch's mask, so any partition of the tokens (CP ranks, micro-
batches, SDP ranks) gives shard contributions that add up to the unsharded value, provided each
shard is given the whole batch's denominators.  The formulas compute the shards exactly as a
distributed implementation would, so a test can compare their sum with the unsharded value.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import agg
from ._ad import exp, total
from ._common import MASK, LOGPROBS, OLD_LOGPROBS, VALUES, positions, scalar_output
from ._errors import SpecError
from ._evaluate import check_params
from ._registry import REGISTRY, Input, Output, Param, formula

SLIME_CP = "slime 624b824 slime/backends/megatron_utils/cp_utils.py get_logits_and_tokens_offset_with_cp, get_sum_of_sample_mean"
FASTLLM_GSPO = ("Fast-LLM 7d61a1b fast_llm/layers/language_model/loss/policy_gradient.py "
                "fused_gspo_loss_forward_backward (sdp_group all-reduce of 1/N_s-weighted sums)")

GROUP_IDS_OPT = Input("group_ids", (("B",),), kind="int", optional=True, doc="prompt-group id of each sequence (agg.prompt_mean)")
DOCUMENT_IDS_OPT = Input("document_ids", (("B", "T"),), kind="int", optional=True,
                         doc="document id of each token (agg.document_mean)")

__all__ = ["zigzag_rank", "cp_owner_map", "contiguous_rank"]


@dataclass(frozen=True)
class AggParamsParam(Param):
    """The parameters of the chosen ``agg.*`` aggregator, as an object (validated against it)."""

    def range_text(self) -> str:
        return "an object of the chosen aggregator's parameters (see agg.*), or null for its defaults"

    def check(self, formula_id: str, value):
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise SpecError(f"{formula_id}: parameter {self.name!r} must be {self.range_text()}, got {value!r}")
        return dict(value)


def _aggregator_params():
    return (
        Param("aggregator", "agg.token_mean", kind="choice", choices=tuple(agg.AGGREGATORS),
              doc="the agg.* formula whose value is distributed"),
        AggParamsParam("agg_params", None, kind="object", nullable=True,
                       doc="parameters of the aggregator; null denominators are counted over the whole batch"),
    )


def _checked_agg_params(fid, aggregator, agg_params):
    try:
        return check_params(REGISTRY[aggregator], agg_params)
    except SpecError as e:
        raise SpecError(f"{fid}: parameter 'agg_params': {e}") from None


def _require_ids(fid, aggregator, group_ids, document_ids):
    if aggregator == "agg.prompt_mean" and group_ids is None:
        raise SpecError(f"{fid}: aggregator 'agg.prompt_mean' needs input 'group_ids' (shape [B])")
    if aggregator == "agg.document_mean" and document_ids is None:
        raise SpecError(f"{fid}: aggregator 'agg.document_mean' needs input 'document_ids' (shape [B,T])")


# Context-parallel zig-zag split ------------------------------------------------------------------
def ceil_div(a, b):
    return -(-a // b)


def zigzag_rank(position, chunk_size, cp_size):
    """The CP rank holding input ``position`` in the zig-zag layout: chunk k = position // c of the
    2C chunks is held by rank k if k < C, else by rank 2C - 1 - k (rank r holds chunks r, 2C-1-r)."""
    k = position // chunk_size
    return k if k < cp_size else 2 * cp_size - 1 - k


def cp_owner_map(mask, cp_size, layout, ownership, sequence_lengths, fid="dist.cp_split", max_seq_len=None):
    """(rank [B,T], chunk [B,T], chunk_size [B]) of the zig-zag split; None at masked positions.

    Sequence i occupies positions 0..n_i-1 (n_i from ``sequence_lengths`` or 1 + its last unmasked
    position).  Chunk size: thd c_i = ceil(n_i / 2C); bshd c = ceil(S / 2C) for every row, with
    S = ``max_seq_len`` (slime: the micro-batch's maximum length, rounded up to its pad multiple) or
    the padded width T when null.  The
    value at position t is owned by the rank holding position t ("position") or t - 1 ("logit": the
    logit at t - 1 predicts token t, slime's rule).
    """
    B = len(mask)
    T = len(mask[0]) if B else 0
    if sequence_lengths is not None and len(sequence_lengths) != B:
        raise SpecError(f"{fid}: parameter 'sequence_lengths' must have one entry per sequence (B={B}), got {len(sequence_lengths)}")
    ranks, chunks, sizes = [], [], []
    for i, row in enumerate(mask):
        ts = positions(row)
        last = ts[-1] + 1 if ts else 0
        n = last if sequence_lengths is None else sequence_lengths[i]
        if n < last or n > T:
            raise SpecError(
                f"{fid}: parameter 'sequence_lengths'[{i}] = {n} must lie in [{last}, {T}] (it must cover the "
                f"sequence's unmasked positions and fit in the padded width T={T})"
            )
        if layout == "thd":
            c = ceil_div(n, 2 * cp_size)
        else:
            if max_seq_len is not None and max_seq_len < n:
                raise SpecError(f"{fid}: parameter 'max_seq_len' = {max_seq_len} is shorter than sequence {i} "
                                f"(length {n}); it must be at least every sequence's length")
            c = ceil_div(T if max_seq_len is None else max_seq_len, 2 * cp_size)
        sizes.append(c)
        rank_row, chunk_row = [None] * T, [None] * T
        for t in ts:
            p = t - 1 if ownership == "logit" else t
            if p < 0:
                raise SpecError(
                    f"{fid}: mask[{i}][0] is true but ownership='logit' assigns the value at position t to the rank "
                    f"holding logit t-1, and position 0 has none (slime requires a prompt of length >= 1); mask "
                    f"position 0 or use ownership='position'"
                )
            chunk_row[t] = p // c
            rank_row[t] = zigzag_rank(p, c, cp_size)
        ranks.append(rank_row)
        chunks.append(chunk_row)
    return ranks, chunks, sizes


def _check_max_seq_len(fid, layout, max_seq_len):
    if max_seq_len is not None and layout != "bshd":
        raise SpecError(f"{fid}: parameter 'max_seq_len' applies only to layout='bshd' (thd cuts each sequence by its "
                        f"own length); it must be null")


def _cp_params():
    return (
        Param("cp_size", 2, kind="int", lo=1, doc="C, the number of context-parallel ranks"),
        Param("layout", "thd", kind="choice", choices=("thd", "bshd"),
              doc="thd (packed): each sequence is cut by its own length n_i; bshd (padded): by the padded width T"),
        Param("ownership", "logit", kind="choice", choices=("logit", "position"),
              doc="the value at position t lives on the rank holding logit t-1 (slime, 'logit') or position t "
                  "(Transformer Engine's input split, 'position')"),
        agg.IntListParam("sequence_lengths", None, kind="int_list", nullable=True,
                         doc="n_i, the length of each sequence (prompt + response) in the thd layout; null: 1 + the "
                             "last unmasked position"),
        Param("max_seq_len", None, kind="int", lo=1, nullable=True,
              doc="bshd only: S, the length every row is cut by, c = ceil(S / 2C) (slime PR #2060 max_seq_lens: the "
                  "maximum total length, rounded up to TP x data_pad_size_multiplier); null: the padded width T"),
    )


@formula(
    "dist.cp_split",
    title="Context-parallel zig-zag split: the CP rank that holds each token",
    inputs=(MASK,),
    params=_cp_params(),
    outputs=(
        Output("rank", ("B", "T"), kind="int", doc="the CP rank r in [0, C) holding the token (null where the mask is false)"),
        Output("chunk", ("B", "T"), kind="int", doc="the chunk k in [0, 2C) holding the token (null where the mask is false)"),
        Output("chunk_size", ("B",), kind="int", doc="c_i, the chunk length used for sequence i"),
        Output("tokens_per_rank", ("C",), kind="int", doc="the number of unmasked tokens each rank holds"),
    ),
    references=(
        SLIME_CP,
        "NeMo-RL nemo_rl/distributed/model_utils.py _get_tokens_on_this_cp_rank (zig-zag, 2C chunks)",
        "Megatron-LM megatron/rl/rl_utils.py _scatter_for_context_parallel (TE thd_get_partitioned_indices)",
    ),
)
def cp_split(mask, *, cp_size, layout, ownership, sequence_lengths, max_seq_len):
    """dist.cp_split:  rank(i, t) = k if k < C else 2C - 1 - k,  k = floor(p / c_i),
    p = t - 1 (ownership "logit") or t ("position"),  c_i = ceil(n_i / 2C) (thd) or ceil(S / 2C) (bshd),
    S = max_seq_len or the padded width T."""
    _check_max_seq_len("dist.cp_split", layout, max_seq_len)
    ranks, chunks, sizes = cp_owner_map(mask, cp_size, layout, ownership, sequence_lengths, max_seq_len=max_seq_len)
    per_rank = [0] * cp_size
    for row in ranks:
        for r in row:
            if r is not None:
                per_rank[r] += 1
    return {"rank": ranks, "chunk": chunks, "chunk_size": sizes, "tokens_per_rank": per_rank}


@formula(
    "dist.cp_reduce",
    title="Rank-local contributions of an aggregator under context parallelism, with full-mask denominators",
    inputs=(VALUES, MASK, GROUP_IDS_OPT, DOCUMENT_IDS_OPT),
    params=_cp_params() + _aggregator_params(),
    outputs=(
        Output("partials", ("C",), doc="R_r, the contribution of the tokens held by CP rank r"),
        scalar_output("unsharded", "the aggregate of the whole batch (cp = 1)"),
    ),
    differentiable=("values",),
    grad_of="partials",
    references=(
        SLIME_CP,
        "slime tests/test_cp_utils.py (rank-sum invariance; per-micro-batch denominators are wrong)",
        "slime PR #2060 (unmerged) --pg-loss-divisor: cp=2 rank-sum tests for thd and bshd",
    ),
)
def cp_reduce(values, mask, group_ids, document_ids, *, cp_size, layout, ownership, sequence_lengths, max_seq_len,
              aggregator, agg_params):
    """dist.cp_reduce:  R_r = A(q restricted to Omega_r; denominators of the full mask),  r = 0..C-1,
    with Omega_r the tokens dist.cp_split gives rank r and A the chosen aggregator;
    sum_r R_r = A(q) (the unsharded aggregate)."""
    fid = "dist.cp_reduce"
    _require_ids(fid, aggregator, group_ids, document_ids)
    p = _checked_agg_params(fid, aggregator, agg_params)
    _check_max_seq_len(fid, layout, max_seq_len)
    ranks, _, _ = cp_owner_map(mask, cp_size, layout, ownership, sequence_lengths, fid, max_seq_len)
    full = agg.full_denominators(aggregator, mask, group_ids, document_ids, p)
    partials = []
    for r in range(cp_size):
        mask_r = [[m and ranks[i][t] == r for t, m in enumerate(row)] for i, row in enumerate(mask)]
        partials.append(agg.apply(aggregator, values, mask_r, group_ids, document_ids, full))
    return {"partials": partials, "unsharded": agg.apply(aggregator, values, mask, group_ids, document_ids, p)}


# Micro-batch accumulation ------------------------------------------------------------------------
def micro_batches(fid, sizes, B):
    """Row index lists of the consecutive micro-batches (one sequence each when ``sizes`` is null)."""
    if sizes is None:
        return [[i] for i in range(B)]
    if any(s < 1 for s in sizes) or sum(sizes) != B:
        raise SpecError(f"{fid}: parameter 'micro_batch_sizes' must be positive integers summing to B={B}, got {sizes}")
    out, start = [], 0
    for s in sizes:
        out.append(list(range(start, start + s)))
        start += s
    return out


def _rows(x, rows):
    return None if x is None else [x[i] for i in rows]


def _select(aggregator, params, rows):
    """The aggregator's parameters for a micro-batch: per-sequence and per-token lists restricted to its rows."""
    q = dict(params)
    for name in ("sequence_token_counts", "group_token_counts", "document_token_counts"):
        if name in q and q[name] is not None:
            q[name] = [q[name][i] for i in rows]
    return q


@formula(
    "dist.accumulate",
    title="Micro-batch (gradient) accumulation with global denominators, and the naive per-micro-batch mean",
    inputs=(VALUES, MASK, GROUP_IDS_OPT, DOCUMENT_IDS_OPT),
    params=(
        agg.IntListParam("micro_batch_sizes", None, kind="int_list", lo=1, length="[M]", nullable=True,
                         doc="sizes (in sequences, >= 1, summing to B) of the consecutive micro-batches; "
                             "null: one sequence per micro-batch"),
    ) + _aggregator_params(),
    outputs=(
        Output("contributions", ("M",), doc="each micro-batch's aggregate with the whole batch's denominators"),
        scalar_output("total", "the sum of the contributions (= the aggregate of the whole batch)"),
        Output("naive_contributions", ("M",), doc="each micro-batch's aggregate with its own denominators, divided by M"),
        scalar_output("naive", "the mean over micro-batches of locally normalized aggregates (not invariant)"),
    ),
    differentiable=("values",),
    grad_of="total",
    references=(
        "NeMo-RL nemo_rl/models/megatron/data.py process_global_batch (global_valid_seqs/toks per optimizer step)",
        "trl 1.16.0 GRPOTrainer num_items_in_batch (global token count of the generation batch)",
        "Megatron-LM train_rl.py loss_func without --calculate-per-token-loss (mean of micro-batch token means)",
        "skyrl-train 0.3.1 reduce_loss token_mean per micro-batch / accumulation_steps (SkyRL #925, fixed by #1296)",
        "Megatron-LM issue #7452 (local token counts under uneven DP: gradient 14/3 instead of 4)",
    ),
)
def accumulate(values, mask, group_ids, document_ids, *, micro_batch_sizes, aggregator, agg_params):
    """dist.accumulate:  c_k = A(q restricted to micro-batch k; denominators of the whole batch),
    total = sum_k c_k = A(q);  naive = (1/M) sum_k A(q restricted to micro-batch k; its own denominators)."""
    fid = "dist.accumulate"
    _require_ids(fid, aggregator, group_ids, document_ids)
    p = _checked_agg_params(fid, aggregator, agg_params)
    full = agg.full_denominators(aggregator, mask, group_ids, document_ids, p)
    local = dict(p, **{name: None for name in agg.DENOMINATOR_PARAMS[aggregator]})
    batches = micro_batches(fid, micro_batch_sizes, len(mask))
    M = len(batches)
    contributions, naive = [], []
    for rows in batches:
        sub = (_rows(values, rows), _rows(mask, rows), _rows(group_ids, rows), _rows(document_ids, rows))
        contributions.append(agg.apply(aggregator, *sub, _select(aggregator, full, rows)))
        naive.append(agg.apply(aggregator, *sub, local) / M)
    return {"contributions": contributions, "total": total(contributions),
            "naive_contributions": naive, "naive": total(naive)}


# Fast-LLM docs_per_step: accumulate micro-batches up to a document-count target ------------------
FASTLLM_DOCS = ("Fast-LLM PR #502 (head 227f8bc1) fast_llm/engine/training/trainer.py _prefetch_to_doc_target "
                "(num_documents_in_batch reset to the step total on every micro-batch)")


@formula(
    "dist.docs_per_step",
    title="Fast-LLM docs_per_step: micro-batches accumulated until a document target, each divided by the step's documents",
    inputs=(VALUES, MASK, agg.DOCUMENT_IDS),
    params=(
        Param("docs_per_step", 1, kind="int", lo=1,
              doc="the target document count per optimizer step (Fast-LLM schedule.docs_per_step > 0)"),
        agg.IntListParam("micro_batch_sizes", None, kind="int_list", lo=1, length="[M]", nullable=True,
                         doc="sizes (in rows, >= 1, summing to B) of the consecutive micro-batches of the data stream; "
                             "null: one row per micro-batch"),
    ),
    outputs=(
        Output("micro_batches", (), kind="int", doc="K, the number of micro-batches fetched: the first K whose "
                                                    "document counts reach docs_per_step"),
        Output("num_documents", (), kind="int", doc="D = sum_{k<K} D_k, the step total (>= docs_per_step; it can "
                                                    "overshoot)"),
        Output("contributions", ("M",), doc="c_k = sum over micro-batch k's unmasked tokens of q / D for k < K; null "
                                            "for the micro-batches not fetched"),
        scalar_output("total", "sum_{k<K} c_k, the step's loss: the fetched tokens' sum divided by D"),
    ),
    differentiable=("values",),
    grad_of="total",
    references=(FASTLLM_DOCS, "Fast-LLM PR #502 fast_llm/engine/schedule/config.py ScheduleConfig.docs_per_step"),
)
def docs_per_step(values, mask, document_ids, *, docs_per_step, micro_batch_sizes):
    """dist.docs_per_step:  D_k = number of distinct document ids among micro-batch k's unmasked tokens,
    K = min{k : sum_{j<=k} D_j >= docs_per_step} + 1,  D = sum_{j<K} D_j,
    c_k = sum_{(i,t) in k} m_{i,t} q_{i,t} / D (k < K),  total = sum_{k<K} c_k.

    A document must lie in one micro-batch; if the whole stream holds fewer than docs_per_step
    documents the step cannot be formed (an error)."""
    fid = "dist.docs_per_step"
    batches = micro_batches(fid, micro_batch_sizes, len(mask))
    owner: dict[int, int] = {}
    per_batch = []
    for k, rows in enumerate(batches):
        ids = {document_ids[i][t] for i in rows for t in positions(mask[i])}
        for d in ids:
            if d in owner and owner[d] != k:
                raise SpecError(f"{fid}: input 'document_ids': document {d} spans micro-batches {owner[d]} and {k}; "
                                f"a micro-batch holds whole documents")
            owner[d] = k
        per_batch.append(len(ids))
    running, K = 0, None
    for k, n in enumerate(per_batch):
        running += n
        if running >= docs_per_step:
            K = k + 1
            break
    if K is None:
        raise SpecError(f"{fid}: parameter 'docs_per_step' = {docs_per_step} exceeds the {running} documents of the "
                        f"whole input; the step never reaches its target")
    D = sum(per_batch[:K])
    contributions = [total(values[i][t] for i in rows for t in positions(mask[i])) / D if k < K else None
                     for k, rows in enumerate(batches)]
    return {"micro_batches": K, "num_documents": D, "contributions": contributions,
            "total": total(c for c in contributions if c is not None)}


# Fast-LLM sequence-data-parallel GSPO segment sums ------------------------------------------------
def contiguous_rank(t, T, sdp_size):
    """The SDP rank holding position t when a row of width T is cut into ``sdp_size`` contiguous
    pieces of ceil(T / S) positions (the last pieces may be shorter or empty)."""
    return t // ceil_div(T, sdp_size)


@formula(
    "dist.sdp_segment",
    title="Fast-LLM GSPO under sequence-data parallelism: segment log-ratio as a sum of per-rank partial sums",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, agg.DOCUMENT_IDS),
    params=(Param("sdp_size", 2, kind="int", lo=1, doc="S, the number of sequence-data-parallel ranks"),),
    outputs=(
        Output("segment_ids", ("K",), kind="int", doc="the document id of each segment, in increasing order"),
        Output("rank", ("B", "T"), kind="int", doc="the SDP rank holding each token (null where the mask is false)"),
        Output("partials", ("S", "K"), doc="P_{r,s} = (1/N_s) sum of m (l - l_old) over segment s's tokens on rank r"),
        Output("log_ratio", ("K",), doc="rho_s = sum_r P_{r,s}, the segment's mean log-ratio"),
        Output("ratio", ("K",), doc="R_s = exp(rho_s), the GSPO sequence ratio of segment s"),
    ),
    differentiable=("logprobs",),
    grad_of="ratio",
    references=(
        FASTLLM_GSPO,
        "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071, Eq. 7",
        "Fast-LLM issue #556 (SDP/SP GSPO paths untested)",
    ),
)
def sdp_segment(logprobs, old_logprobs, mask, document_ids, *, sdp_size):
    """dist.sdp_segment:  P_{r,s} = (1/N_s) sum_{(i,t) in s, rank(t) = r} m_{i,t} (l_{i,t} - l^old_{i,t}),
    rho_s = sum_{r<S} P_{r,s},  R_s = exp(rho_s),  N_s = number of unmasked tokens of segment s;
    rank(t) = floor(t / ceil(T / S)) (contiguous split of each row)."""
    T = len(mask[0]) if mask else 0
    tokens: dict[int, list[tuple[int, int]]] = {}
    for i, row in enumerate(mask):
        for t in positions(row):
            tokens.setdefault(document_ids[i][t], []).append((i, t))
    ids = sorted(tokens)
    partials = [
        [total(logprobs[i][t] - old_logprobs[i][t] for i, t in tokens[s] if contiguous_rank(t, T, sdp_size) == r)
         / len(tokens[s]) for s in ids]
        for r in range(sdp_size)
    ]
    log_ratio = [total(partials[r][k] for r in range(sdp_size)) for k in range(len(ids))]
    rank = [[contiguous_rank(t, T, sdp_size) if m else None for t, m in enumerate(row)] for row in mask]
    return {"segment_ids": ids, "rank": rank, "partials": partials, "log_ratio": log_ratio,
            "ratio": [exp(x) for x in log_ratio]}
