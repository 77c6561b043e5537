"""The rounding terms of the oracle's scale pass (spec/tolerance.md, reference ``_ad._rounding``):
sums' depths, relative-error factors, exact row sums, significant bits."""

from __future__ import annotations

from fractions import Fraction

from typing import NamedTuple


# ------------------------------------------------------------------------------------------------
# The oracle's scales: the reference's running error bound as tensor operations
# ------------------------------------------------------------------------------------------------
def sum_rounding(k, abs_sum):
    """max(1, ceil(log2 k)) * sum |terms| (reference _ad._rounding for a "sum" node of k terms)."""
    return sum_depth(k) * abs_sum


def rel_factor(value, err):
    """1 + E/|v| (1 + E where v = 0), the relative-error factor of the scale pass."""
    import torch

    a = value.abs()
    return 1 + torch.where(a != 0, err / torch.where(a != 0, a, torch.ones_like(a)), err)


def cotangent_to_l(dx, x, Ex, A, C):
    """The cotangent (A_l, C_l) that terms ``x`` (errors ``Ex``) with cotangent (A, C) pass on to l: by
    their own pass where ``dx`` is one (it returns that pair), else along the one edge dx/dl of each
    term node (A |dx|, (C + A rel(x)) |dx|).  S(grad l) = A_l + C_l; A_l alone (the sum over paths of
    |local derivatives|) is what a composite carries on below l (check_head_loss.py)."""
    if callable(dx):
        return dx(A, C)
    if isinstance(dx, Factor):  # x = l m: the edge m, which errs as m does (reference._ad._edge_error)
        m = dx.value.abs()
        return A * m, (C + A * rel_factor(dx.value, dx.error)) * m
    return A * dx.abs(), (C + A * rel_factor(x, Ex)) * dx.abs()


class Factor(NamedTuple):
    """The derivative dx/dl of a product node x = l m: the other factor m (``value``) and its forward
    error E(m) (``error``); the edge carries rho = 1 + E(m)/|m|, not x's relative error."""
    value: object
    error: object

    def abs(self):
        return self.value.abs()


def where64(cond, yes, no):
    """The float64 ``yes`` where ``cond`` holds, else ``no`` (parameters as binary64: torch.where of two
    Python numbers would round them to float32, the default dtype)."""
    import torch

    def f64(v):
        return torch.tensor(float(v), dtype=torch.float64, device=cond.device)

    return torch.where(cond, f64(yes), f64(no))


def float_bits(x):
    """The significant bits of each float64 in ``x`` (0 for 0): 53 less the trailing zeros of its
    53-bit significand."""
    import torch

    m, _ = torch.frexp(x.abs())
    sig = (m * 2.0 ** 53).long()
    low = sig & -sig                                  # its lowest set bit, a power of two
    return torch.where(sig != 0, 53 - torch.log2(low.double()).long(), torch.zeros_like(sig))


def exact_row_sums(d, live, bounded, bound):
    """The significant bits of each row's exact sum of d over ``live`` plus ``bound`` (a float64 per row)
    times the count of ``bounded`` tokens (a bool mask, or +-1 per token for bounds of either sign):
    the live d, multiples of 2^-40 below 2^22 (the check's inputs: differences of bfloat16-exact
    log-probs), summed exactly as integers; any other row exactly by fractions."""
    import torch

    scaled = torch.where(live, d, torch.zeros_like(d)) * 2.0 ** 40
    fits = (scaled == torch.round(scaled)).all(-1) & (scaled.abs() < 2.0 ** 62 / max(d.shape[-1], 1)).all(-1)
    ints = torch.round(scaled).long().sum(-1)
    counts = bounded.sum(-1)
    bits = torch.zeros(d.shape[0], dtype=torch.long, device=d.device)
    for i in range(d.shape[0]):
        if bool(fits[i]):
            total = Fraction(int(ints[i]), 2 ** 40)
        else:
            total = sum((Fraction(float(v)) for v in d[i][live[i]].tolist()), Fraction(0))
        total += int(counts[i]) * Fraction(float(bound[i]))
        bits[i] = significant_bits(total)
    return bits


def significant_bits(*factors) -> int:
    """The significant bits of the exact product of ``factors`` (ints, floats, dyadic Fractions)."""
    odd = 1
    for f in factors:
        n = abs(Fraction(f).numerator)
        odd *= n >> ((n & -n).bit_length() - 1) if n else 0
    return odd.bit_length()


def sum_depth(k):
    """max(1, ceil(log2 k)): the depth of a pairwise sum of k terms (reference _ad._rounding)."""
    import torch

    return torch.clamp(torch.ceil(torch.log2(torch.clamp(k.double(), min=1.0))), min=1.0)


def phantom(k, inexact):
    """1 where the reference counts one more term in a "sum" node of k >= 2 terms.  It infers the
    node's constant as value - fsum(terms) with fsum at the scale pass's 64 bits (reference
    ``_ad._rounding`` under ``mp.workprec(64)``), so a sum whose value has more than 64 significant
    bits leaves a residue, counted as a term.  ``inexact``: whether a term's value is inexact (it
    came from exp: all the working precision's bits), which makes the sum's value so.

    Where every term is exact, the oracle counts a residue for a term that is a product with a
    clip bound (``x != 0``: PPO's clipped branch, CISPO's truncated weight), none for the inputs
    themselves (an aggregator's values) and for a KL term aggregated separately whose value is
    exact (``kl_penalty_terms``: k1, abs, a short k2, a clamp's bound); a GSPO row's terms, one value
    repeated, are decided exactly (``gspo_terms``).  It differs from the reference only for a sum of k = 2^j terms,
    all exact, whose value has at most 64 bits (products: a short row whose every token is
    clipped; the check's rows have hundreds of tokens and a third unclipped), where the depth of
    that node's rounding is one more than the reference's (S larger); or more than 64 bits
    (inputs, or exact KL terms, of widely spread exponents), where it is one less."""
    return ((k >= 2) & inexact).long()
