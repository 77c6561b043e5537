"""Distributed aggregators and GSPO segment sums for the torch backend (spec/dist.md).

Each function runs on every rank of a ``torch.distributed`` job and returns this rank's
*contribution*: the loss is the sum of the contributions over all ranks, and autograd of a rank's
contribution gives exactly the global gradient at that rank's tokens.  Every denominator is a
global count, all-reduced over exactly the ranks that partition it:

- token counts over DP x CP (every token lives on one rank),
- per-sequence token counts over CP (a sequence is split over the CP ranks of its DP replica),
- sequence counts over DP (each CP rank of a replica holds the same rows),
- per-group token counts over DP x CP, indexed by global group id.

Local tensors keep the batch's [B_local, T] layout; ``mask`` is true only at this rank's tokens.
Values at other positions are never read (they may be NaN).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn


def all_reduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum over the group of a tensor that carries no gradient (counts)."""
    t = t.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


def _masked(values, mask):
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def token_mean(values, mask, *, group=None):
    """agg.token_mean: sum_local m q / N_tokens, N_tokens all-reduced over DP x CP."""
    n = all_reduce_sum(mask.sum().to(values.dtype), group)
    return _masked(values, mask).sum() / n.clamp(min=1)


def sequence_lengths(mask, dtype, cp_group=None):
    """L_i of every local row: this rank's token counts summed over the CP ranks of the replica."""
    return all_reduce_sum(mask.sum(-1).to(dtype), cp_group)


def global_sequence_count(lengths, *, dp_group=None, cp_group=None, cp_rank=0):
    """The number of non-empty sequences in the whole batch: each replica's rows are counted once
    (by its CP rank 0), summed over DP, then shared with the replica's other CP ranks."""
    local = (lengths > 0).to(lengths.dtype).sum() if cp_rank == 0 else torch.zeros((), dtype=lengths.dtype)
    n = all_reduce_sum(local, dp_group)
    return all_reduce_sum(n, cp_group) if cp_group is not None else n


def sample_mean(values, mask, *, cp_group=None, dp_group=None, cp_rank=0):
    """agg.sample_mean: sum over local rows of (partial token sum / L_i) / N_seq, with L_i summed
    over CP and N_seq (non-empty sequences) global."""
    lengths = sequence_lengths(mask, values.dtype, cp_group)
    n_seq = global_sequence_count(lengths, dp_group=dp_group, cp_group=cp_group, cp_rank=cp_rank)
    per_seq = _masked(values, mask).sum(-1) / lengths.clamp(min=1)
    return per_seq.sum() / n_seq.clamp(min=1)


def seq_mean_token_sum(values, mask, *, cp_group=None, dp_group=None, cp_rank=0):
    """agg.seq_mean_token_sum: sum_local m q / N_seq, N_seq (non-empty sequences) global."""
    lengths = sequence_lengths(mask, values.dtype, cp_group)
    n_seq = global_sequence_count(lengths, dp_group=dp_group, cp_group=cp_group, cp_rank=cp_rank)
    return _masked(values, mask).sum() / n_seq.clamp(min=1)


def constant(values, mask, *, divisor, num_sequences=None, dp_group=None, cp_group=None, cp_rank=0, divide_by="K*N"):
    """agg.constant (Dr.GRPO): sum_local m q / (K N) with N the global sequence count."""
    if divide_by == "K":
        return _masked(values, mask).sum() / divisor
    if num_sequences is None:
        rows = torch.tensor(float(mask.shape[0]) if cp_rank == 0 else 0.0, dtype=values.dtype)
        num_sequences = all_reduce_sum(rows, dp_group)
        num_sequences = all_reduce_sum(num_sequences, cp_group) if cp_group is not None else num_sequences
    return _masked(values, mask).sum() / (divisor * num_sequences)


def prompt_mean(values, mask, group_ids, *, num_groups_total, group=None):
    """agg.prompt_mean: sum over groups of (group token sum / group token count) / N_groups, with
    the group token counts all-reduced over DP x CP (a dense vector indexed by global group id)."""
    counts = torch.zeros(num_groups_total, dtype=values.dtype)
    counts.index_add_(0, group_ids, mask.sum(-1).to(values.dtype))
    counts = all_reduce_sum(counts, group)
    n_groups = (counts > 0).to(values.dtype).sum()
    per_row = _masked(values, mask).sum(-1) / counts[group_ids].clamp(min=1)
    return per_row.sum() / n_groups.clamp(min=1)


def gspo_sequence_loss(logprobs, old_logprobs, mask, advantages, *, eps_low, eps_high, cp_group=None,
                       cp_size=1, dp_group=None, cp_rank=0):
    """loss.gspo with sequences split over CP (Fast-LLM-style segment sums, spec dist.sdp_segment):
    the segment sums of the log-ratio and the token counts are all-reduced over CP (with gradient,
    through torch.distributed.nn), s_i = exp(sum / L_i), the per-sequence PPO term is averaged over
    the global number of non-empty sequences; each CP rank contributes 1/cp of its rows' terms."""
    d = _masked(logprobs - old_logprobs, mask)
    partial = d.sum(-1)
    total = dist_nn.all_reduce(partial, op=dist.ReduceOp.SUM, group=cp_group) if cp_group is not None else partial
    lengths = sequence_lengths(mask, logprobs.dtype, cp_group)
    s = torch.exp(total / lengths.clamp(min=1))
    a = advantages
    term = torch.maximum(-a * s, -a * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    term = torch.where(lengths > 0, term, torch.zeros_like(term))
    n_seq = global_sequence_count(lengths, dp_group=dp_group, cp_group=cp_group, cp_rank=cp_rank)
    return term.sum() / n_seq.clamp(min=1) / cp_size
