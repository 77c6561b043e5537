"""The oracle: the aggregations' scales, the parameters the oracle takes (``oracle_params``,
``oracle_needs``) and ``oracle_scales`` / ``oracle``: outputs, gradients and every element's scale S
in float64 for a formula of ``ORACLE_FORMULAS``."""

from __future__ import annotations

import json

from pgspec.reference import REGISTRY

from ..judge import compare
from .common import AGG_FREE_PARAMS, CheckError, HEAD_LOSS_FORMULAS, LOSS_AGGREGATION, ORACLE_FORMULAS, VOCAB_FORMULAS
from .rounding import cotangent_to_l, phantom, sum_depth, sum_rounding
from .draws import DOCUMENTS, sequence_level, to_tensors
from .terms import (cispo_terms, entropy_keep, gmpo_terms, gspo_terms, is_weights, kl_penalty_terms, minirl_terms,
                    opsm_keep, ppo_terms, sapo_terms, vespo_terms, weighted_terms, with_kl)


def _document_mean_scales(x, mask, doc_ids, p):
    """(S(value), S(grad.values) [B, T]) of agg.document_mean on exact inputs ``x``, as the reference's
    nodes are (reference.agg.document_mean): per document d, a sum node G_d over its unmasked tokens
    (wherever they lie in the batch; depth(k_d) sum |x|, its exact short terms leave no residue),
    q_d = G_d / N_d (N_d: document_token_counts at its tokens, or its token count; an edge 1/N_d),
    the sum node P over the documents (a residue where some q_d is inexact: N_d not a power of two),
    and P / N_doc (num_documents or the count of documents; 0 gives the constant 0)."""
    import torch

    ids = doc_ids[mask]
    docs, unit = torch.unique(ids, return_inverse=True)
    n_docs = docs.numel()
    zero = torch.zeros(n_docs, dtype=torch.float64, device=x.device)
    xs = x[mask]
    G = zero.clone().index_add_(0, unit, xs)
    absG = zero.clone().index_add_(0, unit, xs.abs())
    k = zero.clone().index_add_(0, unit, torch.ones_like(xs))
    given = p["document_token_counts"]
    if given is None:
        N = k
    else:
        counts = torch.as_tensor([[0 if c is None else c for c in row] for row in given], dtype=torch.float64,
                                 device=x.device)[mask]
        N = zero.clone().index_copy_(0, unit, counts)
    EG = sum_depth(k) * absG
    q = G / N
    Eq = q.abs() + EG / N
    n = float(n_docs if p["num_documents"] is None else p["num_documents"])
    inexact = (torch.frexp(N)[0] != 0.5).any()
    P = q.sum()
    EP = sum_rounding(torch.tensor(n_docs) + phantom(torch.tensor(n_docs), inexact), q.abs().sum()) + Eq.sum()
    if n == 0:
        return P * 0, torch.zeros_like(x)
    v = P / n
    Ev = v.abs() + EP / n
    A_P, C_P = 1 / n, 2 / n                                 # P / n and G / N: constants, rho = 2
    A_G, C_G = A_P / N, (C_P + 2 * A_P) / N
    g = torch.zeros_like(x)
    g[mask] = (A_G + C_G)[unit]
    return Ev, g


