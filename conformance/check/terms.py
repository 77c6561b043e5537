"""The oracle's scales of the loss terms: each surrogate's, the KL term's, the IS weights', the
OPSM and entropy masks', as tensor operations (the reference's running error bound, node for node)."""

from __future__ import annotations

import math
from fractions import Fraction

from .rounding import (Factor, cotangent_to_l, exact_row_sums, float_bits, rel_factor, significant_bits, sum_depth,
                       sum_rounding, where64)


def ppo_terms(l, old, adv, mask, eps_low, eps_high, clamp):
    """The reference's fused ppo_clip_term node at every token: (value x, its rounding E(x), the
    derivative dx/dl (0 for a constant node))."""
    import torch

    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    d = l - old
    lo, hi = 1 - eps_low, 1 + eps_high
    r = torch.exp(d)
    unclipped = -a * r
    clipped = -a * torch.clamp(r, lo, hi)
    x = torch.maximum(unclipped, clipped)
    inside = (r >= lo) & (r <= hi)
    x = torch.where(inside, unclipped, x)
    live = inside | ((a > 0) & (r < lo)) | ((a < 0) & (r > hi))      # the -A r branch carries l
    E = torch.where(live, x.abs() * (2 + d.abs()), 2 * x.abs())
    dx = torch.where(live & (a != 0), x, torch.zeros_like(x))
    if clamp is not None:
        c = float(clamp)
        out = d.abs() > c
        rc = torch.exp(torch.clamp(d, -c, c))
        xc = torch.maximum(-a * rc, -a * torch.clamp(rc, lo, hi))
        x = torch.where(out, xc, x)
        E = torch.where(out, 3 * xc.abs(), E)
        dx = torch.where(out, torch.zeros_like(dx), dx)
    zero = torch.zeros_like(x)
    return torch.where(mask, x, zero), torch.where(mask, E, zero), torch.where(mask, dx, zero)


def cispo_terms(l, old, adv, mask, cap_form, eps_low, eps_high, clamp):
    """The reference's CISPO nodes at every token (reference.surrogate.cispo_loss, x = l (-sg[w] A)):
    (value x, its error E(x), the derivative dx/dl = -w A).  Every input is exact (E = 0); each node
    rounds once (E = |value| + the operands' errors times the local derivatives): d = l - l_old (l's
    value: w carries no error of l, as in the reference), its clamp to [-c, c] (a clamped d is the
    bound, which carries |c|), r = exp(d), w = r truncated (a truncated w is the bound, which carries
    |w|), sg[w] (w's error), -sg[w], m = -sg[w] A, x = l m."""
    import torch

    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    d = l - old
    if clamp is not None:
        d = torch.clamp(d, -float(clamp), float(clamp))
    r = torch.exp(d)
    Er = r * (1 + d.abs())                  # |r| + r E(d), E(d) = |d| (or |c| where clamped)
    hi = float(eps_high) if cap_form == "absolute" else 1 + float(eps_high)
    lo = 1 - float(eps_low) if cap_form == "relative" and eps_low is not None else None
    w = torch.clamp(r, min=lo, max=hi)
    truncated = (r > hi) | (r < lo) if lo is not None else r > hi
    Ew = torch.where(truncated, w, Er)
    m = -w * a
    Em = m.abs() + a.abs() * (w + Ew)       # E(-sg[w]) = |w| + E(w)
    x = l * m
    Ex = x.abs() + l.abs() * Em
    zero = torch.zeros_like(x)
    return (torch.where(mask, x, zero), torch.where(mask, Ex, zero),
            Factor(torch.where(mask, m, zero), torch.where(mask, Em, zero)))


