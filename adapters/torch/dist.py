"""dist.* in PyTorch (spec/dist.md): the shards are made the way a distributed implementation makes
them, then reduced.

- ``dist.cp_split``: the zig-zag owner map of every token (-1 at masked positions).
- ``dist.cp_reduce``: each CP rank's local tensors are gathered from the batch (its tokens, packed
  to the left of a narrower padded row, as a rank holds only its own chunks), the aggregator runs
  on them with the whole batch's denominators, and the rank partials are stacked (what a SUM
  all-reduce of the rank losses adds up).
- ``dist.accumulate``: the batch is sliced into micro-batches of rows; each runs the aggregator with
  the accumulation window's denominators (``contributions``) or with its own, divided by M
  (``naive``).
- ``dist.sdp_segment``: each SDP rank holds a contiguous slice of every row and forms its
  1/N_s-weighted partial sum per segment; the partials are summed (the all-reduce).
"""

from __future__ import annotations

import torch

from pgspec.reference import SpecError

from . import agg as A
from ._validate import check_parameters
from .agg import param


# Context-parallel zig-zag split ------------------------------------------------------------------
def owner_map(mask, cp_size, layout, ownership, sequence_lengths=None, max_seq_len=None):
    """(rank [B,T], chunk [B,T], chunk_size [B]) as long tensors; -1 at masked positions."""
    B, T = mask.shape
    dev = mask.device
    pos = torch.arange(T, device=dev)
    if sequence_lengths is None:   # 1 + the last unmasked position (0 for an empty row)
        n = torch.where(mask, pos + 1, torch.zeros_like(pos)).amax(-1) if T else torch.zeros(B, dtype=torch.long,
                                                                                              device=dev)
    else:
        n = torch.as_tensor(sequence_lengths, dtype=torch.long, device=dev)
        last = torch.where(mask, pos + 1, torch.zeros_like(pos)).amax(-1) if T else torch.zeros(B, dtype=torch.long,
                                                                                                 device=dev)
        if n.dim() != 1 or n.shape[0] != B:
            raise SpecError(f"dist.cp_split: parameter 'sequence_lengths' must have one entry per sequence (B={B}), "
                            f"got {sequence_lengths}")
        if bool(((n < last) | (n > T)).any()):
            raise SpecError(f"dist.cp_split: parameter 'sequence_lengths' = {sequence_lengths}: each n_i must lie in "
                            f"[1 + the last unmasked position, T={T}]")
    two_c = 2 * cp_size
    if layout == "thd":
        c = (n + two_c - 1) // two_c
    else:
        if max_seq_len is not None and bool((n > max_seq_len).any()):
            raise ValueError("dist.cp_split: parameter 'max_seq_len' is shorter than a sequence")
        S = T if max_seq_len is None else int(max_seq_len)   # slime bshd: the micro-batch's max length
        c = torch.full((B,), (S + two_c - 1) // two_c, dtype=torch.long, device=dev)
    p = pos - 1 if ownership == "logit" else pos
    if ownership == "logit" and T and bool(mask[:, 0].any()):
        raise ValueError("dist.cp_split: ownership='logit' and an unmasked position 0 (it has no logit)")
    k = p.unsqueeze(0) // c.clamp(min=1).unsqueeze(-1)
    rank = torch.where(k < cp_size, k, two_c - 1 - k)
    minus = torch.full_like(rank, -1)
    return torch.where(mask, rank, minus), torch.where(mask, k, minus), c


def _cp_args(params, fid):
    layout, max_seq_len = param(fid, params, "layout"), param(fid, params, "max_seq_len")
    if max_seq_len is not None and layout != "bshd":
        raise ValueError(f"{fid}: parameter 'max_seq_len' applies only to layout='bshd'")
    return (param(fid, params, "cp_size"), layout, param(fid, params, "ownership"),
            param(fid, params, "sequence_lengths"), max_seq_len)


def cp_split(inputs, params):
    mask = inputs["mask"]
    cp_size = param("dist.cp_split", params, "cp_size")
    rank, chunk, c = owner_map(mask, *_cp_args(params, "dist.cp_split"))
    return {"rank": rank, "chunk": chunk, "chunk_size": c,
            "tokens_per_rank": torch.bincount(rank[mask], minlength=cp_size)}


def gather_rank(inputs, params, selected):
    """A shard's local tensors: for each row the positions where ``selected`` is true, packed to the
    left of a row of width max_i |selected_i|; the rest is padding with a false mask.  Per-sequence
    inputs and parameters stay as they are; per-token ones ([B, T] tensors) are gathered."""
    B, T = selected.shape
    pos = torch.arange(T, device=selected.device)
    # selected positions first (in order), then the others
    order = torch.argsort(torch.where(selected, pos, pos + T), dim=-1)
    counts = selected.sum(-1)
    width = int(counts.max()) if B else 0
    idx = order[:, :width]
    local_mask = torch.arange(width, device=selected.device).unsqueeze(0) < counts.unsqueeze(-1)

    def take(x):
        if isinstance(x, torch.Tensor) and x.dim() == 2 and tuple(x.shape) == (B, T):
            return x.gather(1, idx)
        return x

    local = {name: take(x) for name, x in inputs.items()}
    local["mask"] = local_mask
    return local, {name: take(x) for name, x in params.items()}


def check_micro_batches(fid, sizes, B):
    if any(int(k) < 1 for k in sizes) or sum(int(k) for k in sizes) != B:
        raise SpecError(f"{fid}: parameter 'micro_batch_sizes' must be positive integers summing to B={B}, "
                        f"got {list(sizes)}")


def _aggregator(params):
    aggregator = param("dist.cp_reduce", params, "aggregator")
    agg_params = dict(params.get("agg_params") or {})
    try:
        check_parameters(aggregator, agg_params)
    except SpecError as e:
        raise SpecError(f"parameter 'agg_params': {e}") from None
    return aggregator, agg_params


def cp_reduce(inputs, params):
    fid = "dist.cp_reduce"
    aggregator, agg_params = _aggregator(params)
    fn = A.IMPLEMENTATIONS[aggregator]
    mask = inputs["mask"]
    cp_size = param(fid, params, "cp_size")
    rank, _, _ = owner_map(mask, *_cp_args(params, fid))
    full = A.full_denominators(aggregator, inputs, agg_params)
    partials = []
    for r in range(cp_size):
        local_inputs, local_params = gather_rank(inputs, full, mask & (rank == r))
        partials.append(fn(local_inputs, local_params)["value"])
    return {"partials": torch.stack(partials), "unsharded": fn(inputs, agg_params)["value"]}


# Micro-batch accumulation ------------------------------------------------------------------------
def _rows(x, start, stop, B):
    """Rows start:stop of a per-sequence or per-token tensor (or list); scalars unchanged."""
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == B:
        return x[start:stop]
    if isinstance(x, list) and len(x) == B:
        return x[start:stop]
    return x


def accumulate(inputs, params):
    aggregator, agg_params = _aggregator(params)
    fn = A.IMPLEMENTATIONS[aggregator]
    B = inputs["mask"].shape[0]
    sizes = params.get("micro_batch_sizes") or [1] * B
    check_micro_batches("dist.accumulate", sizes, B)
    M = len(sizes)
    full = A.full_denominators(aggregator, inputs, agg_params)
    local = dict(agg_params, **{name: None for name in A.DENOMINATOR_PARAMS[aggregator]})
    contributions, naive = [], []
    start = 0
    for s in sizes:
        sub = {name: _rows(x, start, start + s, B) for name, x in inputs.items()}
        contributions.append(fn(sub, {k: _rows(x, start, start + s, B) for k, x in full.items()})["value"])
        naive.append(fn(sub, local)["value"] / M)
        start += s
    contributions, naive = torch.stack(contributions), torch.stack(naive)
    return {"contributions": contributions, "total": contributions.sum(),
            "naive_contributions": naive, "naive": naive.sum()}


# Fast-LLM sequence-data-parallel segment sums ----------------------------------------------------
def sdp_segment(inputs, params):
    lp, old, mask, docs = inputs["logprobs"], inputs["old_logprobs"], inputs["mask"], inputs["document_ids"]
    S = param("dist.sdp_segment", params, "sdp_size")
    B, T = mask.shape
    width = -(-T // S)
    # global segment ids and token counts N_s (Fast-LLM's label_counts), known to every rank
    ids, inv = torch.unique(docs[mask], sorted=True, return_inverse=True)
    K = ids.numel()
    N = torch.bincount(inv, minlength=K).to(lp.dtype)
    partials = []
    for r in range(S):
        sl = slice(r * width, (r + 1) * width)
        m = mask[:, sl]
        d = (lp[:, sl] - old[:, sl])[m]
        seg = torch.searchsorted(ids, docs[:, sl][m])
        partials.append(A.segment_sums(d, seg, K) / N)       # pairwise within each segment
    partials = torch.stack(partials)
    log_ratio = partials.sum(0)               # the SUM all-reduce over the SDP group
    pos = torch.arange(T, device=mask.device)
    rank = torch.where(mask, (pos // max(width, 1)).expand(B, T), torch.full((B, T), -1, device=mask.device))
    return {"segment_ids": ids, "rank": rank, "partials": partials, "log_ratio": log_ratio,
            "ratio": torch.exp(log_ratio)}


# Fast-LLM docs_per_step -----------------------------------------------------------------------------
def docs_per_step(inputs, params):
    """Fetch micro-batches until their distinct-document count reaches the target (Fast-LLM
    _prefetch_to_doc_target); every fetched micro-batch's token sum is divided by the step total D."""
    fid = "dist.docs_per_step"
    v, m, docs = inputs["values"], inputs["mask"], inputs["document_ids"]
    B = m.shape[0]
    sizes = param(fid, params, "micro_batch_sizes") or [1] * B
    check_micro_batches(fid, sizes, B)
    target = int(param(fid, params, "docs_per_step"))
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    counts, seen = [], set()
    for start, size in zip(starts, sizes):
        ids = set(torch.unique(docs[start:start + size][m[start:start + size]]).tolist())
        if ids & seen:
            raise ValueError(f"{fid}: a document spans two micro-batches")
        seen |= ids
        counts.append(len(ids))
    running, K = 0, None
    for k, n in enumerate(counts):
        running += n
        if running >= target:
            K = k + 1
            break
    if K is None:
        raise ValueError(f"{fid}: docs_per_step={target} exceeds the {running} documents of the input")
    D = sum(counts[:K])
    sums = [torch.where(m[st:st + sz], v[st:st + sz], torch.zeros_like(v[st:st + sz])).sum()
            for st, sz in zip(starts, sizes)]
    contributions = torch.stack([s / D if k < K else torch.full_like(s, float("nan")) for k, s in enumerate(sums)])
    total = torch.stack(sums[:K]).sum() / D
    return {"micro_batches": torch.tensor(K), "num_documents": torch.tensor(D), "contributions": contributions,
            "total": total}


IMPLEMENTATIONS = {
    "dist.docs_per_step": docs_per_step,
    "dist.cp_split": cp_split,
    "dist.cp_reduce": cp_reduce,
    "dist.accumulate": accumulate,
    "dist.sdp_segment": sdp_segment,
}