def aggregate_scales(kind, terms, mask, chunk, split=False, *, divisor=None, groups=None, root=None, counts=None,
                      eps_length=0.0, n=None):
    """(value, S(value), S(grad) [B, T]) of an aggregator over per-token terms, following the
    reference's nodes (pgspec.reference.agg): row sums (one "sum" node each), then the aggregator's
    divisions and sums, then the scale pass backwards.  ``kind``, at its default parameters:

    - agg.token_mean, agg.seq_mean_token_sum, agg.constant: the sum over rows, divided by the token
      count, the count of non-empty rows, or ``divisor`` (K or K N, agg.constant's constant);
    - agg.sample_mean: the mean over non-empty rows of each row's sum / L_i;
    - agg.prompt_mean: the mean over groups with a token of each group's sum (a sum node over its
      rows' sums) / D_g, the group's token count; ``groups``: the group id of each row [B].

    ``split``: also the A part of S(grad) [B, T] (the sum over paths of |local derivatives|;
    S(grad) - A is the C part), for a composite that carries the pass on from the differentiated
    input (check_head_loss.py).

    ``terms(rows)`` gives, for a slice of rows, (x, E(x), dx/dinput or None when the terms are the
    differentiable input itself, inexact[, which terms are nodes: the others are the constant 0,
    not operands of the row's sum; default the mask]) with masked positions zero; it is called once per chunk
    of ``chunk`` rows, whose temporaries stay within a chunk, and its x, E(x) and dx are kept for
    the gradient pass (24 bytes a token: evaluating the terms again would cost the oracle about a
    sixth of its time).

    ``root(v, E(v))``: the cotangent (A, C) the aggregate receives, (1, 0) when it is the loss itself
    (a KL term aggregated separately reaches it through beta).

    The denominators (``_aggregation_args``): ``divisor``, the N of the first three kinds (default: the
    token count, or the count of non-empty rows); for the units, ``counts`` [B] (each row's D_i, or
    its group's D_g at each of its rows; default the local token counts), ``eps_length`` added to
    each, and ``n`` (default: the units with D_u > 0).  A zero denominator gives the constant 0."""
    import torch

    B = mask.shape[0]
    L = mask.sum(-1)
    s = torch.zeros(B, dtype=torch.float64, device=mask.device)
    Es, absum = torch.zeros_like(s), torch.zeros_like(s)
    any_inexact = torch.zeros(B, dtype=torch.bool, device=mask.device)
    Lv = torch.zeros_like(L)
    kept = {}
    for start in range(0, B, chunk):
        sl = slice(start, start + chunk)
        got = terms(sl)
        x, Ex, dx, inexact = got[:4]
        kept[start] = (x, Ex, dx)
        s[sl] = x.sum(-1)
        absum[sl] = x.abs().sum(-1)
        any_inexact[sl] = inexact.any(-1)
        Lv[sl] = (got[4] if len(got) > 4 else mask[sl]).sum(-1)
        Es[sl] = sum_rounding(Lv[sl] + phantom(Lv[sl], any_inexact[sl]), absum[sl]) + Ex.sum(-1)
    rows = L > 0
    k = rows.sum()
    # a row whose every term is the constant 0 (an IS weight of 0) sums to a constant: no term of the
    # sums above it, though its tokens stay in the denominators
    vrows = Lv > 0
    if kind in ("agg.token_mean", "agg.seq_mean_token_sum", "agg.constant"):
        # v = (sum over the rows' sums) / N: one sum node (an empty row's sum is a constant 0, no term)
        if divisor is not None:
            N = torch.tensor(float(divisor), dtype=torch.float64, device=mask.device)
        elif kind == "agg.token_mean":
            N = L.sum().double()
        else:
            N = k.double()
        num = s[rows].sum()
        kv = vrows.sum()
        Enum = sum_rounding(kv + phantom(kv, any_inexact.any()), s[rows].abs().sum()) + Es[rows].sum()
        v = num / N if N > 0 else num * 0
        Ev = v.abs() + Enum / N if N > 0 else v * 0
        A0, C0 = (1.0, 0.0) if root is None else root(v, Ev)
        A_s = torch.full_like(s, 1.0) * A0 / N
        C_s = torch.full_like(s, 1.0) * (C0 + 2 * A0) / N       # num / N: a constant, rho = 2
    else:
        # v = (1/n) sum over units u with D_u > 0 of G_u / D_u: the units are the rows (sample_mean:
        # G = the row's sum, D = L_i) or the prompt groups (prompt_mean: G = a sum node over the
        # group's non-empty rows' sums, D = the group's token count)
        if kind == "agg.sample_mean":
            unit = None
            G, EG, G_inexact, G_var = s, Es, any_inexact, vrows
            D = L.double() if counts is None else counts.double()
        else:  # agg.prompt_mean
            _, unit = torch.unique(groups, return_inverse=True)
            n_units = int(unit.max()) + 1 if B else 0

            def per_unit(x):
                return torch.zeros(n_units, dtype=x.dtype, device=x.device).index_add_(0, unit, x)

            kg = per_unit(vrows.long())
            G_var = kg > 0
            G = per_unit(torch.where(rows, s, torch.zeros_like(s)))
            G_inexact = per_unit((rows & any_inexact).long()) > 0
            D = per_unit(L.long()).double() if counts is None else \
                torch.zeros(n_units, dtype=torch.float64, device=mask.device).index_copy_(0, unit, counts.double())
            EG = (sum_rounding(kg + phantom(kg, G_inexact), per_unit(torch.where(rows, s.abs(), torch.zeros_like(s))))
                  + per_unit(torch.where(rows, Es, torch.zeros_like(s))))
        den = D + float(eps_length)
        units = den != 0
        Dd = torch.where(units, den, torch.ones_like(G))
        q = torch.where(units, G / Dd, torch.zeros_like(G))
        Eq = torch.where(units, q.abs() + EG / Dd, torch.zeros_like(G))
        n = (D > 0).sum().double() if n is None else torch.tensor(float(n), dtype=torch.float64, device=mask.device)
        P = q[units].sum()
        # the terms of the sum over units (a constant G_u, hence q_u, is none); q_u is inexact when
        # some D_u is not a power of two, or its terms are inexact
        live = units & G_var
        ku = live.sum()
        q_inexact = (torch.frexp(Dd[live])[0] != 0.5).any() | G_inexact[live].any()
        EP = sum_rounding(ku + phantom(ku, q_inexact), q[units].abs().sum()) + Eq[units].sum()
        v = P / n if n > 0 else P * 0
        Ev = v.abs() + EP / n if n > 0 else v * 0
        A0, C0 = (1.0, 0.0) if root is None else root(v, Ev)
        A_q, C_q = A0 / n, (C0 + 2 * A0) / n                    # P / n and G / D: constants, rho = 2
        step_q = C_q + 2 * A_q
        A_s, C_s = A_q / Dd, step_q / Dd
        if unit is not None:        # a group's sum passes its cotangent to each of its rows' sums (+1)
            A_s, C_s = A_s[unit], C_s[unit]
    g = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    gA = torch.zeros_like(g) if split else None
    for start in range(0, B, chunk):
        sl = slice(start, start + chunk)
        x, Ex, dx = kept.pop(start)
        A_x, C_x = A_s[sl].unsqueeze(-1), C_s[sl].unsqueeze(-1)
        if dx is None:          # the terms are the differentiable input itself
            gs = (A_x + C_x).expand_as(x)
            As = A_x.expand_as(x)
        else:                   # a pass of its own (``gspo_terms``, ``sapo_terms``, ``with_kl``) or dx/dl
            As, Cs = cotangent_to_l(dx, x, Ex, A_x.expand_as(x), C_x.expand_as(x))
            gs = As + Cs
        g[sl] = torch.where(mask[sl], gs, torch.zeros_like(gs))
        if split:
            gA[sl] = torch.where(mask[sl], As, torch.zeros_like(As))
    return (v, Ev, g, gA) if split else (v, Ev, g)