def vespo_terms(l, old, adv, mask, p, inexact_l=False, sampler=None):
    """The reference's VESPO nodes (reference.loss.vespo, reference.surrogate.vespo_log_weight and
    vespo_phi): per row, s = a sum node over sg[clip(d_t, -c, c)] (d_t = l_t -
    l_old, E = |d|; a clamped d is the bound, E = c; its short exact terms leave no residue), log w =
    clip(s, log min_weight, max_log_weight) (a clipped s is the bound, E = |bound|), phi = the fused
    node vespo_phi (its stated rounding |phi| (1 + |k z| + |lam + k z| + |lam + k z - lam w| + 2 |lam w|
    + |k|), z = log w, and the slope phi (k - lam w) carrying E(log w)), (k, lam) by the sign of A
    (A >= 0: the positive pair), lam at least lambda_min; then at every token CISPO's nodes
    m = -sg[phi] A (E = |m| + |A| (phi + E(phi))), x = l m (E = |x| + |l| E(m), dx/dl = m).
    ``inexact_l``: l is an inner node of a composite (check_head_loss.py), whose value has all the
    working precision's bits, so a row's sum s with an unclamped term of two or more leaves a residue.
    ``sampler``: the sampler's log-probs, folded into s (TRL): the sum node has a second term per
    token, sg[clip(x_t, log min_weight, max_log_weight)], x_t = l_old - l_sampler (E = |x|; a clipped
    x is the bound, E = |bound|)."""
    import torch

    zero = torch.zeros_like(l)
    d = torch.where(mask, l - old, zero)
    c = p["log_ratio_clamp"]
    d, Ed, unclamped = _clip_node(d, d.abs(), None if c is None else -float(c), c)
    d, Ed = torch.where(mask, d, zero), torch.where(mask, Ed, zero)
    absd = d.abs().sum(-1)
    k = mask.sum(-1)
    if inexact_l:
        k = k + ((k >= 2) & (mask & unclamped).any(-1)).long()
    s, Es = d.sum(-1), Ed.sum(-1)
    if sampler is not None:
        x = torch.where(mask, old - sampler, zero)
        x, Ex, _ = _clip_node(x, x.abs(), math.log(float(p["min_weight"])), p["max_log_weight"])
        x, Ex = torch.where(mask, x, zero), torch.where(mask, Ex, zero)
        s, Es, absd, k = s + x.sum(-1), Es + Ex.sum(-1), absd + x.abs().sum(-1), k + mask.sum(-1)
    Es = sum_depth(k) * absd + Es
    z, Ez, _ = _clip_node(s, Es, math.log(float(p["min_weight"])), p["max_log_weight"])
    pos = adv >= 0
    k = where64(pos, p["k_pos"], p["k_neg"])
    lam = torch.clamp(where64(pos, p["lambda_pos"], p["lambda_neg"]), min=float(p["lambda_min"]))
    w = torch.exp(z)
    phi = torch.exp(k * z - lam * torch.expm1(z))
    slope = phi * (k - lam * w)
    arg1 = lam + k * z
    Ephi = phi * (1 + (k * z).abs() + arg1.abs() + (arg1 - lam * w).abs() + 2 * (lam * w).abs() + k.abs()) \
        + slope.abs() * Ez
    a, phi, Ephi = (t.unsqueeze(-1).expand_as(l) for t in (adv, phi, Ephi))
    m = -phi * a
    Em = m.abs() + a.abs() * (phi + Ephi)
    x = l * m
    Ex = x.abs() + l.abs() * Em
    return (torch.where(mask, x, zero), torch.where(mask, Ex, zero),
            Factor(torch.where(mask, m, zero), torch.where(mask, Em, zero)))


def minirl_terms(l, old, sampler, adv, mask, p):
    """The reference's MiniRL nodes (reference.loss.minirl): the decoupled-PPO mask drops a token (its
    term the constant 0, no operand of the row's sum) where A > 0 and r > 1 + eps_high or A < 0 and
    r < 1 - eps_low (r = exp(l - l_old), a decision); elsewhere CISPO's x = l (-sg[w] A) with
    w = min(exp(l - l_sampler), C): l - l_sampler a node of the sampler's log-prob (l's value, a
    constant; E = |v|), exp (E = w + w |v|), a capped weight the bound C (E = C).
    Returns (x, E(x), dx/dl, inexact, which terms are nodes)."""
    import torch

    zero = torch.zeros_like(l)
    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    r = torch.exp(l - old)
    dropped = ((a > 0) & (r > 1 + float(p["eps_high"]))) | ((a < 0) & (r < 1 - float(p["eps_low"])))
    v = l - sampler
    rw = torch.exp(v)
    w, Ew, _ = _clip_node(rw, rw + rw * v.abs(), None, p["is_cap"])
    m = -w * a
    Em = m.abs() + a.abs() * (w + Ew)
    x = l * m
    Ex = x.abs() + l.abs() * Em
    node = mask & ~dropped
    return (torch.where(node, x, zero), torch.where(node, Ex, zero),
            Factor(torch.where(node, m, zero), torch.where(node, Em, zero)), node & (x != 0), node)


