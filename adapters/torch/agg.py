"""agg.* in PyTorch (spec/agg.md).

Every aggregator is a masked sum divided by counts that depend only on the mask (and on group or
document ids).  Counts given as parameters (global counts over a larger scope) are used as they
are; null counts are taken from the batch.  Masked values are selected away with ``torch.where``
(an inf or NaN there never reaches the value or the gradient) and a zero denominator gives 0 with
zero gradient (the denominator is replaced by 1 before the division, then the result selected).

The count parameters may be Python values (as golden cases give them) or tensors (as ``dist.*``
passes the whole batch's counts to each shard).
"""

from __future__ import annotations

import torch

from pgspec.reference import REGISTRY, SpecError


def param(fid, params, name):
    """``params[name]`` or the spec's default for formula ``fid``."""
    if name in params:
        return params[name]
    return next(p.default for p in REGISTRY[fid].params if p.name == name)


def as_count(x, device):
    """A count parameter as a long tensor (None stays None; None entries of a per-token list become 0)."""
    if x is None or isinstance(x, torch.Tensor):
        return x if x is None else x.to(device)
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], (list, tuple)):
        x = [[0 if c is None else c for c in row] for row in x]
    return torch.as_tensor(x, dtype=torch.long, device=device)


def as_real(x, dtype, device):
    """A real parameter (a number or an exact decimal string such as "1e-8") as a 0-d tensor of ``dtype``."""
    return torch.as_tensor(float(x), dtype=dtype, device=device)


def masked(values, mask):
    """q at unmasked positions, 0 elsewhere (selected, never multiplied)."""
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def divide(num, den):
    """num / den with 0 / 0 = 0 and zero gradient (den replaced by 1 where it is 0, then selected)."""
    zero = den == 0
    safe = torch.where(zero, torch.ones_like(den), den)
    return torch.where(zero, torch.zeros_like(num), num / safe)


def sequence_lengths(mask):
    """L_i = sum_t m_{i,t} (long)."""
    return mask.sum(-1)


def count_nonempty(counts, count_empty):
    """The number of entries (sequences or groups) counted in N: all, or those with a positive count."""
    return torch.as_tensor(counts.numel(), device=counts.device) if count_empty else (counts > 0).sum()


def check_global(fid, name, given, local, what):
    """A global count must cover the batch at hand (spec/agg.md, Scope: a global count smaller than the
    count in the batch at hand is an error); ``given`` and ``local`` broadcast elementwise."""
    if given is not None and bool((given < local).any()):
        raise SpecError(f"{fid}: parameter {name!r} = {given.tolist()} is smaller than the {what} in this batch "
                        f"({local.tolist()}); a global count covers this batch and more")


def check_length(fid, name, given, B):
    if given is not None and (given.dim() != 1 or given.shape[0] != B):
        raise SpecError(f"{fid}: parameter {name!r} must have one entry per sequence (B={B}), "
                        f"got shape {list(given.shape)}")


# The aggregators ---------------------------------------------------------------------------------
def token_mean(inputs, params):
    fid = "agg.token_mean"
    v, m = inputs["values"], inputs["mask"]
    n_tok = as_count(param(fid, params, "num_tokens"), v.device)
    check_global(fid, "num_tokens", n_tok, m.sum(), "number of unmasked tokens")
    if n_tok is None:
        n_tok = m.sum()
    den = n_tok.to(v.dtype) + as_real(param(fid, params, "eps"), v.dtype, v.device)
    return {"value": divide(masked(v, m).sum(), den)}


def sample_mean(inputs, params):
    fid = "agg.sample_mean"
    v, m = inputs["values"], inputs["mask"]
    D = as_count(param(fid, params, "sequence_token_counts"), v.device)
    check_length(fid, "sequence_token_counts", D, m.shape[0])
    check_global(fid, "sequence_token_counts", D, sequence_lengths(m), "unmasked tokens of each sequence")
    if D is None:
        D = sequence_lengths(m)
    n = as_count(param(fid, params, "num_sequences"), v.device)
    local = count_nonempty(D, param(fid, params, "count_empty_sequences"))
    check_global(fid, "num_sequences", n, local, "number of counted sequences")
    if n is None:
        n = local
    eps_l = as_real(param(fid, params, "eps_length"), v.dtype, v.device)
    eps_n = as_real(param(fid, params, "eps_count"), v.dtype, v.device)
    per_sequence = divide(masked(v, m).sum(-1), D.to(v.dtype) + eps_l)
    return {"value": divide(per_sequence.sum(), n.to(v.dtype) + eps_n)}


def seq_mean_token_sum(inputs, params):
    fid = "agg.seq_mean_token_sum"
    v, m = inputs["values"], inputs["mask"]
    n = as_count(param(fid, params, "num_sequences"), v.device)
    local = count_nonempty(sequence_lengths(m), param(fid, params, "count_empty_sequences"))
    check_global(fid, "num_sequences", n, local, "number of counted sequences")
    if n is None:
        n = local
    return {"value": divide(masked(v, m).sum(), n.to(v.dtype))}