# The options the fused-head composite (check_head_loss.py) has none of, each with the value that turns it off
# (the sampler's log-probs and the token entropies are no inputs of a head)
_HEAD_OFF = (("is_level", ("none",)), ("opsm_delta", (None,)), ("entropy_quantile", (None,)))


def _param_off(name: str, off: tuple) -> str:
    """The --param that turns a recipe option off, as a user types it (``beta=0``, ``opsm_delta=null``)."""
    value = off[0]
    return f"--param {name}={'null' if value is None else value if isinstance(value, str) else json.dumps(value)}"


def describe_formulas() -> str:
    """`pgspec check --list`: each formula with an oracle, its title, and what a check of it needs."""
    width = max(len(fid) for fid in ORACLE_FORMULAS)
    return "\n".join(f"{fid:<{width}} {REGISTRY[fid].title}\n{'':<{width}} needs {oracle_needs(fid)}"
                     for fid in ORACLE_FORMULAS)


def oracle_needs(fid: str) -> str:
    """What a check of formula ``fid`` (one of ORACLE_FORMULAS) needs: its arguments and the parameters
    the oracle covers (`pgspec check --list`, and the formula's section of the docs)."""
    f = REGISTRY[fid]
    if fid in VOCAB_FORMULAS:
        return ("--vocab V [--hidden H]: through a linear head of exact logits; parameters temperature > 0, "
                "logit_scale > 0, softcap null")
    if fid.startswith("agg."):
        divisor = " and --param divisor=K (K > 0; divide_by K or K*N)" if fid == "agg.constant" else ""
        return ("--shape BxT" + divisor + "; any of its parameters (global counts, which must cover the batch's, "
                "and epsilons)" + ("; prompt groups b mod 4" if fid == "agg.prompt_mean" else "")
                + (f"; {DOCUMENTS} documents a row" if fid == "agg.document_mean" else ""))
    defaults = {p.name: p.default for p in f.params}
    return ("--shape BxT; "
            + ("is_level none and opsm_delta null (VESPO folds the sampler's ratio into phi, with --sampler: each "
               "row's total log-ratio to the sampler spread as without); " if fid == "loss.vespo" else
               "is_level none and opsm_delta null (the check draws the sampler's log-probs for MiniRL's own weight, "
               "both sides of its cap); " if fid == "loss.minirl" else
               "its IS weight any (level, mode, bounds, clamp); its OPSM any, with an IS weight at the token or "
               "geometric level (a sequence-level weight, a sum over the row, leaves OPSM's row mean no room); ")
            + "its entropy mask any"
            + f"; its KL term (beta, default {defaults['beta']}) any: estimator, clamps, aggregation"
            + ("; aggregation prompt_mean (prompt groups b mod 4) or token_mean"
               if fid in ("loss.dapo", "loss.cispo") else "")
            + ("; ratio_level sequence or token" if fid == "loss.luspo" else "")
            + ("; its cap log_ratio_max any; its per-token clamp log_ratio_clamp any that leaves the rows' mean "
               "log-ratios room (about 1 or more: pairs of each row's tokens are drawn beyond it)"
               if fid == "loss.gspo" else "")
            + ("; with --vocab V [--hidden H] (and its IS weight, OPSM and entropy mask off"
               + (", aggregation token_mean" if fid in ("loss.dapo", "loss.cispo") else "")
               + ") it is checked from hidden states through the adapter's fused head"
               if fid in HEAD_LOSS_FORMULAS else ""))