def sapo_terms(l, old, adv, mask, tau_pos, tau_neg, clamp, El=None):
    """The reference's SAPO nodes at every token (reference.loss.sapo): d = l - l_old (E = |d|, and
    E(l) by its edge of +1 where l is an inner node with errors ``El``; a clamped d is the bound,
    which carries |c|, with no path to l), the fused gate node
    G = 4 sigma(tau (e^d - 1)) / tau (its slope 4 sigma(x) sigma(-x) e^d and its stated dscale,
    reference.surrogate.sapo_gate), -A (E = |A|), x = G (-A): (x, E(x), the gradient pass from x)."""
    import torch

    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    d = l - old
    clamped = torch.zeros_like(mask) if clamp is None else d.abs() > float(clamp)
    if clamp is not None:
        d = torch.clamp(d, -float(clamp), float(clamp))
    tau = where64(a > 0, tau_pos, tau_neg)
    xg = tau * torch.expm1(d)
    p, q = torch.sigmoid(xg), torch.sigmoid(-xg)
    r = torch.exp(d)
    G = 4 * p / tau
    slope = 4 * p * q * r
    dscale = 4 * r * p * (1 + q * (tau * (r + (r - 1).abs()) + xg.abs() + 4))
    Ed = d.abs() if El is None else torch.where(clamped, d.abs(), d.abs() + El)
    EG = G + slope * Ed
    x = -a * G
    Ex = x.abs() + a.abs() * EG + G * a.abs()
    zero = torch.zeros_like(x)

    def backward(A_x, C_x):
        # G is a fused node that states its derivative's error (dscale)
        A_G, C_G = A_x * a.abs(), (C_x + 2 * A_x) * a.abs()      # x = G (-A): the edge -A, rho = 1 + rel(-A) = 2
        live = mask & ~clamped
        return torch.where(live, A_G * slope, zero), torch.where(live, C_G * slope + A_G * dscale, zero)

    return torch.where(mask, x, zero), torch.where(mask, Ex, zero), backward


def _clip_node(v, E, lo, hi):
    """The reference's clip node (reference._ad.clip) on values ``v`` with errors ``E``: inside the
    closed interval [lo, hi] v itself; outside, the bound, a node with no path back whose error is
    |bound|.  (value, E, inside); either bound may be None."""
    import torch

    inside = torch.ones_like(v, dtype=torch.bool)
    if lo is not None:
        inside &= v >= float(lo)
    if hi is not None:
        inside &= v <= float(hi)
    if lo is None and hi is None:
        return v, E, inside
    c = torch.clamp(v, min=None if lo is None else float(lo), max=None if hi is None else float(hi))
    return c, torch.where(inside, E, c.abs()), inside


def _em1x_rho(x, Ex, e1):
    """rho of k3's edge e^x - 1 (reference._ad._edge_error, "em1x"): the usual backward of e^x - 1 - x
    forms it as a e^x - a, from a rounded e^x of an x that errs by E(x): 1 + (2 e^x + |e^x - 1|) /
    |e^x - 1| + e^x E(x) / |e^x - 1|, 0 where e^x - 1 = 0 (no derivative to err)."""
    import torch

    em = e1.abs()
    ex = e1 + 1
    safe = torch.where(em != 0, em, torch.ones_like(em))
    return torch.where(em != 0, 1 + (2 * ex + em) / safe + ex * Ex / safe, torch.zeros_like(em))


def _k2_nodes(x, Ex):
    """k2 = x x / 2 (reference.kl.k2): the product node m = x x (two edges of |x| to x) and m / 2:
    (k2, E(k2), the pass from k2 back to x)."""
    m = x * x
    Em = m.abs() + 2 * x.abs() * Ex
    y = m / 2
    Ey = y.abs() + Em / 2

    def back(A, C):
        A_m, C_m = A / 2, (C + 2 * A) / 2                 # y = m / 2: a constant, rho = 2
        return 2 * x.abs() * A_m, 2 * x.abs() * (C_m + A_m * rel_factor(x, Ex))   # m = x x: each edge the other x

    return y, Ey, back