def constant(inputs, params):
    fid = "agg.constant"
    v, m = inputs["values"], inputs["mask"]
    divisor = param(fid, params, "divisor")
    if divisor is None:
        raise ValueError("agg.constant: parameter 'divisor' is required")
    K = as_real(divisor, v.dtype, v.device)
    token_sum = masked(v, m).sum()
    if param(fid, params, "divide_by") == "K":
        return {"value": token_sum / K}
    n = as_count(param(fid, params, "num_sequences"), v.device)
    local = count_nonempty(sequence_lengths(m), param(fid, params, "count_empty_sequences"))
    check_global(fid, "num_sequences", n, local, "number of counted sequences")
    if n is None:
        n = local
    return {"value": divide(token_sum, K * n.to(v.dtype))}


def segment_sums(x, seg, K):
    """sum of ``x`` over each segment k < K (``seg``: the segment of every element), pairwise within each
    segment: sum nodes that round as the spec's tolerance model has them (depth ceil(log2 k) for k terms),
    whatever the dtype.  ``index_add`` would add a segment's elements one after another in the values'
    dtype, whose error grows with k: in bfloat16 a document of 8,000 tokens loses most of its sum.  Each
    level adds the elements of ranks 2j and 2j + 1 of a segment (two terms per slot: one rounding) until
    one is left."""
    order = torch.argsort(seg, stable=True)
    x, seg = x[order], seg[order]
    while x.numel() > K:
        counts = torch.bincount(seg, minlength=K)
        start = counts.cumsum(0) - counts            # where each segment begins (x is sorted by segment)
        rank = torch.arange(x.numel(), device=x.device) - start[seg]
        slot = seg * (rank.max() + 1) + rank // 2
        slots, inv = torch.unique(slot, sorted=True, return_inverse=True)
        x = torch.zeros(slots.numel(), dtype=x.dtype, device=x.device).index_add(0, inv, x)
        seg = torch.zeros(slots.numel(), dtype=seg.dtype, device=seg.device).scatter(0, inv, seg)
    return torch.zeros(K, dtype=x.dtype, device=x.device).index_add(0, seg, x)


def group_index(group_ids):
    """(the distinct group ids in increasing order, the group index of every sequence)."""
    return torch.unique(group_ids, sorted=True, return_inverse=True)


def prompt_mean(inputs, params):
    fid = "agg.prompt_mean"
    v, m, g = inputs["values"], inputs["mask"], inputs["group_ids"]
    ids, inv = group_index(g)
    G = ids.numel()
    row_sums = masked(v, m).sum(-1)
    group_sums = torch.zeros(G, dtype=v.dtype, device=v.device).index_add(0, inv, row_sums)
    given = as_count(param(fid, params, "group_token_counts"), v.device)
    local = torch.zeros(G, dtype=torch.long, device=v.device).index_add(0, inv, sequence_lengths(m))
    if given is None:
        D = local
    else:   # the same count for every member of a group: any member's entry
        check_length(fid, "group_token_counts", given, m.shape[0])
        D = torch.zeros(G, dtype=torch.long, device=v.device).scatter(0, inv, given)
        if bool((D[inv] != given).any()):
            raise SpecError(f"{fid}: parameter 'group_token_counts' must be the same for every sequence of a "
                            f"group, got {given.tolist()} for group_ids {g.tolist()}")
        check_global(fid, "group_token_counts", D, local, "unmasked tokens of each group")
    per_group = divide(group_sums, D.to(v.dtype))
    if param(fid, params, "step_divisor") == "sequences":   # slime #2090: / step_global_batch_size
        if param(fid, params, "num_groups") is not None:
            raise ValueError("agg.prompt_mean: parameter 'num_groups' must be null with step_divisor='sequences'")
        n_seq = as_count(param(fid, params, "num_sequences"), v.device)
        B = torch.as_tensor(m.shape[0], device=v.device)
        check_global(fid, "num_sequences", n_seq, B, "number of sequences")
        if n_seq is None:
            n_seq = B
        return {"value": divide(per_group.sum(), n_seq.to(v.dtype))}
    if param(fid, params, "num_sequences") is not None:
        raise ValueError("agg.prompt_mean: parameter 'num_sequences' applies only to step_divisor='sequences'")
    n_grp = as_count(param(fid, params, "num_groups"), v.device)
    local_groups = count_nonempty(D, param(fid, params, "count_empty_groups"))
    check_global(fid, "num_groups", n_grp, local_groups, "number of counted groups")
    if n_grp is None:
        n_grp = local_groups
    return {"value": divide(per_group.sum(), n_grp.to(v.dtype))}