def oracle_params(formula: str, params: dict, head: bool = False) -> dict:
    """The formula's parameters with defaults, or CheckError where the oracle has no scale for them:
    aggregators at their default parameters (and the global counts and epsilons of AGG_FREE_PARAMS);
    recipes with any IS weight, OPSM (with an IS weight, at the token or geometric level), entropy
    mask and KL term (estimator, clamps, aggregation), VESPO and MiniRL without an IS weight or OPSM;
    with ``head`` (the fused-head composite of check_head_loss.py) no IS weight, OPSM or entropy mask
    (any KL term) and the batch-pooled token mean."""
    if formula not in ORACLE_FORMULAS:
        raise CheckError(f"{formula}: no oracle scale; formulas with one: {', '.join(ORACLE_FORMULAS)}")
    f = REGISTRY[formula]
    p = {q.name: q.default for q in f.params}
    p.update(params)
    if formula.startswith("agg."):
        free = AGG_FREE_PARAMS.get(formula, ())
        for q in f.params:
            if q.name not in free and p[q.name] != q.default:
                raise CheckError(f"{formula}: the oracle scale covers the default parameters only"
                                 f"{' (and any ' + ', '.join(free) + ')' if free else ''} ({q.name}={p[q.name]!r}); "
                                 f"leave {q.name} out")
        return p
    for k, off in _HEAD_OFF if head else ():
        if p.get(k) not in off:
            raise CheckError(f"{formula}: the oracle scale covers the recipe with its options off ({k}={p.get(k)!r}) "
                             f"from hidden states (--vocab); give {_param_off(k, off)}")
    if head and p.get("aggregation", "token_mean") != "token_mean":
        raise CheckError(f"{formula}: from hidden states (--vocab) the oracle scale covers the batch-pooled token mean "
                         f"(the head protocol has no prompt groups; aggregation={p['aggregation']!r}); give "
                         f"--param aggregation=token_mean")
    if formula == "loss.minirl" and (p.get("is_level") != "none" or p.get("opsm_delta") is not None):
        raise CheckError(f"{formula}: the check draws MiniRL's sampler log-probs for its own weight, not off the kinks of "
                         f"an IS weight or OPSM (is_level={p['is_level']!r}, opsm_delta={p['opsm_delta']!r}); give "
                         f"--param is_level=none --param opsm_delta=null")
    if p.get("opsm_delta") is not None and formula == "loss.vespo":
        raise CheckError(f"{formula}: OPSM and VESPO would both read the sampler's log-probs, and OPSM's row means "
                         f"off its delta leave VESPO's folded log-weights at their clips (opsm_delta="
                         f"{p['opsm_delta']!r}); give --param opsm_delta=null (--sampler gives VESPO the sampler's "
                         f"log-probs)")
    if p.get("opsm_delta") is not None and p.get("is_level") == "sequence":
        raise CheckError(f"{formula}: with OPSM the check draws the sampler's log-probs off the kinks of an IS weight at "
                         f"the token or geometric level, not the sequence level, whose log-weight, a sum over the row "
                         f"within reach of its kinks, leaves OPSM's row mean to the old log-probs (opsm_delta="
                         f"{p['opsm_delta']!r}, is_level='sequence'); give --param is_level=token or geometric, or "
                         f"--param opsm_delta=null")
    return p