def _estimator_nodes(est, x, Ex):
    """kl.k1, kl.k2, kl.k3 or kl.abs of ``x`` (error Ex) as the reference's nodes: (value, E, the pass
    from the value back to x)."""
    import torch

    if est == "k1":                             # -x: an edge of -1, exact
        y = -x
        return y, y.abs() + Ex, lambda A, C: (A, C)
    if est == "k2":
        return _k2_nodes(x, Ex)
    if est == "k3":                             # expm1_minus_x: its rounding as usually written
        e1 = torch.expm1(x)
        y = e1 - x
        Ey = torch.exp(x) + e1.abs() + y.abs() + e1.abs() * Ex
        return y, Ey, lambda A, C: (A * e1.abs(), (C + A * _em1x_rho(x, Ex, e1)) * e1.abs())
    if est == "abs":                            # |x|: the edge sign(x), 0 at x = 0
        y, s = x.abs(), torch.sign(x).abs()
        Ey = y + s * Ex
        return y, Ey, lambda A, C: (A * s, (C + A * rel_factor(y, Ey)) * s)
    raise ValueError(est)


def kl_penalty_terms(l, old, ref, mask, p, El=None):
    """The reference's KL term at every token (reference.loss._kl_term with reference.kl): x = l_ref - l
    (an edge of -1 to l, E = |x|), the input clamp clip(x, kl_log_ratio_min, kl_log_ratio_max), the
    estimator ``kl_estimator`` (``_estimator_nodes``; k3_straight_through: sg[the clamped k3] +
    k2(x) - sg[k2(x)], unclamped x, value the clamped k3's, error |y| + E(k3) + 2 E(k2);
    k3_unbiased: the fused node w k3(clip(x)), w = exp(l - l_old), with the rounding of the formula
    as usually written and the derivative -w x, none where the input clamp is active and
    kl_sg_ratio_where_clamped, else w k3), then the output clamp clip(y, kl_output_min,
    kl_output_max).  Returns (y, E(y), the pass from y to l, whether y is exact at 64 bits), masked
    positions zero: y is exact where it is a clamp's bound, or k1 or abs (of x = l_ref - l, exact:
    the check's inputs are short), or k2 of an x of at most 32 significant bits (``float_bits``);
    elsewhere (an exp) only where it is 0.

    ``El``: the forward errors of l where l is an inner node of a composite (check_head_loss.py; None:
    an exact input).  Then l's error reaches x by its edge of -1 (E(x) = |x| + E(l)), and the fused
    k3_unbiased node by its one edge to l (E(l) times its slope, none where the stop-gradient makes
    it a constant); and every value but 0 and a clamp's bound is inexact (l has all the working
    precision's bits)."""
    import torch

    est = p["kl_estimator"]
    lo, hi = p["kl_log_ratio_min"], p["kl_log_ratio_max"]
    x = ref - l
    Ex = x.abs() if El is None else x.abs() + El
    xc, Exc, inside = _clip_node(x, Ex, lo, hi)
    zero = torch.zeros_like(l)
    if est == "k3_unbiased":
        d = l - old
        w = torch.exp(d)
        e1 = torch.expm1(xc)
        k = e1 - xc
        y = w * k
        Ey = y.abs() + k.abs() * w * (1 + d.abs()) + w * (torch.exp(xc) + e1.abs() + k.abs() + e1.abs() * xc.abs())
        slope = torch.where(inside, (w * x).abs(), zero if p["kl_sg_ratio_where_clamped"] else y.abs())
        if El is not None:
            Ey = Ey + slope * El
        # inside the clamp the derivative -w x errs as the closed form does (reference._ad._edge_error,
        # "k3w"): rho = 4 + |l - l_old| + E(l) (1 + 1/|x|), E(l) where x = 0
        el = zero if El is None else El
        ax = x.abs()
        rho_k3w = 4 + d.abs() + el + torch.where(ax != 0, el / torch.where(ax != 0, ax, torch.ones_like(ax)), el)

        def to_l(A, C):
            return A * slope, torch.where(inside, (C + A * rho_k3w) * slope, (C + A * rel_factor(y, Ey)) * slope)
    elif est == "k3_straight_through":
        v, Ev, _ = _estimator_nodes("k3", xc, Exc)
        v, Ev, v_kept = _clip_node(v, Ev, p["kl_output_min"], p["kl_output_max"])
        g, Eg, back_g = _k2_nodes(x, Ex)
        y, Ey = v, v.abs() + Ev + 2 * Eg

        def to_l(A, C):             # the edges of +1 (y to k2(x) - sg[k2(x)], to k2(x)) and -1 (x to l) pass (A, C) on
            return back_g(A, C)
    else:
        y, Ey, back = _estimator_nodes(est, xc, Exc)

        def to_l(A, C):             # x = l_ref - l: an edge of -1 passes (A, C) on
            A_x, C_x = back(A, C)
            return torch.where(inside, A_x, zero), torch.where(inside, C_x, zero)
    if El is not None:
        exact = y == 0
    elif est in ("k1", "abs"):
        exact = torch.ones_like(mask)
    elif est == "k2":
        exact = float_bits(xc) <= 32
    else:
        exact = y == 0
    if est != "k3_straight_through":            # its clamps act on the value only (v above)
        y, Ey, kept = _clip_node(y, Ey, p["kl_output_min"], p["kl_output_max"])
        exact = exact | ~kept
    else:
        kept, exact = torch.ones_like(mask), exact | ~v_kept

    def backward(A, C):
        A_l, C_l = to_l(A, C)
        return torch.where(mask & kept, A_l, zero), torch.where(mask & kept, C_l, zero)

    return torch.where(mask, y, zero), torch.where(mask, Ey, zero), backward, exact