def document_mean(inputs, params):
    fid = "agg.document_mean"
    v, m, d = inputs["values"], inputs["mask"], inputs["document_ids"]
    docs = d[m]                                   # the ids of the unmasked tokens (others are not read)
    ids, inv = torch.unique(docs, sorted=True, return_inverse=True)
    K = ids.numel()
    doc_sums = segment_sums(v[m], inv, K)
    raw = param(fid, params, "document_token_counts")
    given = as_count(raw, v.device)
    local = torch.bincount(inv, minlength=K)
    if given is None:
        N = local
    else:   # N_d broadcast to the tokens of document d: any of its unmasked tokens' entry
        if tuple(given.shape) != tuple(m.shape):
            raise SpecError(f"{fid}: parameter 'document_token_counts' must have the shape of 'mask' "
                            f"{list(m.shape)}, got {list(given.shape)}")
        if isinstance(raw, (list, tuple)) and any(c is None for row, mrow in zip(raw, m.tolist())
                                                  for c, keep in zip(row, mrow) if keep):
            raise SpecError(f"{fid}: parameter 'document_token_counts' must hold an integer at every unmasked "
                            f"token (null only at masked positions)")
        N = torch.zeros(K, dtype=torch.long, device=v.device).scatter(0, inv, given[m])
        if bool((N[inv] != given[m]).any()):
            raise SpecError(f"{fid}: parameter 'document_token_counts' must hold the same integer at every "
                            f"unmasked token of a document")
        check_global(fid, "document_token_counts", N, local, "unmasked tokens of each document")
    n_doc = as_count(param(fid, params, "num_documents"), v.device)
    check_global(fid, "num_documents", n_doc, torch.as_tensor(K, device=v.device), "number of documents")
    if n_doc is None:
        n_doc = torch.as_tensor(K, device=v.device)
    return {"value": divide((doc_sums / N.to(v.dtype)).sum(), n_doc.to(v.dtype))}


IMPLEMENTATIONS = {
    "agg.token_mean": token_mean,
    "agg.sample_mean": sample_mean,
    "agg.seq_mean_token_sum": seq_mean_token_sum,
    "agg.constant": constant,
    "agg.prompt_mean": prompt_mean,
    "agg.document_mean": document_mean,
}

DENOMINATOR_PARAMS = {
    "agg.token_mean": ("num_tokens",),
    "agg.sample_mean": ("num_sequences", "sequence_token_counts"),
    "agg.seq_mean_token_sum": ("num_sequences",),
    "agg.constant": ("num_sequences",),
    "agg.prompt_mean": ("num_groups", "group_token_counts", "num_sequences"),
    "agg.document_mean": ("num_documents", "document_token_counts"),
}


def full_denominators(aggregator, inputs, params):
    """``params`` with every null denominator of ``aggregator`` replaced by its count over the whole
    batch (``inputs``' mask, group and document ids), as long tensors: what every shard (CP rank,
    micro-batch) must be given so that the shards' values add up to the unsharded aggregate."""
    m = inputs["mask"]
    dev = m.device
    p = {k: as_count(x, dev) if k in DENOMINATOR_PARAMS[aggregator] else x for k, x in params.items()}
    get = lambda name: as_count(param(aggregator, p, name), dev)  # noqa: E731
    L = sequence_lengths(m)
    if aggregator == "agg.token_mean":
        p["num_tokens"] = get("num_tokens") if get("num_tokens") is not None else m.sum()
    elif aggregator == "agg.sample_mean":
        D = get("sequence_token_counts")
        D = L if D is None else D
        p["sequence_token_counts"] = D
        if get("num_sequences") is None:
            p["num_sequences"] = count_nonempty(D, param(aggregator, p, "count_empty_sequences"))
    elif aggregator in ("agg.seq_mean_token_sum", "agg.constant"):
        if get("num_sequences") is None:
            p["num_sequences"] = count_nonempty(L, param(aggregator, p, "count_empty_sequences"))
    elif aggregator == "agg.prompt_mean":
        ids, inv = group_index(inputs["group_ids"])
        D = get("group_token_counts")
        if D is None:
            per_group = torch.zeros(ids.numel(), dtype=torch.long, device=dev).index_add(0, inv, L)
            D = per_group[inv]
        p["group_token_counts"] = D
        if param(aggregator, p, "step_divisor") == "sequences":
            if get("num_sequences") is None:
                p["num_sequences"] = torch.as_tensor(m.shape[0], device=dev)
        elif get("num_groups") is None:
            Dg = torch.zeros(ids.numel(), dtype=torch.long, device=dev).scatter(0, inv, D)
            p["num_groups"] = count_nonempty(Dg, param(aggregator, p, "count_empty_groups"))
    elif aggregator == "agg.document_mean":
        d = inputs["document_ids"]
        ids, inv = torch.unique(d[m], sorted=True, return_inverse=True)
        if get("document_token_counts") is None:
            counts = torch.zeros_like(d)
            counts[m] = torch.bincount(inv, minlength=ids.numel())[inv]
            p["document_token_counts"] = counts
        if get("num_documents") is None:
            p["num_documents"] = torch.as_tensor(ids.numel(), device=dev)
    else:
        raise ValueError(f"unknown aggregator {aggregator!r}")
    return p