def oracle_scales(formula: str, tensors: dict, params: dict, chunk: int = 8, El=None, split: bool = False) -> dict:
    """S of every output and gradient element of ``formula`` on float64 ``tensors``: {"value" or
    "loss": scalar tensor, "grad.<input>": [B, T]}.

    For a composite that computes a loss's log-probs l (check_head_loss.py): ``El`` [B, T], the forward
    errors of l (None: l is an exact input), for the token losses of HEAD_LOSS_FORMULAS; ``split``: also
    "A.logprobs", the A part of S(grad.logprobs) (``aggregate_scales``)."""
    import torch

    p = oracle_params(formula, params)
    with torch.no_grad():
        mask = tensors["mask"]
        if formula == "agg.document_mean":
            Ev, g = _document_mean_scales(tensors["values"].detach(), mask, tensors["document_ids"], p)
            return {"value": Ev, "grad.values": g}
        if formula.startswith("agg."):
            x = tensors["values"].detach()

            def terms(sl):
                xs = torch.where(mask[sl], x[sl], torch.zeros((), dtype=x.dtype, device=x.device))
                return xs, torch.zeros_like(xs), None, torch.zeros_like(mask[sl])   # inputs are exact

            _, Ev, g = aggregate_scales(formula, terms, mask, chunk, **_aggregation_args(formula, p, tensors))
            return {"value": Ev, "grad.values": g}
        l, old, adv = (tensors[k].detach() for k in ("logprobs", "old_logprobs", "advantages"))
        clamp = p.get("log_ratio_clamp")
        if El is not None and formula not in HEAD_LOSS_FORMULAS:
            raise ValueError(f"{formula}: the oracle takes l as an inner node for {HEAD_LOSS_FORMULAS} only")

        def El_of(sl):
            return None if El is None else El[sl]

        if formula == "loss.sapo":
            def token_terms(sl):
                return sapo_terms(l[sl], old[sl], adv[sl], mask[sl], p["tau_pos"], p["tau_neg"], clamp, El_of(sl))
        elif formula == "loss.vespo":
            folded = tensors["sampler_logprobs"].detach() if "sampler_logprobs" in tensors else None

            def token_terms(sl):
                return vespo_terms(l[sl], old[sl], adv[sl], mask[sl], p, El is not None,
                                    None if folded is None else folded[sl])
        elif formula == "loss.gmpo":
            def token_terms(sl):
                return gmpo_terms(l[sl], old[sl], adv[sl], mask[sl], p["eps_low"], p["eps_high"])
        elif formula == "loss.minirl":
            sampler_l = tensors["sampler_logprobs"].detach()

            def token_terms(sl):
                return minirl_terms(l[sl], old[sl], sampler_l[sl], adv[sl], mask[sl], p)
        elif sequence_level(formula, p):
            def token_terms(sl):
                return gspo_terms(l[sl], old[sl], adv[sl], mask[sl], p["eps_low"], p["eps_high"], p.get("log_ratio_max"),
                                   El_of(sl), p.get("log_ratio_clamp"))
        elif formula == "loss.cispo":
            def token_terms(sl):
                return cispo_terms(l[sl], old[sl], adv[sl], mask[sl], p["cap_form"], p["eps_low"], p["eps_high"],
                                    clamp)
        else:
            eps_low, eps_high = float(p["eps_low"]), float(p["eps_high"])

            def token_terms(sl):
                return ppo_terms(l[sl], old[sl], adv[sl], mask[sl], eps_low, eps_high, clamp)
        if El is not None and formula != "loss.sapo" and not sequence_level(formula, p):
            exact_l = token_terms

            def token_terms(sl):        # l enters each term node (PPO's, CISPO's and VESPO's x) by its one edge dx/dl
                x, Ex, dx = exact_l(sl)
                return x, Ex + dx.abs() * El[sl], dx      # Factor.abs() is |m|

        # the recipe's factor: OPSM's and the entropy mask's 0, else sg[w^IS]
        sampler = tensors["sampler_logprobs"].detach() if "sampler_logprobs" in tensors else None
        weights = is_weights(old, sampler, mask, p) if p["is_level"] != "none" else None
        keep = torch.ones_like(mask)
        if p["opsm_delta"] is not None:
            keep &= opsm_keep(l, sampler, adv, mask, p)
        if p["entropy_quantile"] is not None:
            keep &= entropy_keep(tensors["entropy"].detach(), mask, p["entropy_quantile"])
        if weights is not None or not keep.all():
            unweighted = token_terms

            def token_terms(sl):
                return weighted_terms(unweighted(sl), None if weights is None else tuple(t[sl] for t in weights),
                                 keep[sl], mask[sl])

        beta = float(p["beta"])
        ref = tensors["ref_logprobs"].detach() if beta else None
        kind = LOSS_AGGREGATION.get(formula) or f"agg.{p['aggregation']}"
        args = _aggregation_args(kind, p, tensors)

        def policy(sl):
            got = token_terms(sl)
            return got if len(got) >= 4 else (*got, got[0] != 0)

        def kl(sl):
            return kl_penalty_terms(l[sl], old[sl], ref[sl], mask[sl], p, El_of(sl))

        def scales(Ev, g, gA=None):
            return {"loss": Ev, "grad.logprobs": g, **({"A.logprobs": gA} if split else {})}

        if not beta:
            return scales(*aggregate_scales(kind, policy, mask, chunk, split, **args)[1:])
        if p["kl_aggregation"] == "policy":         # term = pg + kl beta, with the recipe's aggregator
            def terms(sl):
                return with_kl(token_terms(sl), kl(sl), mask[sl], beta)

            return scales(*aggregate_scales(kind, terms, mask, chunk, split, **args)[1:])
        # separately: loss = Agg(pg) + agg.<kl_aggregation>(kl) beta, a product node (the edge beta) and
        # a sum (edges of +1): the policy's aggregate receives (1, 0), the KL's (beta, rel(kl beta) beta)
        vp, Ep, gp, *Ap = aggregate_scales(kind, policy, mask, chunk, split, **args)
        product = {}

        def root(v, Ev):
            kb = v * beta
            product.update(value=kb, error=kb.abs() + beta * Ev)
            return beta, 2 * beta                       # kl beta: a constant, rho = 2

        def kl_terms(sl):
            y, Ey, back, exact = kl(sl)
            return y, Ey, back, ~exact

        _, _, gk, *Ak = aggregate_scales(f"agg.{p['kl_aggregation']}", kl_terms, mask, chunk, split, root=root)
        return scales((vp + product["value"]).abs() + Ep + product["error"], gp + gk, Ap[0] + Ak[0] if split else None)