def with_kl(policy, kl, mask, beta):
    """A token loss's terms with the reference's KL term inside its aggregation (kl_aggregation
    'policy'; reference.loss.compose): term = pg + kl beta (kl beta: E = |kl beta| + beta E(kl), the
    edge beta; the sum: edges of +1).  ``policy``: the policy part's (x, E(x), dx/dl or its own
    pass[, inexact]); ``kl``: ``kl_penalty_terms``.  Returns the terms' (x, E(x), their pass, inexact)."""
    import torch

    xp, Ep, dp = policy[:3]
    y, Ey, kl_back = kl[:3]
    kb = y * beta
    Ekb = kb.abs() + beta * Ey
    zero = torch.zeros_like(y)
    x = torch.where(mask, xp + kb, zero)
    Ex = torch.where(mask, x.abs() + Ep + Ekb, zero)

    def backward(A, C):
        # the term's edges of +1 pass (A, C) on to pg and to kl beta
        A_p, C_p = cotangent_to_l(dp, xp, Ep, A, C)
        A_k, C_k = kl_back(A * beta, (C + 2 * A) * beta)       # kl beta: a constant, rho = 2
        return torch.where(mask, A_p + A_k, zero), torch.where(mask, C_p + C_k, zero)

    return x, Ex, backward, mask & ((x != 0) | (kb != 0))


def is_weights(old, sampler, mask, p):
    """The IS weight w^IS of every token as the reference's nodes compute it (reference.loss._is_weights,
    reference.is_): d = l_old - l_sampler per token (E = |d|), the level's log-weight u (token: d;
    sequence: a sum node over the row, E = depth(L) sum|d| + sum|d|, its exact short terms leave no
    residue; geometric: that sum / L), clamped to [-c, c] (is_log_ratio_clamp; a clamped u is the
    bound, E = c), rho = e^u (E = rho + rho E(u)), then truncated to [is_c_min, is_c_max] (is_mode
    'truncate': a truncated weight is the bound, E = |bound|) or kept where it lies in that closed
    band and the constant 0 elsewhere ('mask'); a missing bound is open.  Returns (w, E(w), whether
    w is a node (not the constant 0), whether it is a truncation bound), float64 [B, T], masked 0.
    The weight carries no gradient (sg[w])."""
    import torch

    zero = torch.zeros_like(old)
    d = torch.where(mask, old - sampler, zero)
    if p["is_level"] == "token":
        u, Eu = d, d.abs()
    else:
        L = mask.sum(-1, keepdim=True)
        absd = d.abs().sum(-1, keepdim=True)
        u, Eu = d.sum(-1, keepdim=True), sum_depth(L) * absd + absd
        if p["is_level"] == "geometric":
            Ld = torch.clamp(L, min=1).double()
            u = u / Ld
            Eu = u.abs() + Eu / Ld
        u, Eu = u.expand_as(old), Eu.expand_as(old)
    c = p["is_log_ratio_clamp"]
    u, Eu, _ = _clip_node(u, Eu, None if c is None else -float(c), c)
    rho = torch.exp(u)
    Erho = rho + rho * Eu
    lo, hi = p["is_c_min"], p["is_c_max"]
    w, Ew, inside = _clip_node(rho, Erho, lo, hi)
    if p["is_mode"] == "truncate":
        node, bound = mask.clone(), mask & ~inside
    else:
        node, bound = mask & inside, torch.zeros_like(mask)
        w = rho
    return torch.where(node, w, zero), torch.where(node, Ew, zero), node, bound


def weighted_terms(policy, weights, keep, mask):
    """The policy terms with the recipe's factor (reference.loss.compose): the constant 0 where OPSM
    or the entropy mask drops the token (``keep`` false) or a masking IS weight is 0 (not an operand
    of the row's sum; its token stays in the denominators); elsewhere the term p itself without an
    IS weight, or the product node p w with one (``is_weights``: E = |p w| + w E(p) + |p| E(w), the
    edge w to p, none to l through w).  ``policy``: (x, E(x), dx/dl or its own pass[, inexact]).
    Returns (x, E(x), the pass, inexact, which terms are nodes)."""
    import torch

    x, Ex, dp = policy[:3]
    inexact = policy[3] if len(policy) > 3 else x != 0
    node = mask & keep & (policy[4] if len(policy) > 4 else True)      # a policy term that is the constant 0 stays so
    if weights is None:
        xw, Exw, w, bound = x, Ex, None, torch.zeros_like(mask)
    else:
        w, Ew, w_node, bound = weights
        node = node & w_node
        w = torch.where(node, w, torch.zeros_like(w))
        xw = x * w
        Exw = xw.abs() + w * Ex + x.abs() * Ew
    zero = torch.zeros_like(x)

    def backward(A, C):
        # a term that is the constant 0 passes nothing on; a sequence loss's pass (GSPO's) still
        # reaches such a token through its row's other terms
        if w is None:
            A_p, C_p = torch.where(node, A, zero), torch.where(node, C, zero)
        else:
            A_p, C_p = A * w, (C + A * rel_factor(w, Ew)) * w        # x w: the edge w, rho = 1 + rel(w)
        return cotangent_to_l(dp, x, Ex, A_p, C_p)

    if w is not None:           # a product with an IS weight is inexact unless the weight is a bound
        inexact = inexact | (~bound & (xw != 0))
    inexact = node & inexact
    return torch.where(node, xw, zero), torch.where(node, Exw, zero), backward, inexact, node


def opsm_keep(l, sampler, adv, mask, p):
    """M^opsm of every token (reference.loss._opsm_keep, reference.mask.opsm_*): row i is dropped iff
    its advantage is negative and kappa_i = mean_t (l_sampler - l) > opsm_delta; the advantage is
    the sequence's (a per-token one averaged over the row), or with opsm_advantage_gate 'token' each
    token's own.  A bool [B, T] (true where masked too)."""
    import torch

    L = torch.clamp(mask.sum(-1, keepdim=True), min=1).double()
    kappa = torch.where(mask, sampler - l, torch.zeros_like(l)).sum(-1, keepdim=True) / L
    if adv.dim() == 1:
        a_seq = a_tok = adv.unsqueeze(-1)
    else:
        a_seq, a_tok = torch.where(mask, adv, torch.zeros_like(adv)).sum(-1, keepdim=True) / L, adv
    a = a_tok if p["opsm_advantage_gate"] == "token" else a_seq
    return (~((a < 0) & (kappa > float(p["opsm_delta"])))).expand_as(mask)


def entropy_keep(entropy, mask, rho):
    """M^ent of every token (reference.loss._entropy_keep): entropy >= q, q the linear-interpolation
    quantile at 1 - rho of the batch's unmasked entropies (reference.mask.linear_quantile, its
    position h = (1 - rho)(n - 1) taken as the nearest integer within 2^-44 (n - 1)); nothing is kept
    of an empty batch."""
    import torch

    values = torch.sort(entropy[mask]).values
    n = values.numel()
    if n == 0:
        return torch.zeros_like(mask)
    h = (1 - float(rho)) * (n - 1)
    if abs(h - round(h)) <= 2.0 ** -44 * max(n - 1, 1):
        h = float(round(h))
    j = int(math.floor(h))
    q = values[j] if h == j else values[j] + (h - j) * (values[j + 1] - values[j])
    return entropy >= q