def _aggregation_args(kind: str, p: dict, tensors: dict) -> dict:
    """What ``aggregate_scales`` needs beyond the terms for aggregator ``kind`` under parameters ``p``
    (an agg.* formula's, or the loss's that aggregates with it, whose aggregator takes its defaults),
    as reference.agg computes its denominators (a loss's parameters share no name with its aggregator's
    but divisor and divide_by, so p.get gives the aggregator's defaults): agg.token_mean's N_tok (num_tokens or the token count)
    + eps; agg.seq_mean_token_sum's N and agg.constant's K or K N (N: num_sequences, or B when
    count_empty_sequences, true in the recipes, else the non-empty rows); agg.sample_mean's D_i
    (sequence_token_counts or L_i), eps_length and N (num_sequences or the rows with D_i > 0, B when
    count_empty_sequences) + eps_count; agg.prompt_mean's group ids, D_g (group_token_counts or the
    group's tokens) and its divisor (num_groups or the groups with D_g > 0, all of them when
    count_empty_groups; with step_divisor 'sequences', num_sequences or B)."""
    import torch

    mask = tensors["mask"]
    B = mask.shape[0]
    L = mask.sum(-1)

    def sequences(count_empty):
        given = p.get("num_sequences")
        return given if given is not None else B if count_empty else int((L > 0).sum())

    if kind == "agg.token_mean":
        n_tok = p.get("num_tokens")
        return {"divisor": (int(L.sum()) if n_tok is None else n_tok) + float(p.get("eps", 0))}
    if kind == "agg.seq_mean_token_sum":
        return {"divisor": sequences(p.get("count_empty_sequences", False))}
    if kind == "agg.constant":
        k = float(p["divisor"])
        return {"divisor": k * sequences(p.get("count_empty_sequences", True)) if p["divide_by"] == "K*N" else k}
    if kind == "agg.sample_mean":
        given = p.get("sequence_token_counts")
        D = L.double() if given is None else torch.as_tensor(given, dtype=torch.float64, device=mask.device)
        n = p.get("num_sequences")
        if n is None:
            n = B if p.get("count_empty_sequences", False) else int((D > 0).sum())
        return {"counts": D, "eps_length": float(p.get("eps_length", 0)), "n": n + float(p.get("eps_count", 0))}
    if kind == "agg.prompt_mean":
        if "group_ids" not in tensors:
            raise CheckError("the prompt_mean aggregation needs the input 'group_ids' (the prompt group of each "
                             "sequence, [B])")
        groups = tensors["group_ids"]
        _, unit = torch.unique(groups, return_inverse=True)
        n_units = int(unit.max()) + 1 if B else 0
        local = torch.zeros(n_units, dtype=torch.float64, device=mask.device).index_add_(0, unit, L.double())
        given = p.get("group_token_counts")
        D_row = local[unit] if given is None else torch.as_tensor(given, dtype=torch.float64, device=mask.device)
        D = torch.zeros(n_units, dtype=torch.float64, device=mask.device).index_copy_(0, unit, D_row)
        if p.get("step_divisor", "groups") == "sequences":
            n = p.get("num_sequences")
            n = B if n is None else n
        else:
            n = p.get("num_groups")
            if n is None:
                n = n_units if p.get("count_empty_groups", False) else int((D > 0).sum())
        return {"groups": groups, "counts": D_row, "n": n}
    return {}


def oracle(formula: str, arrays: dict, params: dict, device: str = "cpu", chunk: int = 8, cotangent=None):
    """(outputs, gradients, scales) of the float64 oracle on numpy ``arrays``; with ``cotangent`` (a number:
    the checked outputs are scalars) the gradients are the VJP with it, c times the gradient, and their
    scales |c| times (c has 4 significant bits: both products are exact in float64)."""
    from ..run import runner

    from pgspec.reference import SpecError

    torch_adapter = runner.load_adapter("torch")
    tensors = to_tensors(formula, arrays, "float64", device)
    try:
        out, grads = compare.call(torch_adapter, formula, tensors, params)
    except SpecError as e:          # a parameter the batch contradicts (a global count below the batch's)
        raise CheckError(f"--param: {e}") from None
    scales = oracle_scales(formula, tensors, params, chunk)
    if cotangent is not None:
        c = float(cotangent)
        grads = {k: g * c for k, g in grads.items()}
        scales = {k: (v * abs(c) if k.startswith("grad.") else v) for k, v in scales.items()}
    return out, grads, scales