def gspo_terms(l, old, adv, mask, eps_low, eps_high, log_ratio_max=None, El=None, clamp=None):
    """The reference's GSPO nodes of each sequence (reference.loss._gspo_seq), its
    loss x_i repeated at each unmasked token: (x [rows, T], E(x), the gradient pass from the term
    nodes, whether each term is inexact).

    The nodes: mu = mean_log_ratio (one node: rounding (depth(L) sum|d| + sum|d|)/L + |mu|,
    derivative 1/L to each l_t, so where l is an inner node with errors ``El`` E(mu) also has
    sum_t E(l_t) / L); with the per-token clamp c (``clamp``, reference.ratio.clamped_mean_log_ratio)
    instead d_t = l_t - l_old (E = |d|, and E(l) by its edge of +1), clip(d_t, -c, c) (a clamped d the
    bound, E = |c|, no path to l), a sum node over the row (its L terms, one more where its exact value
    has more than 64 bits: ``exact_row_sums``, or l inexact) and its division by L (an edge of 1/L):
    the same E(mu) but for that residue; then its cap clip(mu, None, log_ratio_max) (a capped mean is
    the bound: E = |bound|, no path to l), s = exp(mu), -A (a node of the input A: E = |A|), p1 = s (-A),
    clip(s, lo, hi) (s itself inside; else the bound, which carries |bound|), p2 = clip(s) (-A),
    x = max(p1, p2): a tie inside the clip range (half the cotangent to each), p1 where the
    unclipped branch is the larger, p2 (no path to l) where the clipped one is."""
    import torch

    L = mask.sum(-1)
    Ld = torch.clamp(L, min=1).double()
    a = adv
    zero = torch.zeros_like(l)
    d = torch.where(mask, l - old, zero)
    Ed = d.abs() if El is None else d.abs() + torch.where(mask, El, zero)
    k, live = L, mask
    if clamp is not None:
        c = float(clamp)
        raw = d
        d, Ed, inside = _clip_node(d, Ed, -c, c)
        live = mask & inside
        d, Ed = torch.where(mask, d, zero), torch.where(mask, Ed, zero)
        signed = torch.where(mask & ~inside, torch.sign(raw), zero).long()
        if El is None:
            residue = exact_row_sums(raw, live, signed, torch.full_like(Ld, c)) > 64
        else:           # l has all the working precision's bits
            residue = live.any(-1)
        k = L + ((L >= 2) & residue).long()
    absd = d.abs().sum(-1)
    mu = d.sum(-1) / Ld
    Emu = (sum_depth(k) * absd + Ed.sum(-1)) / Ld + mu.abs()
    mu, Emu, uncapped = _clip_node(mu, Emu, None, log_ratio_max)
    sv = torch.exp(mu)
    Es = sv + sv * Emu
    lo, hi = 1 - float(eps_low), 1 + float(eps_high)
    p1 = -a * sv
    Ep1 = p1.abs() + a.abs() * Es + sv * a.abs()
    inside = (sv >= lo) & (sv <= hi)
    b = torch.clamp(sv, lo, hi)
    p2 = -a * b
    Ep2 = torch.where(inside, Ep1, p2.abs() + 2 * a.abs() * b)
    tie = inside | (p1 == p2)
    first = ~tie & (p1 > p2)
    x = torch.where(first | tie, p1, p2)
    Ex = torch.where(tie, x.abs() + (Ep1 + Ep2) / 2, torch.where(first, Ep1, Ep2))

    def backward(A_tok, C_tok):
        # the row's sum reaches x by its L tokens' edges of +1
        A_x, C_x = torch.where(mask, A_tok, 0.0).sum(-1), torch.where(mask, C_tok, 0.0).sum(-1)
        # tie: half to p1 and to p2, each then -A to s (p2 too where it is s (-A), inside)
        A_p = torch.where(tie, A_x / 2, A_x)
        C_p = torch.where(tie, C_x / 2, C_x)                  # the tie's edges of 1/2 are exact
        paths = torch.where(tie & inside, 2.0, torch.where(tie | first, 1.0, 0.0))
        A_s = paths * A_p * a.abs()
        C_s = paths * (C_p + 2 * A_p) * a.abs()                # s (-A): the edge -A, rho = 2
        A_mu, C_mu = A_s * sv, (C_s + A_s * rel_factor(sv, Es)) * sv
        A_mu, C_mu = torch.where(uncapped, A_mu, 0.0), torch.where(uncapped, C_mu, 0.0)
        A_l, C_l = (A_mu / Ld).unsqueeze(-1), ((C_mu + 2 * A_mu) / Ld).unsqueeze(-1)     # the edges 1/L, rho = 2
        return torch.where(live, A_l, zero), torch.where(live, C_l, zero)

    xt = torch.where(mask, x.unsqueeze(-1).expand_as(l), zero)
    Ext = torch.where(mask, Ex.unsqueeze(-1).expand_as(l), zero)
    # x is inexact (all the working precision's bits) where it comes from exp; where the clipped branch
    # wins it is -A times the bound, exact, and so is the row's sum L x, which then leaves a residue
    # in the reference's sum node only if it has more than 64 significant bits (rounding.phantom)
    clipped = ~tie & ~first & (a != 0)
    inexact = (x != 0) & ~clipped
    for i in torch.nonzero(clipped & (L > 0)).flatten().tolist():
        bound = 1 - Fraction(float(eps_low)) if float(sv[i]) < lo else 1 + Fraction(float(eps_high))
        inexact[i] = significant_bits(int(L[i]), float(a[i]), bound) > 64
    return xt, Ext, backward, mask & inexact.unsqueeze(-1)


def gmpo_terms(l, old, adv, mask, eps_low, eps_high):
    """The reference's GMPO nodes of each sequence (reference.loss.gmpo, surrogate.gmpo_clipped_log_ratio),
    its loss x_i repeated at each unmasked token: (x [rows, T], E(x), the gradient pass from the term
    nodes, whether each term is inexact).

    Per token, d = l - l_old (E = |d|) and its sign-aware clip z: inside [-eps_low, eps_high] the
    tie min(d, d) (or max) of torch.minimum, a node of value d with two edges of 1/2 to d (E = 2|d|);
    outside, d itself where it is the smaller (A > 0, below) or the larger (A <= 0, above), else the
    bound (E = |bound|, no path to l).  Then S = a sum node over the row's z (a residue counted where
    its exact value has more than 64 bits, decided exactly: ``exact_row_sums``), q = S / L,
    e = exp(q), x = e (-A) (-A: E = |A|)."""
    import torch

    zero = torch.zeros_like(l)
    a = adv.unsqueeze(-1).expand_as(l)
    d = torch.where(mask, l - old, zero)
    lo, hi = -float(eps_low), float(eps_high)
    inside = (d >= lo) & (d <= hi)
    live = inside | torch.where(a > 0, d < lo, d > hi)
    bound = torch.where(a > 0, torch.full_like(d, hi), torch.full_like(d, lo))     # float64, as the parameters are
    z = torch.where(live, d, bound)
    Ez = torch.where(inside, 2 * d.abs(), z.abs())
    z, Ez = torch.where(mask, z, zero), torch.where(mask, Ez, zero)
    L = mask.sum(-1)
    Ld = torch.clamp(L, min=1).double()
    S = z.sum(-1)
    residue = exact_row_sums(d, mask & live, mask & ~live, bound[:, :1].squeeze(-1)) > 64
    ES = sum_rounding(L + ((L >= 2) & residue).long(), z.abs().sum(-1)) + Ez.sum(-1)
    q = S / Ld
    Eq = q.abs() + ES / Ld
    e = torch.exp(q)
    Ee = e + e * Eq
    x = -adv * e
    Ex = x.abs() + adv.abs() * Ee + e * adv.abs()

    def backward(A_tok, C_tok):
        # the row's sum reaches x by its L tokens' edges of +1
        A_x, C_x = torch.where(mask, A_tok, 0.0).sum(-1), torch.where(mask, C_tok, 0.0).sum(-1)
        A_e, C_e = A_x * adv.abs(), (C_x + 2 * A_x) * adv.abs()          # e (-A): the edge -A, rho = 2
        A_q, C_q = A_e * e, (C_e + A_e * rel_factor(e, Ee)) * e
        A_S, C_S = A_q / Ld, (C_q + 2 * A_q) / Ld                        # S / L: rho = 2
        A_S, C_S = A_S.unsqueeze(-1), C_S.unsqueeze(-1)
        C_d = C_S                                               # the tie's edges of 1/2 are exact
        return torch.where(mask & live, A_S, zero), torch.where(mask & live, C_d, zero)

    xt = torch.where(mask, x.unsqueeze(-1).expand_as(l), zero)
    Ext = torch.where(mask, Ex.unsqueeze(-1).expand_as(l), zero)
    # x is inexact where it comes from exp of q != 0; at q = 0 it is -A, and the row's sum L x is
    # exact unless it has more than 64 significant bits
    inexact = (x != 0) & (q != 0)
    for i in torch.nonzero((q == 0) & (x != 0) & (L > 0)).flatten().tolist():
        inexact[i] = significant_bits(int(L[i]), float(adv[i])) > 64
    return xt, Ext, backward, mask & inexact.unsqueeze(-1)
